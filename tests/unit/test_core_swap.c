/*
 * test_core_swap.c — swapping a preempted request out and back in, in the
 * pure core (core.h, "Swap").
 *
 * 1. test_swap_cases: the rules, one by one, on a small pool: what moves,
 *    what is kept, what a swapped request may not do, ENOSPC on either side
 *    leaving everything as it was, ENOTSUP without a tier, a block still
 *    resident coming back with no copy.
 *
 * 2. test_swap_bytes: the daemon's mode with a fake "content" per device
 *    block and per tier slot.  Workers fill requests (sealed blocks hold
 *    their hash, unsealed ones a tag of their own), lookups promote, the
 *    demotion timer runs, requests are swapped out and in with moves and
 *    fills that end in any order and fail at random, and requests are freed
 *    at any point, swaps in flight included.  Checked throughout: a swap
 *    move reads a block nobody reused, a swap-in reads a held copy nobody
 *    overwrote, every block a swapped-in request holds carries what it held
 *    before, a swap-in with no failure restores every written token, and
 *    core_check (holds included) holds.  At the end nothing is held.
 *
 * KVS_MODEL_OPS scales the second (default 300,000 operations).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/core/core.h"
#include "tests/unit/core_test.h"

#define BS 4
#define MAXREQ 10
#define MAXTOK 64
#define MAXB (MAXTOK / BS + 1)
#define NONE KVS_BLOCK_NONE

static core *make_core(uint32_t nb, uint32_t reserve, uint32_t host,
                       uint32_t disk) {
  core_config cfg;
  core *c;
  kvs_layout l = {BS, 1, 1, 1, KVS_DTYPE_FP32, nb, 0};

  core_config_init(&cfg);
  cfg.num_blocks = nb;
  cfg.block_size = BS;
  cfg.reserve_blocks = reserve;
  cfg.root = core_root_hash(&l, "swap-model");
  cfg.tier_slots[CORE_TIER_HOST] = host;
  cfg.tier_slots[CORE_TIER_DISK] = disk;
  cfg.tier_window = 6;
  assert_int_equal(core_create(&cfg, &c), 0);
  return c;
}

/* ==== 1. the rules ======================================================= */

/* A request of n tokens, all committed (full blocks sealed). */
static core_req *filled(core *c, uint32_t first, uint32_t n) {
  core_req *r;
  core_cow cow;
  uint32_t t[MAXTOK];

  for (uint32_t i = 0; i < n; i++)
    t[i] = first + i;
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_allocate(c, r, n, &cow), 0);
  assert_int_equal(core_commit(c, r, 0, t, n, NULL), 0);
  return r;
}

