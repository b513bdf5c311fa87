/*
 * worker — one inference worker of the kvshare demo (tests/demo.sh).
 *
 *   worker --socket PATH --id W [--users U] [--turns T] [--sys N]
 *          [--reply R] [--seed S] [--rtt | --rtt-only] [--pin-server CPU]
 *
 * A chat workload: every user's conversation starts with the same system
 * prompt (N tokens, shared by all workers); each turn appends the user's new
 * message to the conversation so far, prefills it, and decodes a reply of R
 * tokens.  The worker serves U users of its own for T turns, interleaved.
 *
 * Per turn, through libkvshare and the shared pool:
 *   lookup       how much of the prompt is cached (the system prompt, which
 *                any worker may have computed, and this user's earlier
 *                turns); every hit block's bytes are checked against K/V
 *                recomputed with the stand-in model;
 *   allocate     blocks for the rest; the worker computes K/V for those
 *                tokens only (tests/demo/toymodel) and writes them with the
 *                write kernel; prefill attention runs over the whole prompt
 *                through the paged pool; commit seals the full blocks;
 *   decode       R steps, each one batch (commit the last token + append a
 *                slot): write K/V of the new token, decode attention;
 *   free         the blocks stay cached for the next turn and other workers.
 * Every attention output row (prefill and decode, every layer) is compared
 * with the output computed from scratch with no cache (toy_reference), with
 * a tolerance suited to the pool's dtype.
 *
 * On a cuda pool (a GPU, or the stand-in driver in the tests) the same steps
 * run on the device: the kernels come from kvs_pool_kernels() (CUDA), their
 * inputs are staged into device buffers, the worker synchronises before it
 * commits what it wrote (the stream rule), and cached blocks are read back
 * with a device-to-host copy to be checked.
 *
 * It prints one line "RESULT key=value ..." for the demo's report, and exits
 * 0 only if every check passed.  --rtt also measures the daemon's ping round
 * trip against a raw Unix-socket ping-pong of the same frame sizes;
 * --rtt-only measures only that (no workload); --pin-server CPU runs the
 * echo process on that CPU (put kvshared there too for a like comparison).
 */
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/kvshare.h"
#include "tests/demo/toymodel.h"

#define NUM_HEADS_PER_KV 2 /* grouped-query attention: 2 query heads per kv */
#define MAX_TOKENS 4096

static const char *sock;
static int wid, users = 3, turns = 4, sys_len = 100, reply = 6, do_rtt;
static int rtt_only, pin_server = -1;
static uint64_t seed = 42;

static kvs_client *c;
static const kvs_layout *L;
static toy_model M;
static const kvs_kernels *K;
static double tol;

/* Counters for the report. */
static long n_req, prompt_tokens, hit_tokens, computed_tokens, decode_tokens;
static long blocks_alloc, hit_blocks_checked, rows_checked, failures;
static long round_trips, first_hit = -1;
static double max_err;

#define FAIL(...)                                                            \
  do {                                                                       \
    fprintf(stderr, "worker %d: ", wid);                                     \
    fprintf(stderr, __VA_ARGS__);                                            \
    fprintf(stderr, "\n");                                                   \
    failures++;                                                              \
  } while (0)

