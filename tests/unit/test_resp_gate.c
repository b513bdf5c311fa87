/*
 * test_resp_gate — daemon/tiers/resp_gate.c against the replies a
 * generator wrote (it knows where each ends): fed whole or cut anywhere
 * into random chunks, the gate counts exactly the replies wholly fed and
 * refuses none; a stream cut short counts the replies before the cut.
 * Then what a hostile server sends (the cases): each refused at its
 * header, before its payload, with the reason.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/tiers/resp_gate.h"

#define MAX_BULK 5000
#define CAP (1u << 20)

static uint64_t rng = 88172645463325252ull;
static uint32_t below(uint32_t n) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)(rng % n);
}

/* One reply at out (depth: arrays open around it); returns its length. */
static size_t gen(char *out, int depth) {
  size_t n = 0;

  switch (below(depth < 3 ? 7 : 6)) {
  case 0:
    return (size_t)sprintf(out, "+OK\r\n");
  case 1:
    return (size_t)sprintf(out, "-ERR wrong number %u\r\n", below(1000));
  case 2:
    return (size_t)sprintf(out, ":%s%u\r\n", below(2) ? "-" : "",
                           below(1u << 31));
  case 3:
    return (size_t)sprintf(out, "$-1\r\n");
  case 4:
  case 5: {
    uint32_t len = below(4) ? below(64) : below(MAX_BULK + 1);

    n = (size_t)sprintf(out, "$%u\r\n", len);
    for (uint32_t i = 0; i < len; i++) /* CR and LF among the bytes */
      out[n++] = below(4) ? (char)below(256) : "\r\n$*"[below(4)];
    out[n++] = '\r';
    out[n++] = '\n';
    return n;
  }
  default: {
    uint32_t k = below(6);

    if (below(8) == 0)
      return (size_t)sprintf(out, "*-1\r\n");
    n = (size_t)sprintf(out, "*%u\r\n", k);
    for (uint32_t i = 0; i < k; i++)
      n += gen(out + n, depth + 1);
    return n;
  }
  }
}

/* Feeds buf[0..len) in random chunks; the replies counted. */
static uint64_t feed(const char *buf, size_t len, int *refused) {
  resp_gate g;
  size_t at = 0;

  resp_gate_init(&g, MAX_BULK);
  *refused = 0;
  while (at < len) {
    size_t c = below(3) == 0 ? 1 + below(4) : 1 + below(3000);

    if (c > len - at)
      c = len - at;
    if (resp_gate_scan(&g, buf + at, c) < 0) {
      *refused = 1;
      print_message("refused: %s\n", g.why);
      return g.replies;
    }
    at += c;
  }
  return g.replies;
}

static void test_generated_streams(void **state) {
  char *buf = malloc(CAP);
  size_t *ends = malloc(sizeof(size_t) * 4096);

  (void)state;
  for (int round = 0; round < 300; round++) {
    size_t len = 0, nrep = 0;
    int refused;

    while (nrep < 4096 && len < CAP - 200000) {
      len += gen(buf + len, 0);
      ends[nrep++] = len;
      if (below(64) == 0)
        break;
    }
    assert_int_equal(feed(buf, len, &refused), nrep);
    assert_false(refused);
    /* cut anywhere: the replies wholly before the cut */
    for (int k = 0; k < 8; k++) {
      size_t cut = below((uint32_t)len + 1), whole = 0;

      while (whole < nrep && ends[whole] <= cut)
        whole++;
      assert_int_equal(feed(buf, cut, &refused), whole);
      assert_false(refused);
    }
  }
  free(ends);
  free(buf);
}

/* text is refused (why mentions needle) after counting `before` replies. */
static void refused(const char *text, size_t len, uint64_t before,
                    const char *needle) {
  resp_gate g;

  resp_gate_init(&g, MAX_BULK);
  assert_int_equal(resp_gate_scan(&g, text, len), -1);
  assert_int_equal(g.replies, before);
  assert_non_null(g.why);
  if (!strstr(g.why, needle))
    fail_msg("'%.*s': '%s' does not say '%s'", (int)(len < 40 ? len : 40),
             text, g.why, needle);
  /* and it stays refused */
  assert_int_equal(resp_gate_scan(&g, "+OK\r\n", 5), -1);
}

static void test_hostile(void **state) {
  static const char big[] = "*2147483647\r\n";
  char deep[64] = "";

  (void)state;
  refused(big, sizeof(big) - 1, 0, "too many elements");
  refused("$-1\r\n*262145\r\n", 14, 1, "too many elements");
  refused("$1500000000\r\n", 13, 0, "longer than any value");
  refused("$99999999999\r\n", 14, 0, "longer than any value");
  refused("$5001\r\n", 7, 0, "longer than any value");
  refused("$99999999999999999999999\r\n", 26, 0, "malformed number");
  refused("$-2\r\n", 5, 0, "malformed number");
  refused("*-5\r\n", 5, 0, "malformed number");
  refused("$\r\n", 3, 0, "malformed number");
  refused("$12a\r\n", 6, 0, "malformed number");
  refused(":1\r\n>3\r\n", 8, 1, "not RESP2");
  refused("HTTP/1.1 400\r\n", 14, 0, "not RESP2");
  refused("+OK\n", 4, 0, "without its CR");
  refused("+OK\rX", 5, 0, "stray CR");
  refused("$3\r\nabcde", 9, 0, "without its CRLF");
  for (int i = 0; i < 8; i++)
    strcat(deep, "*1\r\n");
  refused(deep, strlen(deep), 0, "nested too deep");
  {
    /* a status line of 64 KiB and one more byte */
    size_t n = RESP_GATE_LINE + 8;
    char *line = malloc(n);

    line[0] = '+';
    memset(line + 1, 'a', n - 1);
    refused(line, n, 0, "line too long");
    free(line);
  }
  {
    /* an array of bulks over 4 MiB in all */
    resp_gate g;
    char hdr[32];
    int rc = 0;

    resp_gate_init(&g, 1u << 20);
    rc = resp_gate_scan(&g, "*100\r\n", 6);
    for (int i = 0; i < 100 && rc == 0; i++) {
      static char val[(1u << 20) + 2];
      int hl = sprintf(hdr, "$%u\r\n", 1u << 20);

      val[sizeof(val) - 2] = '\r';
      val[sizeof(val) - 1] = '\n';
      rc = resp_gate_scan(&g, hdr, (size_t)hl);
      if (rc == 0)
        rc = resp_gate_scan(&g, val, sizeof(val));
    }
    assert_int_equal(rc, -1);
    assert_non_null(strstr(g.why, "over 4 MiB"));
  }
  {
    /* the largest array taken, and a nil: two replies, idle after */
    resp_gate g;
    char hdr[32];

    resp_gate_init(&g, 0);
    sprintf(hdr, "*%u\r\n", RESP_GATE_ELEMS);
    assert_int_equal(resp_gate_scan(&g, hdr, strlen(hdr)), 0);
    assert_false(resp_gate_idle(&g));
    for (uint32_t i = 0; i < RESP_GATE_ELEMS; i++)
      assert_int_equal(resp_gate_scan(&g, ":7\r\n", 4), 0);
    assert_int_equal(resp_gate_scan(&g, "$-1\r\n$0\r\n\r\n", 11), 0);
    assert_int_equal(g.replies, 3);
    assert_true(resp_gate_idle(&g));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_generated_streams),
      cmocka_unit_test(test_hostile),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