static void test_swap_cases(void **state) {
  (void)state;
  core *c = make_core(8, 1, 6, 0), *bare = make_core(8, 0, 0, 0);
  core_move mv[MAXB];
  core_promo pr[MAXB];
  core_cow cow;
  core_stats st;
  core_tier_stats ts[CORE_TIERS];
  uint32_t nm, np, n, hit, saved[MAXB];
  const uint32_t *bl;
  core_req *r, *other;
  uint32_t t[MAXTOK];

  /* No tier: nothing to swap to. */
  r = filled(bare, 1, 2 * BS);
  assert_int_equal(core_swap_out(bare, r, mv, MAXB, &nm), KVS_ENOTSUP);
  core_req_free(bare, r);
  check(bare);
  core_destroy(bare);

  /* 3 sealed blocks and a partial one: 4 moves. */
  r = filled(c, 1, 3 * BS + 2);
  bl = core_req_blocks(r, &n);
  memcpy(saved, bl, n * sizeof(*saved));
  assert_int_equal(core_swap_out(c, r, mv, 3, &nm), KVS_EINVAL);
  assert_int_equal(core_swap_out(c, r, mv, MAXB, &nm), 0);
  assert_int_equal(nm, 4);
  assert_int_equal(core_req_swap_state(r), CORE_SWAP_OUT_PENDING);
  for (uint32_t i = 0; i < nm; i++) {
    assert_int_equal(mv[i].kind, CORE_MOVE_SWAP);
    assert_int_equal(mv[i].block, saved[i]);
  }
  check(c);
  /* Swapping: every operation but free is refused. */
  assert_int_equal(core_allocate(c, r, 1, &cow), KVS_ESTATE);
  assert_int_equal(core_append(c, r, 1, &cow), KVS_ESTATE);
  assert_int_equal(core_commit(c, r, 0, NULL, 1, NULL), KVS_ESTATE);
  assert_int_equal(core_fork(c, r, &other), KVS_ESTATE);
  assert_int_equal(core_preempt(c, r), KVS_ESTATE);
  assert_int_equal(core_swap_out(c, r, mv, MAXB, &nm), KVS_ESTATE);
  assert_int_equal(core_swap_in(c, r, pr, MAXB, &np), KVS_ESTATE);
  /* One move failed: undone, the request as it was. */
  int ok4[4] = {1, 1, 0, 1};
  assert_int_equal(core_swap_out_finish(c, r, mv, 4, ok4), KVS_EIO);
  assert_int_equal(core_req_swap_state(r), CORE_SWAP_NONE);
  bl = core_req_blocks(r, &n);
  assert_int_equal(n, 4);
  assert_memory_equal(bl, saved, 4 * sizeof(*saved));
  assert_int_equal(core_req_num_written(r), 3 * BS + 2);
  check(c);
  core_tier_get_stats(c, ts);
  assert_int_equal(ts[0].held, 0);
  /* The good copies of sealed blocks stay as cache entries (blocks 0, 1);
   * the private copy of the partial block is gone. */
  assert_int_equal(ts[0].used, 2);

  /* Again: the two sealed blocks below are kept, two move. */
  assert_int_equal(core_swap_out(c, r, mv, MAXB, &nm), 0);
  assert_int_equal(nm, 2);
  assert_int_equal(mv[0].block, saved[2]);
  assert_int_equal(mv[1].block, saved[3]);
  int ok2[2] = {1, 1};
  assert_int_equal(core_swap_out_finish(c, r, mv, 2, ok2), 0);
  assert_int_equal(core_req_swap_state(r), CORE_SWAP_OUT);
  assert_int_equal(core_req_swap_blocks(r), 4);
  assert_int_equal(core_req_num_slots(r), 0);
  core_get_stats(c, &st);
  assert_int_equal(st.used_blocks, 0);
  assert_int_equal(st.cached_blocks, 3); /* the sealed ones */
  assert_int_equal(st.swapped_requests, 1);
  assert_int_equal(st.swap_kept_blocks, 2);
  core_tier_get_stats(c, ts);
  assert_int_equal(ts[0].held, 4);
  assert_int_equal(ts[0].used, 4);
  check(c);
  /* A swapped request is not looked up again (it is not empty). */
  for (uint32_t i = 0; i < 3 * BS + 1; i++)
    t[i] = 1 + i;
  assert_int_equal(core_lookup(c, r, t, 3 * BS + 1, &hit), KVS_ESTATE);

  /* Block 0 is resident still when it comes back; the pool is refilled
   * in between (evicting blocks 1 and 2: taken from the head). */
  other = filled(c, 1000, 5 * BS);
  core_get_stats(c, &st);
  assert_int_equal(st.used_blocks, 5);
  /* 4 blocks needed with the reserve of 1, 3 free: no. */
  assert_int_equal(core_swap_in(c, r, pr, MAXB, &np), KVS_ENOSPC);
  assert_int_equal(core_req_swap_state(r), CORE_SWAP_OUT);
  check(c);
  core_req_free(c, other);
  assert_int_equal(core_swap_in(c, r, pr, MAXB, &np), 0);
  bl = core_req_blocks(r, &n);
  assert_int_equal(n, 4);
  assert_int_equal(core_req_num_written(r), 3 * BS + 2);
  core_get_stats(c, &st);
  /* 4 promos where nothing stayed resident; fewer otherwise. */
  assert_int_equal(np + st.swap_resident_blocks, 4);
  check(c);
  /* The partial block's fill fails: the request keeps its 3 sealed blocks. */
  int okp[MAXB];
  for (uint32_t i = 0; i < np; i++)
    okp[i] = pr[i].pos != 3;
  assert_int_equal(core_swap_in_finish(c, r, pr, np, okp), 3 * BS);
  assert_int_equal(core_req_swap_state(r), CORE_SWAP_NONE);
  assert_int_equal(core_req_num_slots(r), 3 * BS);
  assert_int_equal(core_req_num_sealed(r), 3);
  core_get_stats(c, &st);
  assert_int_equal(st.swap_failures, 2); /* one out, one in */
  assert_int_equal(st.swapped_requests, 0);
  check(c);
  /* Its sealed blocks are in the index again: a lookup hits them. */
  assert_int_equal(core_req_create(c, NULL, 0, &other), 0);
  assert_int_equal(core_lookup(c, other, t, 3 * BS + 1, &hit), 0);
  assert_int_equal(hit, 3 * BS);
  core_req_free(c, other);
  /* And it goes on: append, commit, then is freed. */
  assert_int_equal(core_append(c, r, 2, &cow), 0);
  assert_int_equal(core_commit(c, r, 3 * BS, NULL, 0, NULL), 0);
  core_req_free(c, r);
  check(c);

  /* A tier too small: ENOSPC, the request as it was. */
  r = filled(c, 500, 7 * BS);
  assert_int_equal(core_swap_out(c, r, mv, MAXB, &nm), KVS_ENOSPC);
  assert_int_equal(core_req_swap_state(r), CORE_SWAP_NONE);
  assert_int_equal(core_req_num_written(r), 7 * BS);
  check(c);
  /* Freed while swapping out: the moves end with no request. */
  core_req_free(c, r);
  r = filled(c, 700, 2 * BS + 1);
  assert_int_equal(core_swap_out(c, r, mv, MAXB, &nm), 0);
  core_req_free(c, r);
  check(c);
  assert_int_equal(core_swap_out_finish(c, NULL, mv, nm, NULL), KVS_EIO);
  check(c);
  core_get_stats(c, &st);
  assert_int_equal(st.used_blocks, 0);
  assert_int_equal(st.swapped_requests, 0);
  core_tier_get_stats(c, ts);
  assert_int_equal(ts[0].held, 0);
  core_destroy(c);
}