#define MUST(call)                                                           \
  do {                                                                       \
    int rc_ = (call);                                                        \
    if (rc_) {                                                               \
      fprintf(stderr, "worker %d: %s: %s (%s)\n", wid, #call,                \
              kvs_strerror(rc_), kvs_last_message(c));                       \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return (uint32_t)(x ^ (x >> 33));
}

/* Token ids: the system prompt, a user's message, the model's reply. */
static uint32_t sys_token(int i) { return 1 + hash32(seed * 7 + (uint64_t)i) % 30000; }
static uint32_t user_token(int user, int turn, int i) {
  return 1 + hash32(((uint64_t)user << 40) ^ ((uint64_t)turn << 20) ^ (uint64_t)i ^ 0xabc) % 30000;
}
static uint32_t reply_token(int user, int turn, int i) {
  return 1 + hash32(((uint64_t)user << 40) ^ ((uint64_t)turn << 20) ^ (uint64_t)i ^ 0xdef) % 30000;
}

/* One conversation. */
typedef struct conv {
  int user;
  uint32_t tok[MAX_TOKENS];
  uint32_t n;
} conv;

/* Scratch. */
static float *q, *k, *v, *out, *ref;
static int64_t *slots;
static uint8_t *blockbuf; /* one block read back from the device */

/* On a cuda pool: device copies of the kernels' inputs and outputs. */
static int dev;
static void *d_q, *d_k, *d_v, *d_out, *d_slots, *d_table, *d_seq, *d_qstart;

/* The address a kernel takes for host data: host itself, or its device
 * copy in d (bytes copied there first). */
static const void *staged(void *d, const void *host, size_t bytes) {
  if (!dev)
    return host;
  MUST(kvs_cuda_memcpy_htod(d, host, bytes));
  return d;
}

/* Where the byte at pool offset off of block b is in this process: the
 * mapping, or (cuda pool) the copy of the block in blockbuf. */
static const void *cached(uint32_t b, uint64_t off) {
  if (dev)
    return blockbuf + (off - kvs_block_offset(L, b));
  return (const char *)kvs_pool_base(c) + off;
}

/* Does an int8/fp8 cache hold the rows x [num_kv_heads][head_dim] of token
 * t in (block b, layer, kv), each head's bytes and scales exactly as
 * kvs_quantize_row makes them? */
static int quantized_row_equal(uint32_t b, uint32_t layer, uint32_t kv,
                               uint32_t t, const float *x) {
  uint32_t hd = L->head_dim, nsc = kvs_scale_floats(L->dtype);
  uint8_t want[4096]; /* the layout's largest head_dim */
  float sc[2];
  for (uint32_t h = 0; h < L->num_kv_heads; h++) {
    MUST(kvs_quantize_row(want, sc, L->dtype, x + (size_t)h * hd, hd));
    if (memcmp(cached(b, kvs_elem_offset(L, b, layer, kv, t, h)), want, hd) ||
        memcmp(cached(b, kvs_scale_elem_offset(L, b, layer, kv, t, h)), sc,
               nsc * sizeof *sc))
      return 0;
  }
  return 1;
}

/* Checks the cached K/V of positions [0, upto) of tok in the blocks of
 * table against the model, block by block. */
static void check_hit_blocks(const uint32_t *tok, const uint32_t *table,
                             uint32_t upto) {
  uint32_t kvh = L->num_kv_heads, hd = L->head_dim, bs = L->block_size;
  size_t row = (size_t)kvh * hd, es = kvs_dtype_size(L->dtype);
  uint8_t *want = malloc(row * es);
  for (uint32_t b = 0; b < upto / bs; b++) {
    int ok = 1;
    for (uint32_t t = 0; t < bs && ok; t++) {
      uint32_t p = b * bs + t;
      for (uint32_t layer = 0; layer < L->num_layers && ok; layer++) {
        toy_qkv(&M, layer, tok[p], p, NULL, k, v);
        for (uint32_t kv = 0; kv < 2 && ok; kv++) {
          if (dev && t == 0 && layer == 0 && kv == 0) /* as the device holds it */
            MUST(kvs_cuda_memcpy_dtoh(blockbuf, kvs_block_ptr(c, table[b]),
                                      L->block_stride));
          if (kvs_dtype_quantized(L->dtype))
            ok = quantized_row_equal(table[b], layer, kv, t, kv ? v : k);
          else {
            kvs_convert(want, L->dtype, kv ? v : k, KVS_DTYPE_FP32, row);
            ok = memcmp(cached(table[b], kvs_elem_offset(L, table[b], layer,
                                                         kv, t, 0)),
                        want, row * es) == 0;
          }
        }
      }
    }
    if (!ok)
      FAIL("cached block %u (position %u) does not hold the prefix's K/V",
           table[b], b * bs);
    hit_blocks_checked++;
  }
  free(want);
}

/* Writes K/V of positions [from, to) with the write kernel. */
static void write_kv(const uint32_t *tok, const uint32_t *table, uint32_t from,
                     uint32_t to) {
  uint32_t kvh = L->num_kv_heads, hd = L->head_dim, bs = L->block_size;
  size_t row = (size_t)kvh * hd;
  for (uint32_t p = from; p < to; p++)
    slots[p - from] = (int64_t)table[p / bs] * bs + p % bs;
  for (uint32_t layer = 0; layer < L->num_layers; layer++) {
    for (uint32_t p = from; p < to; p++)
      toy_qkv(&M, layer, tok[p], p, NULL, k + (p - from) * row,
              v + (p - from) * row);
    kvs_write_args w;
    memset(&w, 0, sizeof w);
    MUST(kvs_paged_kv_of(c, layer, &w.kv));
    w.k = staged(d_k, k, (size_t)(to - from) * row * sizeof *k);
    w.v = staged(d_v, v, (size_t)(to - from) * row * sizeof *v);
    w.slots = staged(d_slots, slots, (to - from) * sizeof *slots);
    w.src_token_stride = row;
    w.src_dtype = KVS_DTYPE_FP32;
    w.num_tokens = to - from;
    MUST(K->write_kv(&w, NULL));
  }
  /* The stream rule: what this worker wrote is on the device before the
   * commit that lets others read it. */
  if (dev)
    MUST(kvs_cuda_sync(NULL));
}

/* Attention for rows [from, to) of the request (prefill when to - from > 1
 * or from == 0; decode for a single last row), checked against the model
 * computed from scratch. */
static void attend_and_check(const uint32_t *tok, const uint32_t *table,
                             uint32_t nblocks, uint32_t from, uint32_t to,
                             int decode) {
  uint32_t nh = M.num_heads, hd = L->head_dim, rows = to - from;
  size_t qrow = (size_t)nh * hd;
  for (uint32_t layer = 0; layer < L->num_layers; layer++) {
    for (uint32_t p = from; p < to; p++)
      toy_qkv(&M, layer, tok[p], p, q + (p - from) * qrow, NULL, NULL);
    kvs_attn_args a;
    memset(&a, 0, sizeof a);
    MUST(kvs_paged_kv_of(c, layer, &a.kv));
    uint32_t seq_len = to, q_start[2] = {0, rows};
    a.out = dev ? d_out : out;
    a.q = staged(d_q, q, (size_t)rows * qrow * sizeof *q);
    a.seq_lens = staged(d_seq, &seq_len, sizeof seq_len);
    a.q_start = decode ? NULL : staged(d_qstart, q_start, sizeof q_start);
    a.block_tables = staged(d_table, table, nblocks * sizeof *table);
    a.num_seqs = 1;
    a.num_rows = rows;
    a.num_heads = nh;
    a.max_blocks_per_seq = nblocks;
    a.max_seq_len = to;
    a.qo_dtype = KVS_DTYPE_FP32;
    a.scale = toy_scale(&M);
    MUST(decode ? K->decode_attention(&a, NULL) : K->prefill_attention(&a, NULL));
    if (dev) {
      MUST(kvs_cuda_sync(NULL));
      MUST(kvs_cuda_memcpy_dtoh(out, d_out, (size_t)rows * qrow * sizeof *out));
    }
    for (uint32_t p = from; p < to; p++) {
      if (toy_reference(&M, layer, tok, to, p, L->dtype, KVS_DTYPE_FP32, ref)) {
        FAIL("toy_reference failed");
        return;
      }
      const float *o = out + (p - from) * qrow;
      for (size_t i = 0; i < qrow; i++) {
        double e = fabs((double)o[i] - ref[i]) / (1.0 + fabs(ref[i]));
        if (e > max_err)
          max_err = e;
        if (!(e <= tol)) {
          FAIL("layer %u position %u: attention %g, from scratch %g", layer,
               p, o[i], ref[i]);
          return;
        }
      }
      rows_checked++;
    }
  }
}

/* One turn of one conversation. */
static void turn(conv *cv, int t, kvs_batch *b, uint64_t req) {
  uint32_t bs = L->block_size;
  /* The user's new message. */
  int len = 8 + (int)(hash32((uint64_t)cv->user * 131 + (uint64_t)t) % 17);
  for (int i = 0; i < len && (int)cv->n < MAX_TOKENS - reply - 1; i++)
    cv->tok[cv->n++] = user_token(cv->user, t, i);
  uint32_t n = cv->n;

  kvs_lookup_result lr;
  MUST(kvs_lookup(c, req, cv->tok, n, NULL, 0, &lr));
  round_trips++;
  uint32_t table[MAX_TOKENS / 4];
  uint32_t nblocks = lr.num_blocks, h = lr.hit_tokens;
  memcpy(table, lr.blocks, nblocks * sizeof *table);
  if (first_hit < 0)
    first_hit = h;
  n_req++;
  prompt_tokens += n;
  hit_tokens += h;
  check_hit_blocks(cv->tok, table, h);

  kvs_alloc_result ar;
  MUST(kvs_allocate(c, req, n - h, &ar));
  round_trips++;
  memcpy(table + ar.first_index, ar.blocks, ar.num_blocks * sizeof *table);
  nblocks = ar.first_index + ar.num_blocks;
  blocks_alloc += ar.num_blocks;
  write_kv(cv->tok, table, h, n);
  computed_tokens += n - h;
  attend_and_check(cv->tok, table, nblocks, h, n, 0);
  uint32_t sealed;
  MUST(kvs_commit(c, req, h, NULL, n - h, table + h / bs, nblocks - h / bs,
                  &sealed));
  round_trips++;

  /* Decode: each step is one batch (commit of the previous token, a slot
   * for the next). */
  uint32_t pending = 0; /* a written token not committed yet */
  for (int i = 0; i < reply; i++) {
    kvs_batch_reset(b);
    if (pending)
      kvs_batch_commit(b, req, cv->n - 1, &cv->tok[cv->n - 1], 1, NULL, 0);
    int ai = kvs_batch_append(b, req, 1);
    MUST(kvs_batch_submit(c, b));
    round_trips++;
    for (uint32_t j = 0; j < kvs_batch_count(b); j++)
      MUST(kvs_batch_status(b, j));
    MUST(kvs_batch_alloc_result(b, (uint32_t)ai, &ar));
    if (ar.num_blocks) {
      table[ar.first_index] = ar.blocks[0];
      nblocks = ar.first_index + 1;
      blocks_alloc++;
    }
    cv->tok[cv->n++] = reply_token(cv->user, t, i);
    write_kv(cv->tok, table, cv->n - 1, cv->n);
    attend_and_check(cv->tok, table, nblocks, cv->n - 1, cv->n, 1);
    decode_tokens++;
    pending = 1;
  }
  if (pending) {
    MUST(kvs_commit(c, req, cv->n - 1, &cv->tok[cv->n - 1], 1, NULL, 0, NULL));
    round_trips++;
  }
  MUST(kvs_free(c, req));
  round_trips++;
}

/* ---- round trip against a raw ping-pong ----------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void rtt(double *daemon_us, double *raw_us) {
  /* The Ping frames are 38 bytes each way (16-byte payload). */
  enum { N = 3000, REQ = 38, RESP = 38 };
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
    *daemon_us = *raw_us = 0;
    return;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    char buf[REQ];
    close(sv[0]);
    if (pin_server >= 0) { /* where kvshared runs, for a like comparison */
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(pin_server, &set);
      sched_setaffinity(0, sizeof set, &set);
    }
    for (;;) {
      size_t got = 0;
      while (got < REQ) {
        ssize_t r = read(sv[1], buf + got, REQ - got);
        if (r <= 0)
          _exit(0);
        got += (size_t)r;
      }
      if (write(sv[1], buf, RESP) != RESP)
        _exit(0);
    }
  }
  close(sv[1]);
  double *a = malloc(N * sizeof *a), *r = malloc(N * sizeof *r);
  char buf[REQ] = {0};
  /* In alternating runs of 500, so that both sides are equally warm. */
  for (int base = 0; base < N; base += 500) {
    for (int i = base; i < base + 500 && i < N; i++) {
      double t0 = now_us();
      size_t got = 0;
      if (write(sv[0], buf, REQ) != REQ)
        break;
      while (got < RESP) {
        ssize_t x = read(sv[0], buf + got, RESP - got);
        if (x <= 0)
          break;
        got += (size_t)x;
      }
      r[i] = now_us() - t0;
    }
    for (int i = base; i < base + 500 && i < N; i++) {
      double t0 = now_us();
      MUST(kvs_ping(c, "0123456789abcdef", 16));
      a[i] = now_us() - t0;
    }
  }
  close(sv[0]);
  waitpid(pid, NULL, 0);
  qsort(a, N, sizeof *a, cmp_double);
  qsort(r, N, sizeof *r, cmp_double);
  *daemon_us = a[N / 2];
  *raw_us = r[N / 2];
  free(a);
  free(r);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--rtt")) {
      do_rtt = 1;
      continue;
    }
    if (!strcmp(o, "--rtt-only")) {
      do_rtt = rtt_only = 1;
      continue;
    }
    if (!val) {
      fprintf(stderr, "worker: %s needs a value\n", o);
      return 2;
    }
    i++;
    if (!strcmp(o, "--socket"))
      sock = val;
    else if (!strcmp(o, "--id"))
      wid = atoi(val);
    else if (!strcmp(o, "--users"))
      users = atoi(val);
    else if (!strcmp(o, "--turns"))
      turns = atoi(val);
    else if (!strcmp(o, "--sys"))
      sys_len = atoi(val);
    else if (!strcmp(o, "--reply"))
      reply = atoi(val);
    else if (!strcmp(o, "--pin-server"))
      pin_server = atoi(val);
    else if (!strcmp(o, "--seed"))
      seed = strtoull(val, NULL, 10);
    else {
      fprintf(stderr, "worker: unknown option %s\n", o);
      return 2;
    }
  }
  if (users < 1 || turns < 1 || sys_len < 1 || reply < 0 || users > 64) {
    fprintf(stderr, "worker: bad sizes\n");
    return 2;
  }
  char name[32];
  snprintf(name, sizeof name, "demo-worker-%d", wid);
  kvs_connect_opts opts = {name, 60000, 0};
  int rc = kvs_connect(sock, &opts, &c);
  if (rc) {
    fprintf(stderr, "worker %d: connect %s: %s (%s)\n", wid, sock,
            kvs_strerror(rc), kvs_last_message(NULL));
    return 1;
  }
  L = kvs_layout_of(c);
  K = kvs_pool_kernels(c); /* CUDA on a cuda pool, the C twins on host */
  dev = strcmp(kvs_pool_backend(c), "cuda") == 0;
  rc = toy_init(&M, L->num_layers, L->num_kv_heads * NUM_HEADS_PER_KV,
                L->num_kv_heads, L->head_dim, seed);
  if (rc) {
    fprintf(stderr, "worker %d: toy model: %d\n", wid, rc);
    return 1;
  }
  /* toy_reference rounds K and V through the cache dtype too, so what is
   * left is the order of fp32 accumulation. */
  tol = L->dtype == KVS_DTYPE_FP32 ? 1e-4 : 1e-3;
  size_t maxrows = MAX_TOKENS;
  q = malloc(maxrows * M.num_heads * L->head_dim * sizeof *q);
  out = malloc(maxrows * M.num_heads * L->head_dim * sizeof *out);
  k = malloc(maxrows * L->num_kv_heads * L->head_dim * sizeof *k);
  v = malloc(maxrows * L->num_kv_heads * L->head_dim * sizeof *v);
  ref = malloc((size_t)M.num_heads * L->head_dim * sizeof *ref);
  slots = malloc(maxrows * sizeof *slots);
  blockbuf = malloc(L->block_stride);
  if (!q || !out || !k || !v || !ref || !slots || !blockbuf)
    return 1;
  if (dev) {
    size_t qb = maxrows * M.num_heads * L->head_dim * sizeof *q;
    size_t kb = maxrows * L->num_kv_heads * L->head_dim * sizeof *k;
    MUST(kvs_cuda_malloc(&d_q, qb));
    MUST(kvs_cuda_malloc(&d_out, qb));
    MUST(kvs_cuda_malloc(&d_k, kb));
    MUST(kvs_cuda_malloc(&d_v, kb));
    MUST(kvs_cuda_malloc(&d_slots, maxrows * sizeof *slots));
    MUST(kvs_cuda_malloc(&d_table, (MAX_TOKENS / 4) * sizeof(uint32_t)));
    MUST(kvs_cuda_malloc(&d_seq, sizeof(uint32_t)));
    MUST(kvs_cuda_malloc(&d_qstart, 2 * sizeof(uint32_t)));
  }

  conv *cv = calloc((size_t)users, sizeof *cv);
  for (int u = 0; u < users; u++) {
    cv[u].user = wid * 1000 + u;
    for (int i = 0; i < sys_len; i++)
      cv[u].tok[cv[u].n++] = sys_token(i);
  }
  kvs_batch *b;
  MUST(kvs_batch_new(&b));
  uint64_t req = 1;
  double t0 = now_us();
  for (int t = 0; t < turns && !rtt_only; t++)
    for (int u = 0; u < users; u++)
      turn(&cv[u], t, b, req++);
  double secs = (now_us() - t0) / 1e6;
  kvs_batch_free(b);

  double d_us = 0, r_us = 0;
  if (do_rtt)
    rtt(&d_us, &r_us);
  printf("RESULT worker=%d requests=%ld prompt_tokens=%ld hit_tokens=%ld "
         "computed_tokens=%ld decode_tokens=%ld blocks_allocated=%ld "
         "hit_blocks_checked=%ld rows_checked=%ld max_rel_err=%.3g "
         "round_trips=%ld seconds=%.2f rtt_daemon_us=%.2f rtt_raw_us=%.2f "
         "first_hit=%ld failures=%ld\n",
         wid, n_req, prompt_tokens, hit_tokens, computed_tokens, decode_tokens,
         blocks_alloc, hit_blocks_checked, rows_checked, max_err, round_trips,
         secs, d_us, r_us, first_hit, failures);
  free(cv);
  free(q);
  free(out);
  free(k);
  free(v);
  free(ref);
  free(slots);
  free(blockbuf);
  if (dev) {
    void *bufs[] = {d_q, d_out, d_k, d_v, d_slots, d_table, d_seq, d_qstart};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
      kvs_cuda_free(bufs[i]);
  }
  toy_free(&M);
  kvs_close(c);
  return failures ? 1 : 0;
}
