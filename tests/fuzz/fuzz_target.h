/* fuzz_target.h — the in-process fuzz target (fuzz_dispatch.c). */
#ifndef KVS_FUZZ_TARGET_H
#define KVS_FUZZ_TARGET_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Counts of what the inputs so far reached. */
void fuzz_dispatch_report(FILE *out);

#endif