/* ==== 2. the daemon's mode, with bytes ================================== */

#define ANB 64
#define AHOST 24
#define ADISK 40
#define MAXMOVES 64

enum { S_IDLE, S_PROMOTING, S_OUTGOING, S_OUT, S_INCOMING };

#define GARBAGE MODEL_GARBAGE

typedef struct sreq {
  core_req *r;
  int live, state, doomed; /* doomed: freed with I/O in flight */
  uint32_t tok[MAXTOK], n, gen;
  kvs_hash128 exp[MAXB]; /* what each block of its table holds */
  uint32_t written;      /* before a swap-out */
  uint32_t sw_blocks;
  core_promo promos[MAXB];
  uint32_t npromos;
  core_move mv[MAXB];
  kvs_hash128 mvexp[MAXB];
  uint32_t nmv;
} sreq;

static kvs_hash128 dev[ANB], slot_bytes[CORE_TIERS][ADISK];
static core_move moves[MAXMOVES];
static uint32_t nmoves, gen;
static sreq S[MAXREQ];
static uint64_t faults;

static uint32_t gen_prompt(uint32_t *t) {
  return model_prompt(t, MAXTOK, BS);
}

/* Every block of s's table holds what s expects. */
static void check_bytes(core *c, sreq *s) {
  uint32_t n;
  const uint32_t *bl = core_req_blocks(s->r, &n);

  for (uint32_t i = 0; i < n; i++)
    assert_true(heq(dev[bl[i]], s->exp[i]));
  (void)c;
}

/* After a lookup or an allocation: sealed blocks hold their hash, the
 * others this request's own tag. */
static void learn(core *c, sreq *s, uint32_t from) {
  uint32_t n;
  const uint32_t *bl = core_req_blocks(s->r, &n);

  for (uint32_t i = from; i < n; i++) {
    core_block_info bi;
    core_block_get(c, bl[i], &bi);
    if (i < core_req_num_sealed(s->r))
      s->exp[i] = bi.hash;
    else
      s->exp[i] = (kvs_hash128){s->gen, 0x5a5a0000ull + i};
    dev[bl[i]] = s->exp[i];
  }
}

/* A worker computes the rest of the prompt and commits part of it. */
static void compute(core *c, sreq *s, uint32_t hit) {
  core_cow cow;
  uint32_t n0;

  core_req_blocks(s->r, &n0);
  if (hit >= s->n || core_allocate(c, s->r, s->n - hit, &cow) != 0)
    return;
  uint32_t k = rnd(s->n - hit + 1);
  assert_int_equal(core_commit(c, s->r, hit, NULL, k, NULL), 0);
  learn(c, s, n0);
}

static void end_promotion(core *c, sreq *s) {
  int ok[MAXB] = {0};

  for (uint32_t j = 0; j < s->npromos; j++) {
    core_promo *p = &s->promos[j];
    assert_true(heq(slot_bytes[p->tier][p->slot], p->hash));
    ok[j] = rnd(12) != 0;
    dev[p->block] = ok[j] ? p->hash : GARBAGE;
    faults += !ok[j];
  }
  uint32_t hit = core_promote_finish(c, s->doomed ? NULL : s->r, s->promos,
                                     s->npromos, ok);
  s->state = S_IDLE;
  if (s->doomed) {
    s->live = s->doomed = 0;
    return;
  }
  learn(c, s, 0);
  compute(c, s, hit);
}

