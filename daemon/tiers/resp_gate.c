/*
 * resp_gate.c — RESP2's structure followed byte by byte (resp_gate.h).
 *
 * A reply is a line "<type><text>\r\n": '+' status, '-' error, ':'
 * integer, '$' bulk (a length, then that many bytes and "\r\n"; -1: nil),
 * '*' array (a count, then that many replies; -1: nil).
 */
#include "daemon/tiers/resp_gate.h"

#include <string.h>

enum { RG_TYPE = 0, RG_LINE, RG_BULK, RG_BAD };

void resp_gate_init(resp_gate *g, uint64_t max_bulk) {
  memset(g, 0, sizeof(*g));
  g->max_bulk = max_bulk;
}

int resp_gate_idle(const resp_gate *g) {
  return g->state == RG_TYPE && g->depth == 0;
}

static int refuse(resp_gate *g, const char *why) {
  g->state = RG_BAD;
  g->why = why;
  return -1;
}

/* A value (a line, or a bulk's end) is complete: closes every array it
 * completes, and the reply when none is left open. */
static void value_done(resp_gate *g) {
  while (g->depth > 0 && --g->left[g->depth - 1] == 0)
    g->depth--;
  if (g->depth == 0) {
    g->replies++;
    g->elems = 0;
    g->reply_bytes = 0;
  }
}

/* The header line of g->type ended with number g->num. */
static int header_done(resp_gate *g) {
  if (g->type == '+' || g->type == '-') {
    value_done(g);
    return 0;
  }
  if (g->digits == 0 || (g->neg && g->num != 1 && g->type != ':'))
    return refuse(g, "a reply with a malformed number");
  if (g->type == ':') {
    value_done(g);
    return 0;
  }
  if (g->neg) { /* -1: a nil bulk or array */
    value_done(g);
    return 0;
  }
  if (g->type == '$') {
    if ((uint64_t)g->num > g->max_bulk)
      return refuse(g, "a bulk reply longer than any value");
    g->bulk_left = (uint64_t)g->num + 2;
    g->state = RG_BULK;
    return 0;
  }
  /* '*' */
  if ((uint64_t)g->num > RESP_GATE_ELEMS - g->elems)
    return refuse(g, "an array reply with too many elements");
  if (g->num == 0) {
    value_done(g);
    return 0;
  }
  if (g->depth == RESP_GATE_DEPTH)
    return refuse(g, "array replies nested too deep");
  g->elems += (uint32_t)g->num;
  g->left[g->depth++] = (uint64_t)g->num;
  return 0;
}

int resp_gate_scan(resp_gate *g, const void *buf, size_t n) {
  const uint8_t *p = buf, *end = p + n;

  if (g->state == RG_BAD)
    return -1;
  while (p < end) {
    switch (g->state) {
    case RG_TYPE:
      g->type = *p++;
      if (!memchr("+-:$*", g->type, 5))
        return refuse(g, "a reply that is not RESP2");
      g->state = RG_LINE;
      g->num = 0;
      g->digits = g->line_len = 0;
      g->neg = g->cr = 0;
      g->reply_bytes++;
      break;
    case RG_LINE: {
      uint8_t c = *p++;

      g->reply_bytes++;
      if (++g->line_len > RESP_GATE_LINE)
        return refuse(g, "a reply line too long");
      if (g->cr) {
        if (c != '\n')
          return refuse(g, "a reply line with a stray CR");
        g->state = RG_TYPE;
        if (header_done(g) < 0)
          return -1;
        break;
      }
      if (c == '\r') {
        g->cr = 1;
        break;
      }
      if (c == '\n')
        return refuse(g, "a reply line without its CR");
      if (g->type == '+' || g->type == '-')
        break;
      if (c == '-' && g->line_len == 1) {
        g->neg = 1;
        break;
      }
      if (c < '0' || c > '9' || g->digits == 19)
        return refuse(g, "a reply with a malformed number");
      g->num = g->num * 10 + (c - '0');
      g->digits++;
      break;
    }
    case RG_BULK:
      if (g->bulk_left > 2) { /* the payload: skipped, never looked at */
        uint64_t body = g->bulk_left - 2;
        size_t take = (uint64_t)(end - p) < body ? (size_t)(end - p)
                                                 : (size_t)body;

        p += take;
        g->bulk_left -= take;
        g->reply_bytes += take;
        break;
      }
      g->reply_bytes++;
      if (*p++ != (g->bulk_left == 2 ? '\r' : '\n'))
        return refuse(g, "a bulk reply without its CRLF");
      if (--g->bulk_left == 0) {
        g->state = RG_TYPE;
        value_done(g);
      }
      break;
    default:
      return -1;
    }
    if (g->depth > 0 && g->reply_bytes > RESP_GATE_ARRAY_BYTES)
      return refuse(g, "an array reply over 4 MiB");
  }
  return 0;
}
