/*
 * test_abi_stats — kvs_stats_get's three symbol versions against a real
 * daemon: a program built against libkvshare 0.1 or 0.2 (its smaller
 * kvs_stats) gets the fields its struct had and nothing written past them
 * (a canary right after the old struct's end must survive); one built with
 * this header (KVSHARE_0.5) gets queued_bytes and indexed_blocks too, and
 * indexed_blocks counts the blocks a commit sealed.  The tenant calls are
 * in KVSHARE_0.8 (bound here by version, so the link fails if they are
 * not), and without tenants kvs_tenant is "" and kvs_tenant_stats_get
 * finds no line (nothing written into the caller's array).
 */
#include <stddef.h>
#include <string.h>

#include "tests/integration/itest.h"

int kvs_stats_get_v01(kvs_client *c, int check, kvs_stats *st);
int kvs_stats_get_v02(kvs_client *c, int check, kvs_stats *st);
__asm__(".symver kvs_stats_get_v01, kvs_stats_get@KVSHARE_0.1");
__asm__(".symver kvs_stats_get_v02, kvs_stats_get@KVSHARE_0.2");
const char *kvs_tenant_v08(const kvs_client *c);
int kvs_tenant_stats_get_v08(kvs_client *c, kvs_tenant_stats *out,
                             uint32_t max, uint32_t *n);
__asm__(".symver kvs_tenant_v08, kvs_tenant@KVSHARE_0.8");
__asm__(".symver kvs_tenant_stats_get_v08, kvs_tenant_stats_get@KVSHARE_0.8");

static itest_daemon d;

/* The old call writes at most `end` bytes into a buffer of canaries. */
static void check_old(kvs_client *c,
                      int (*get)(kvs_client *, int, kvs_stats *), size_t end,
                      const kvs_stats *now) {
  union {
    kvs_stats st;
    unsigned char b[sizeof(kvs_stats) + 64];
  } u;

  memset(&u, 0xa5, sizeof(u));
  CHECK_OK(c, get(c, 0, &u.st));
  for (size_t i = end; i < sizeof(u); i++)
    CHECK(u.b[i] == 0xa5);
  CHECK(u.st.num_blocks == now->num_blocks);
  CHECK(u.st.cached_blocks == now->cached_blocks);
  CHECK(u.st.sealed_blocks == now->sealed_blocks);
}

/* A daemon without tenants: no tenant, no line. */
static void check_no_tenants(kvs_client *c) {
  kvs_tenant_stats ts[2];
  uint32_t n = 7;

  CHECK(kvs_tenant(c) != NULL && strcmp(kvs_tenant(c), "") == 0);
  CHECK(kvs_tenant_v08(c) == kvs_tenant(c));
  memset(ts, 0xa5, sizeof(ts));
  CHECK_OK(c, kvs_tenant_stats_get(c, ts, 2, &n));
  CHECK(n == 0);
  for (size_t i = 0; i < sizeof(ts); i++)
    CHECK(((const unsigned char *)ts)[i] == 0xa5);
  n = 7;
  CHECK_OK(c, kvs_tenant_stats_get_v08(c, NULL, 0, &n));
  CHECK(n == 0);
  CHECK(kvs_tenant_stats_get(c, NULL, 1, &n) == KVS_EINVAL);
  CHECK(kvs_tenant_stats_get(c, ts, 2, NULL) == KVS_EINVAL);
}

int main(void) {
  static const char *const opts[] = {"--num-layers", "1", "--head-dim", "8",
                                     "--pool-blocks", "32", NULL};
  int my_fds = itest_fd_count(0);
  uint32_t tok[3 * 16 + 1];
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  kvs_stats st;
  uint32_t sealed = 0;

  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "test_abi_stats");
  for (uint32_t i = 0; i < 3 * 16 + 1; i++)
    tok[i] = 7 + i;
  CHECK_OK(c, kvs_lookup(c, 1, tok, 49, NULL, 0, &lr));
  CHECK_OK(c, kvs_allocate(c, 1, 49, &ar));
  CHECK_OK(c, kvs_commit(c, 1, 0, tok, 49, NULL, 0, &sealed));
  CHECK(sealed == 3);
  CHECK_OK(c, kvs_free(c, 1));

  memset(&st, 0xa5, sizeof(st));
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  CHECK(st.indexed_blocks == 3 && st.cached_blocks == 3);
  CHECK(st.queued_bytes == 0); /* nothing else is queued in this test */
  check_old(c, kvs_stats_get_v01, offsetof(kvs_stats, backend), &st);
  check_old(c, kvs_stats_get_v02, offsetof(kvs_stats, queued_bytes), &st);
  check_no_tenants(c);

  itest_check_pool(c, 1, 0, 0);
  kvs_close(c);
  itest_daemon_finish(&d, my_fds);
  printf("test_abi_stats: ok\n");
  return 0;
}
