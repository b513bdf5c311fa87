/*
 * resp_gate.h — a bound on what a Redis server's replies can make the
 * daemon do, checked before hiredis sees a byte.
 *
 * hiredis 0.14's reader trusts the server: `*2147483647` makes it allocate
 * and loop for minutes, `$99999999999` makes it buffer without end, and a
 * reply nobody asked for fails an assertion in its async layer.  The
 * remote tier reads its connections itself and passes each chunk through a
 * gate first: a small RESP2 scanner that follows the replies' structure
 * across chunks (never copying them) and counts the top-level replies that
 * complete.  A reply over the gate's bounds, or one that is not RESP2, is
 * refused before it is fed; the caller compares the count with the
 * answers it owes.
 *
 * Pure: no I/O, no allocation.
 */
#ifndef KVS_DAEMON_RESP_GATE_H
#define KVS_DAEMON_RESP_GATE_H

#include <stddef.h>
#include <stdint.h>

#define RESP_GATE_DEPTH 7           /* nested arrays (hiredis's own limit) */
#define RESP_GATE_LINE (64u << 10)  /* a status or error line, a header */
#define RESP_GATE_ELEMS (1u << 18)  /* elements of one reply, every level */
#define RESP_GATE_ARRAY_BYTES (4u << 20) /* bytes of one array reply */

typedef struct resp_gate {
  uint64_t max_bulk;   /* the longest bulk string taken */
  /* where the scan stands */
  uint8_t state;       /* RG_* (resp_gate.c) */
  uint8_t type;        /* the line's type byte */
  uint8_t cr;          /* the line's last byte was '\r' */
  uint8_t depth;       /* arrays open */
  uint64_t num;        /* the header's number so far (19 digits at most) */
  uint32_t digits, line_len;
  int neg;
  uint64_t bulk_left;  /* payload bytes (and its CRLF) still to come */
  uint64_t left[RESP_GATE_DEPTH]; /* elements still to come, per array */
  uint32_t elems;      /* elements of the reply so far */
  uint64_t reply_bytes;
  uint64_t replies;    /* top-level replies completed (the caller resets) */
  const char *why;     /* why the stream was refused; NULL while good */
} resp_gate;

/* A gate taking bulk strings up to max_bulk bytes. */
void resp_gate_init(resp_gate *g, uint64_t max_bulk);
/* Scans the next n bytes of the stream: 0, with g->replies counting the
 * replies they complete; -1 when they break a bound or RESP2 (g->why
 * says which; the gate stays refused). */
int resp_gate_scan(resp_gate *g, const void *p, size_t n);
/* Is the gate between replies (nothing of one begun)? */
int resp_gate_idle(const resp_gate *g);

#endif