static void new_request(core *c, sreq *s) {
  core_lookup_out out;

  memset(s, 0, sizeof(*s));
  s->n = gen_prompt(s->tok);
  s->live = 1;
  s->gen = ++gen;
  assert_int_equal(core_req_create(c, NULL, 0, &s->r), 0);
  assert_int_equal(core_lookup_promote(c, s->r, s->tok, s->n, 1, s->promos,
                                       MAXB, &out), 0);
  s->npromos = out.npromos;
  if (s->npromos) {
    s->state = S_PROMOTING;
    return;
  }
  learn(c, s, 0);
  compute(c, s, out.hit_tokens);
}

static void end_move(core *c, uint32_t k) {
  core_move m = moves[k];
  int ok = rnd(16) != 0;
  kvs_hash128 *const slots[CORE_TIERS] = {slot_bytes[0], slot_bytes[1]};

  moves[k] = moves[--nmoves];
  faults += !ok;
  model_move_end(c, &m, ok, dev, slots);
}

static void swap_out(core *c, sreq *s) {
  uint32_t n;
  const uint32_t *bl = core_req_blocks(s->r, &n);
  int rc = core_swap_out(c, s->r, s->mv, MAXB, &s->nmv);

  if (rc == KVS_ENOSPC || rc == KVS_ELIMIT) {
    assert_int_equal(core_req_swap_state(s->r), CORE_SWAP_NONE);
    check_bytes(c, s);
    return;
  }
  assert_int_equal(rc, 0);
  s->written = core_req_num_written(s->r);
  s->sw_blocks = n;
  /* each move reads a block of the table: remember what it holds */
  for (uint32_t i = 0; i < s->nmv; i++) {
    uint32_t pos = 0;
    while (bl[pos] != s->mv[i].block)
      pos++;
    s->mvexp[i] = s->exp[pos];
  }
  s->state = S_OUTGOING;
}

static void end_swap_out(core *c, sreq *s) {
  int ok[MAXB] = {0};

  for (uint32_t i = 0; i < s->nmv; i++) {
    core_move *m = &s->mv[i];
    /* nobody reused the block while it was read */
    assert_true(heq(dev[m->block], s->mvexp[i]));
    ok[i] = rnd(64) != 0;
    slot_bytes[m->tier][m->slot] = ok[i] ? dev[m->block] : GARBAGE;
    faults += !ok[i];
  }
  int rc = core_swap_out_finish(c, s->doomed ? NULL : s->r, s->mv, s->nmv,
                                ok);
  if (s->doomed) {
    s->live = s->doomed = 0;
    s->state = S_IDLE;
    return;
  }
  if (rc == 0) {
    s->state = S_OUT;
    assert_int_equal(core_req_swap_blocks(s->r), s->sw_blocks);
  } else {
    assert_int_equal(rc, KVS_EIO);
    s->state = S_IDLE;
    assert_int_equal(core_req_num_written(s->r), s->written);
    check_bytes(c, s);
  }
}

static void swap_in(core *c, sreq *s) {
  int rc = core_swap_in(c, s->r, s->promos, MAXB, &s->npromos);
  uint32_t n;
  const uint32_t *bl;

  if (rc == KVS_ENOSPC) {
    assert_int_equal(core_req_swap_state(s->r), CORE_SWAP_OUT);
    return;
  }
  assert_int_equal(rc, 0);
  /* the blocks still resident hold what they held */
  bl = core_req_blocks(s->r, &n);
  for (uint32_t i = 0; i < n; i++) {
    int filled_later = 0;
    for (uint32_t j = 0; j < s->npromos; j++)
      filled_later |= s->promos[j].pos == i;
    if (!filled_later)
      assert_true(heq(dev[bl[i]], s->exp[i]));
  }
  s->state = S_INCOMING;
}

