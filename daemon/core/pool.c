/*
 * pool.c — block take/put live in core.c; the free-queue primitives are
 * inline in core_int.h.  This file only checks the block record's size, which
 * the memory estimate in docs/core.md relies on.
 */
#include "core_int.h"

_Static_assert(sizeof(blk) == 16, "hot block record is 16 bytes");