static void end_swap_in(core *c, sreq *s) {
  int ok[MAXB] = {0}, all = 1;
  uint32_t n, planned = 0;

  if (!s->doomed)
    core_req_blocks(s->r, &planned);
  for (uint32_t j = 0; j < s->npromos; j++) {
    core_promo *p = &s->promos[j];
    /* the copy held below is what the block held when it went down */
    if (!s->doomed)
      assert_true(heq(slot_bytes[p->tier][p->slot], s->exp[p->pos]));
    ok[j] = rnd(64) != 0;
    all &= ok[j];
    dev[p->block] = ok[j] ? slot_bytes[p->tier][p->slot] : GARBAGE;
    faults += !ok[j];
  }
  uint32_t w = core_swap_in_finish(c, s->doomed ? NULL : s->r, s->promos,
                                   s->npromos, ok);
  s->state = S_IDLE;
  if (s->doomed) {
    s->live = s->doomed = 0;
    return;
  }
  assert_true(w <= s->written);
  if (all && planned == s->sw_blocks)
    assert_int_equal(w, s->written);
  core_req_blocks(s->r, &n);
  assert_true(n <= s->sw_blocks);
  check_bytes(c, s);
}

static void doom_or_free(core *c, sreq *s) {
  core_req_free(c, s->r);
  if (s->state == S_IDLE || s->state == S_OUT) {
    s->live = 0;
    s->state = S_IDLE;
  } else {
    s->doomed = 1; /* its I/O ends later, with no request */
  }
}

static void test_swap_bytes(void **state) {
  (void)state;
  core *c = make_core(ANB, 2, AHOST, ADISK);
  uint64_t ops = nops();

  rng = 0x2545f4914f6cdd1dull;
  for (uint32_t b = 0; b < ANB; b++)
    dev[b] = GARBAGE;
  for (uint32_t s = 0; s < ADISK; s++)
    slot_bytes[0][s] = slot_bytes[1][s] = GARBAGE;

  for (uint64_t op = 1; op <= ops; op++) {
    uint32_t what = rnd(100);
    sreq *s = &S[rnd(MAXREQ)];

    if (what < 20) { /* a request arrives, or one ends */
      if (!s->live)
        new_request(c, s);
      else if (!s->doomed && rnd(3) == 0)
        doom_or_free(c, s);
    } else if (what < 30) { /* in flight: it ends */
      if (s->state == S_PROMOTING)
        end_promotion(c, s);
      else if (s->state == S_OUTGOING)
        end_swap_out(c, s);
      else if (s->state == S_INCOMING)
        end_swap_in(c, s);
    } else if (what < 45) { /* the scheduler preempts or resumes */
      if (s->live && !s->doomed && s->state == S_IDLE && rnd(2))
        swap_out(c, s);
      else if (s->live && !s->doomed && s->state == S_OUT)
        swap_in(c, s);
    } else if (what < 55) { /* the demotion timer */
      nmoves += core_tier_plan(c, moves + nmoves, MAXMOVES - nmoves);
    } else if (nmoves) {
      end_move(c, rnd(nmoves));
    }
    if (op % 128 == 0)
      check(c);
  }
  /* Drain: everything in flight ends, every request goes. */
  while (nmoves)
    end_move(c, nmoves - 1);
  for (int i = 0; i < MAXREQ; i++) {
    sreq *s = &S[i];
    if (s->state == S_PROMOTING)
      end_promotion(c, s);
    else if (s->state == S_OUTGOING)
      end_swap_out(c, s);
    else if (s->state == S_INCOMING)
      end_swap_in(c, s);
    if (s->live)
      doom_or_free(c, s);
  }
  check(c);

  core_stats st;
  core_tier_stats ts[CORE_TIERS];
  core_get_stats(c, &st);
  core_tier_get_stats(c, ts);
  print_message("swap-outs %llu, swap-ins %llu, failures %llu, blocks out "
                "%llu kept %llu in %llu resident %llu, faults %llu\n",
                (unsigned long long)st.swap_outs,
                (unsigned long long)st.swap_ins,
                (unsigned long long)st.swap_failures,
                (unsigned long long)st.swap_out_blocks,
                (unsigned long long)st.swap_kept_blocks,
                (unsigned long long)st.swap_in_blocks,
                (unsigned long long)st.swap_resident_blocks,
                (unsigned long long)faults);
  assert_true(st.swap_outs > 1000 && st.swap_ins > 1000);
  assert_true(st.swap_failures > 100);
  assert_true(st.swap_kept_blocks > 100 && st.swap_resident_blocks > 100);
  assert_true(st.swap_in_blocks > 1000);
  assert_int_equal(st.used_blocks, 0);
  assert_int_equal(st.swapped_requests, 0);
  assert_int_equal(ts[0].held + ts[1].held, 0);
  core_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_swap_cases),
      cmocka_unit_test(test_swap_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
