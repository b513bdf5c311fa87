/*
 * dispatch.c — a session's ops to the core, their results back
 * (dispatch.h).  One function per op; each checks its arguments and the
 * session's limits, calls the core (and, for the ops that move bytes, the
 * tiers), and fills its result.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/dispatch/dispatch.h"
#include "daemon/log.h"
#include "kvs_status.h"
#include "kvs_utf8.h"

#define SALT_MAX 256

#define ERR(...) kvs_result_error(res, a, __VA_ARGS__)

/* ---- the daemon's copies for a session ------------------------------------ */

/* The slot of src in ds->srcs: where it is, or the empty one it would go
 * in. */
static uint32_t *src_slot(disp_sess *ds, uint32_t src) {
  uint32_t m = ds->srcs_cap - 1, i = (src * 0x9e3779b1u) & m;

  while (ds->srcs[i] != KVS_BLOCK_NONE && ds->srcs[i] != src)
    i = (i + 1) & m;
  return &ds->srcs[i];
}

/* Room in ds->srcs for one more (at most half full). */
static int srcs_room(disp_sess *ds) {
  uint32_t cap = ds->srcs_cap ? 2 * ds->srcs_cap : 16, *old = ds->srcs;
  uint32_t ocap = ds->srcs_cap;

  if (2 * (ds->nsrcs + 1) <= ds->srcs_cap)
    return 0;
  if ((ds->srcs = malloc(sizeof(uint32_t) * cap)) == NULL) {
    ds->srcs = old;
    return KVS_ENOMEM;
  }
  memset(ds->srcs, 0xff, sizeof(uint32_t) * cap); /* KVS_BLOCK_NONE */
  ds->srcs_cap = cap;
  for (uint32_t i = 0; i < ocap; i++)
    if (old[i] != KVS_BLOCK_NONE)
      *src_slot(ds, old[i]) = old[i];
  free(old);
  return 0;
}

/* The ops ask the daemon to copy block src into dst before their reply
 * goes: dst is pinned, and src once for all the pairs that read it (a
 * pin count is 8 bits: 256 forks' appends from one block would overflow
 * it).  0, or a negative status (nothing pinned: the worker must copy
 * itself). */
static int copy_pair(disp_sess *ds, uint32_t src, uint32_t dst) {
  core *cr = ds->env->core;
  uint32_t *slot;
  int rc, fresh;

  if (ds->env->copy->failed) /* the device is lost: the worker copies */
    return ds->env->copy->failed;
  if (ds->ncopy == ds->copy_cap) {
    uint32_t cap = ds->copy_cap ? 2 * ds->copy_cap : 16;
    uint32_t *p = realloc(ds->copy_pairs, 2 * sizeof(uint32_t) * cap);

    if (!p)
      return KVS_ENOMEM;
    ds->copy_pairs = p;
    ds->copy_cap = cap;
  }
  if ((rc = srcs_room(ds)) < 0)
    return rc;
  slot = src_slot(ds, src);
  fresh = *slot == KVS_BLOCK_NONE; /* src not pinned by this frame yet */
  if (fresh && (rc = core_pin(cr, src)) < 0)
    return rc;
  rc = core_pin(cr, dst);
  if (rc < 0) {
    if (fresh)
      core_unpin(cr, src);
    return rc;
  }
  if (fresh) {
    *slot = src;
    ds->nsrcs++;
  }
  ds->copy_pairs[2 * ds->ncopy] = src;
  ds->copy_pairs[2 * ds->ncopy + 1] = dst;
  ds->ncopy++;
  return 0;
}

void disp_copies_done(disp_sess *ds) {
  for (uint32_t i = 0; i < ds->ncopy; i++)
    core_unpin(ds->env->core, ds->copy_pairs[2 * i + 1]);
  for (uint32_t i = 0; ds->nsrcs && i < ds->srcs_cap; i++)
    if (ds->srcs[i] != KVS_BLOCK_NONE) {
      core_unpin(ds->env->core, ds->srcs[i]);
      ds->srcs[i] = KVS_BLOCK_NONE;
      ds->nsrcs--;
    }
  ds->ncopy = 0;
}

/* ---- requests and the session's budget ------------------------------------ */

/* The session's request id; a swapped one only when swapped_ok (other
 * operations wait for its SwapIn). */
static core_req *get_req(disp_sess *ds, uint64_t id, int swapped_ok,
                         kvs_op_result *res, kvs__arena *a) {
  core_req *r = reqmap_get(&ds->reqs, id);

  if (!r) {
    ERR(KVS_ENOENT, "no request %llu in this session (never created, or "
        "already freed)", (unsigned long long)id);
  } else if (!swapped_ok && core_req_swap_state(r) != CORE_SWAP_NONE) {
    ERR(KVS_ESTATE, "request %llu is swapped out: only SwapIn and Free "
        "apply to it", (unsigned long long)id);
    r = NULL;
  }
  return r;
}

static int room_for_request(disp_sess *ds, kvs_op_result *res,
                            kvs__arena *a) {
  if (ds->reqs.count < ds->env->cfg->max_requests)
    return 1;
  ERR(KVS_ELIMIT, "the session already holds %zu requests (max_requests)",
      ds->reqs.count);
  return 0;
}

/*
 * The session's token budget (max_session_tokens): each request is charged
 * the larger of its known tokens and its slots — what the core keeps for it
 * in proportion to its length.  Without it one Lookup of a long prompt and a
 * Batch of Forks (each copying the prompt) made the daemon allocate
 * gigabytes from a few kilobytes of input.
 */
static uint64_t req_cost(const core_req *r) {
  uint32_t k = core_req_num_known(r), s = core_req_num_slots(r);

  return k > s ? k : s;
}

/* Would `more` positions (beyond `released`, given back by the same op) go
 * over the budget?  Answers ELIMIT when so. */
static int over_budget(disp_sess *ds, uint64_t more, uint64_t released,
                       const char *op, uint64_t id, kvs_op_result *res,
                       kvs__arena *a) {
  disp_env *env = ds->env;
  uint64_t max = env->cfg->max_session_tokens;

  if (env->cfg->ntenants &&
      env->tokens_held - released + more > env->max_tokens) {
    ERR(KVS_ELIMIT, "%s of request %llu: tenant %s would hold %llu token "
        "positions, over max_tenant_tokens (%llu); free requests first", op,
        (unsigned long long)id, env->tenant,
        (unsigned long long)(env->tokens_held - released + more),
        (unsigned long long)env->max_tokens);
    return 1;
  }
  if (ds->tokens_held - released + more <= max)
    return 0;
  ERR(KVS_ELIMIT, "%s of request %llu: the session would hold %llu token "
      "positions, over max_session_tokens (%llu); free requests first", op,
      (unsigned long long)id,
      (unsigned long long)(ds->tokens_held - released + more),
      (unsigned long long)max);
  return 1;
}

/* Charges request id (in the map) for what it holds now. */
static void account(disp_sess *ds, uint64_t id, const core_req *r) {
  uint64_t *cost = reqmap_cost(&ds->reqs, id), now = req_cost(r);

  if (!cost)
    return;
  ds->tokens_held = ds->tokens_held - *cost + now;
  ds->env->tokens_held = ds->env->tokens_held - *cost + now;
  *cost = now;
}

/* Blocks [from, n) of r's table, copied into the arena, as res's blocks
 * (none when out of memory: the request stands either way). */
static void table_blocks(core_req *r, uint32_t from, kvs_op_result *res,
                         kvs__arena *a) {
  uint32_t n;
  const uint32_t *t = core_req_blocks(r, &n);
  uint32_t *out;

  res->blocks = NULL;
  res->nblocks = 0;
  if (from >= n || !(out = kvs__arena_alloc(a, (n - from) * sizeof(*out))))
    return;
  memcpy(out, t + from, (n - from) * sizeof(*out));
  res->blocks = out;
  res->nblocks = n - from;
}

static void core_error(kvs_op_result *res, kvs__arena *a, int rc,
                       const char *op, uint64_t id) {
  ERR(rc, "%s of request %llu: %s", op, (unsigned long long)id,
      kvs_strerror(rc));
}

/* ---- Lookup ---------------------------------------------------------------- */

static void lookup_result(disp_sess *ds, uint64_t id, core_req *r,
                          uint32_t hit, uint32_t promoted, uint32_t below,
                          kvs_op_result *res, kvs__arena *a) {
  account(ds, id, r);
  res->status = 0;
  res->u.lookup.hit_tokens = hit;
  res->u.lookup.promoted_tokens = promoted;
  res->u.lookup.below_tokens = below;
  table_blocks(r, 0, res, a);
}

/* On the loop: the held Lookup's chain is over. */
static void on_promoted(tier_promo *pr) {
  disp_sess *ds = pr->data;

  ds->held_cb(ds);
}

static void do_lookup(disp_sess *ds, const kvs_op *op, int batch,
                      kvs_op_result *res, kvs__arena *a) {
  disp_env *env = ds->env;
  core_req *r = reqmap_get(&ds->reqs, op->req_id);
  tier_promo *pr = &ds->promo;
  uint32_t below = 0;
  int created = 0, promote, rc;

  if (op->ntokens == 0) {
    ERR(KVS_EINVAL, "lookup of request %llu needs 1 to 2^32-1 tokens",
        (unsigned long long)op->req_id);
    return;
  }
  if (over_budget(ds, op->ntokens,
                  r ? *reqmap_cost(&ds->reqs, op->req_id) : 0, "lookup",
                  op->req_id, res, a))
    return;
  if (!r) {
    if (op->nbytes > SALT_MAX) {
      ERR(KVS_EINVAL, "salt of %u bytes is longer than %d", op->nbytes,
          SALT_MAX);
      return;
    }
    if (!room_for_request(ds, res, a))
      return;
    rc = core_req_create(env->core, op->bytes, op->nbytes, &r);
    if (rc == 0) {
      rc = reqmap_put(&ds->reqs, op->req_id, r);
      if (rc < 0)
        core_req_free(env->core, r);
    }
    if (rc < 0) {
      core_error(res, a, rc, "lookup", op->req_id);
      return;
    }
    created = 1;
  }
  promote = !batch && !(op->flags & KVS_OPF_NO_PROMOTE) && !env->stopping;
  memset(pr, 0, sizeof(*pr));
  pr->cb = on_promoted;
  pr->data = ds;
  pr->r = r;
  rc = tiers_lookup(env->tiers, env->core, r, op->tokens, op->ntokens,
                    promote, pr, &below);
  if (rc == 1) { /* the blocks are coming up: on_promoted answers */
    ds->held = DISP_HELD_LOOKUP;
    ds->held_code = KVS_OP_LOOKUP;
    ds->held_req = op->req_id;
    return;
  }
  if (rc == KVS_ESTATE) {
    ERR(rc, core_req_swap_state(r) ? "lookup of request %llu: it is swapped "
        "out; SwapIn brings it back"
        : "lookup of request %llu: it already holds blocks; look up a new or "
          "preempted request",
        (unsigned long long)op->req_id);
  } else if (rc < 0) {
    core_error(res, a, rc, "lookup", op->req_id);
  } else {
    lookup_result(ds, op->req_id, r, pr->hit_tokens, pr->promoted_tokens,
                  below, res, a);
    return;
  }
  if (created) {
    reqmap_del(&ds->reqs, op->req_id, NULL);
    core_req_free(env->core, r);
  }
}

/* ---- Allocate, Append, Commit, Fork, Free, Preempt ----------------------- */

static void do_alloc(disp_sess *ds, const kvs_op *op, kvs_op_result *res,
                     kvs__arena *a) {
  const kvs_layout *l = &ds->env->layout;
  int append = op->code == KVS_OP_APPEND;
  const char *name = append ? "append" : "allocate";
  core_req *r = get_req(ds, op->req_id, 0, res, a);
  core_cow cow = {KVS_BLOCK_NONE, KVS_BLOCK_NONE};
  unsigned long long id = (unsigned long long)op->req_id;
  uint32_t n = op->num_tokens, before, after, i;
  const uint32_t *t;
  int rc;

  if (!r)
    return;
  if (n == 0) {
    ERR(KVS_EINVAL, "%s of request %llu: num_tokens is 0", name, id);
    return;
  }
  if ((uint64_t)core_req_num_slots(r) + n >
      (uint64_t)l->num_blocks * l->block_size) {
    ERR(KVS_ERANGE, "%s of request %llu: %u more tokens would exceed the "
        "whole pool (%u blocks of %u tokens)", name, id, n, l->num_blocks,
        l->block_size);
    return;
  }
  if (over_budget(ds, n, 0, name, op->req_id, res, a))
    return;
  core_req_blocks(r, &before);
  rc = append ? core_append(ds->env->core, r, n, &cow)
              : core_allocate(ds->env->core, r, n, &cow);
  if (rc == KVS_ENOSPC) {
    ERR(rc, "%s of request %llu: no space for %u more tokens", name, id, n);
    return;
  }
  if (rc < 0) {
    core_error(res, a, rc, name, op->req_id);
    return;
  }
  account(ds, op->req_id, r);
  res->status = 0;
  res->u.alloc.first_index = before;
  table_blocks(r, before, res, a);
  if (cow.src != KVS_BLOCK_NONE) {
    t = core_req_blocks(r, &after);
    res->u.alloc.has_cow = 1;
    res->u.alloc.cow_src = cow.src;
    res->u.alloc.cow_dst = cow.dst;
    res->u.alloc.cow_index = before ? before - 1 : 0;
    for (i = after; i-- > 0;)
      if (t[i] == cow.dst) {
        res->u.alloc.cow_index = i;
        break;
      }
    /* Asked to, the daemon copies before it replies; when it cannot (out
     * of memory, a destination pinned 255 times) the worker copies as
     * usual. */
    if ((op->flags & KVS_OPF_DAEMON_COPY) &&
        copy_pair(ds, cow.src, cow.dst) == 0)
      res->u.alloc.cow_copied = 1;
  }
}

#define KEY_BYTES_MAX 32u
#define EXTRA_BYTES_MAX 1024u
#define LORA_NAME_MAX 255u

/* A Commit's engine keys: one per block it completes, each well formed;
 * then keys_begin.  -1 with res set when refused. */
static int commit_keys(disp_sess *ds, const kvs_op *op, kvs_op_result *res,
                       kvs__arena *a) {
  const kvs_op_keys *k = op->keys;
  const uint32_t bs = ds->env->layout.block_size;
  unsigned long long id = (unsigned long long)op->req_id;
  uint32_t n = op->ntokens ? op->ntokens : op->num_tokens;
  uint32_t first = op->start / bs, done = (op->start + n) / bs - first;
  char why[200];

  if ((k->nblocks || k->nextra) &&
      (k->nblocks != done || (k->nextra && k->nextra != done))) {
    ERR(KVS_EINVAL, "commit of request %llu: %u engine hashes and %u extra "
        "keys, but positions [%u, %llu) complete %u blocks (one each, or "
        "none)", id, k->nblocks, k->nextra, op->start,
        (unsigned long long)op->start + n, done);
    return -1;
  }
  if ((k->nextra || k->lora_name) && !k->nblocks) {
    ERR(KVS_EINVAL, "commit of request %llu: extra keys or a LoRA name "
        "without engine hashes", id);
    return -1;
  }
  for (uint32_t i = 0; k->hash_bytes && i < k->nblocks; i++)
    if (k->hash_bytes[i].len == 0 || k->hash_bytes[i].len > KEY_BYTES_MAX) {
      ERR(KVS_EINVAL, "commit of request %llu: engine hash %u has %zu bytes "
          "(1 to %u)", id, i, k->hash_bytes[i].len, KEY_BYTES_MAX);
      return -1;
    }
  for (uint32_t i = 0; i < k->nextra; i++)
    if (k->extra[i].len > EXTRA_BYTES_MAX) {
      ERR(KVS_EINVAL, "commit of request %llu: extra keys %u have %zu bytes "
          "(at most %u)", id, i, k->extra[i].len, EXTRA_BYTES_MAX);
      return -1;
    }
  if (k->lora_name && strlen(k->lora_name) > LORA_NAME_MAX) {
    ERR(KVS_EINVAL, "commit of request %llu: a LoRA name of %zu bytes (at "
        "most %u)", id, strlen(k->lora_name), LORA_NAME_MAX);
    return -1;
  }
  if (k->lora_name && !kvs_utf8_valid((const uint8_t *)k->lora_name,
                                      strlen(k->lora_name), 1)) {
    ERR(KVS_EINVAL, "commit of request %llu: the LoRA name is not UTF-8 "
        "text", id);
    return -1;
  }
  if (ds->env->keys_begin &&
      ds->env->keys_begin(ds->env->keys_arg, op, first, why, sizeof(why)) < 0) {
    ERR(KVS_EINVAL, "commit of request %llu: %s", id, why);
    return -1;
  }
  return 0;
}

static void do_commit(disp_sess *ds, const kvs_op *op, kvs_op_result *res,
                      kvs__arena *a) {
  const kvs_layout *l = &ds->env->layout;
  core_req *r = get_req(ds, op->req_id, 0, res, a);
  unsigned long long id = (unsigned long long)op->req_id;
  uint32_t n, sealed = 0, ntable, first, i, start = op->start;
  const uint32_t *table;
  int rc;

  if (!r)
    return;
  n = op->ntokens ? op->ntokens : op->num_tokens;
  if (op->ntokens && op->num_tokens && op->num_tokens != op->ntokens) {
    ERR(KVS_EINVAL, "commit of request %llu: num_tokens %u but %u tokens", id,
        op->num_tokens, op->ntokens);
    return;
  }
  if (n == 0) {
    ERR(KVS_EINVAL, "commit of request %llu: no tokens", id);
    return;
  }
  if ((uint64_t)start + n > core_req_num_slots(r)) {
    ERR(KVS_ERANGE, "commit of request %llu: positions [%u, %llu) were not "
        "allocated to it (it has %u slots)", id, start,
        (unsigned long long)start + n, core_req_num_slots(r));
    return;
  }
  if (start > core_req_num_written(r)) {
    ERR(KVS_ERANGE, "commit of request %llu: start %u leaves a gap after the "
        "%u positions already written", id, start, core_req_num_written(r));
    return;
  }
  if (op->nblocks) {
    uint32_t last = (start + n - 1) / l->block_size;

    first = start / l->block_size;
    table = core_req_blocks(r, &ntable);
    if (op->nblocks != last - first + 1) {
      ERR(KVS_EINVAL, "commit of request %llu names %u blocks; positions "
          "[%u, %u) span %u", id, op->nblocks, start, start + n,
          last - first + 1);
      return;
    }
    for (i = 0; i < op->nblocks; i++) {
      uint32_t b = op->blocks[i];

      if (b >= l->num_blocks) {
        ERR(KVS_ERANGE, "commit of request %llu: block id %u is out of range "
            "(the pool has %u blocks)", id, b, l->num_blocks);
        return;
      }
      if (first + i >= ntable || table[first + i] != b) {
        ERR(KVS_EINVAL, "commit of request %llu: block %u is not the "
            "request's block at table index %u (that is %u): it was not "
            "written by this request", id, b, first + i,
            first + i < ntable ? table[first + i] : KVS_BLOCK_NONE);
        return;
      }
    }
  }
  if (op->keys && commit_keys(ds, op, res, a) < 0)
    return;
  rc = core_commit(ds->env->core, r, start, op->ntokens ? op->tokens : NULL,
                   n, &sealed);
  if (op->keys && ds->env->keys_end)
    ds->env->keys_end(ds->env->keys_arg);
  if (rc == KVS_EMISMATCH) {
    ERR(rc, "commit of request %llu: tokens in [%u, %u) do not match the "
        "tokens the request already holds", id, start, start + n);
    return;
  }
  if (rc == KVS_EINVAL) {
    ERR(rc, "commit of request %llu: tokens missing for positions the "
        "daemon does not know", id);
    return;
  }
  if (rc < 0) {
    core_error(res, a, rc, "commit", op->req_id);
    return;
  }
  account(ds, op->req_id, r);
  res->status = 0;
  res->u.commit.sealed = sealed;
}

static void do_fork(disp_sess *ds, const kvs_op *op, kvs_op_result *res,
                    kvs__arena *a) {
  core_req *r = get_req(ds, op->req_id, 0, res, a), *child;
  int rc;

  if (!r)
    return;
  if (reqmap_get(&ds->reqs, op->child_id)) {
    ERR(KVS_EEXIST, "fork of request %llu: child id %llu is already in use",
        (unsigned long long)op->req_id, (unsigned long long)op->child_id);
    return;
  }
  if (!room_for_request(ds, res, a))
    return;
  if (over_budget(ds, req_cost(r), 0, "fork", op->req_id, res, a))
    return;
  rc = core_fork(ds->env->core, r, &child);
  if (rc == KVS_ESTATE) {
    ERR(rc, "fork of request %llu: it has %u slots but only %u are "
        "committed; commit the rest before forking",
        (unsigned long long)op->req_id, core_req_num_slots(r),
        core_req_num_written(r));
    return;
  }
  if (rc < 0) {
    core_error(res, a, rc, "fork", op->req_id);
    return;
  }
  rc = reqmap_put(&ds->reqs, op->child_id, child);
  if (rc < 0) {
    core_req_free(ds->env->core, child);
    core_error(res, a, rc, "fork", op->req_id);
    return;
  }
  account(ds, op->child_id, child);
  res->status = 0;
}

static void do_free(disp_sess *ds, const kvs_op *op, kvs_op_result *res,
                    kvs__arena *a) {
  uint64_t cost = 0;
  core_req *r = reqmap_del(&ds->reqs, op->req_id, &cost);

  if (!r) {
    ERR(KVS_ENOENT, "free of request %llu: no such request in this session "
        "(never created, or already freed)", (unsigned long long)op->req_id);
    return;
  }
  ds->tokens_held -= cost;
  ds->env->tokens_held -= cost;
  core_req_free(ds->env->core, r);
  res->status = 0;
}

static void do_preempt(disp_sess *ds, const kvs_op *op, kvs_op_result *res,
                       kvs__arena *a) {
  core_req *r = get_req(ds, op->req_id, 0, res, a);
  int rc;

  if (!r)
    return;
  rc = core_preempt(ds->env->core, r);
  if (rc < 0) {
    core_error(res, a, rc, "preempt", op->req_id);
    return;
  }
  account(ds, op->req_id, r);
  res->status = 0;
}

/* ---- SwapOut, SwapIn ------------------------------------------------------- */

static void swap_result(disp_sess *ds, uint64_t id, const tier_swap *sw,
                        kvs_op_result *res, kvs__arena *a) {
  const char *name = sw->in ? "swap-in" : "swap-out";

  if (!sw->r) {
    ERR(KVS_ECLOSED, "%s of request %llu: the session closed while its "
        "blocks moved", name, (unsigned long long)id);
    return;
  }
  account(ds, id, sw->r);
  if (sw->status < 0) {
    ERR(sw->status, "%s of request %llu: a copy below failed (%s); the "
        "request keeps its blocks, as before", name, (unsigned long long)id,
        kvs_strerror(sw->status));
    return;
  }
  res->status = 0;
  res->u.swap.copied_blocks = sw->copied;
  if (sw->in) {
    res->u.swap.tokens = sw->tokens;
    res->u.swap.lost_tokens = sw->before - sw->tokens;
    table_blocks(sw->r, 0, res, a);
  } else {
    res->u.swap.tokens = sw->before;
  }
}

/* On the loop: the held swap's bytes have moved. */
static void on_swapped(tier_swap *sw) {
  disp_sess *ds = sw->data;

  ds->held_cb(ds);
}

static void do_swap(disp_sess *ds, const kvs_op *op, int batch,
                    kvs_op_result *res, kvs__arena *a) {
  disp_env *env = ds->env;
  int in = op->code == KVS_OP_SWAP_IN;
  const char *name = in ? "swap-in" : "swap-out";
  core_req *r = get_req(ds, op->req_id, 1, res, a);
  unsigned long long id = (unsigned long long)op->req_id;
  tier_swap *sw = &ds->swap;
  uint32_t n, nitems = 0;
  void *items;
  int rc;

  if (!r)
    return;
  if (batch) {
    ERR(KVS_ENOTSUP, "%s of request %llu: not inside a Batch (its reply "
        "waits for the copies); send it on its own", name, id);
    return;
  }
  if (!tiers_can_swap(env->tiers)) {
    ERR(KVS_ENOTSUP, "%s of request %llu: the daemon has no tier below the "
        "pool (host_tier_bytes, disk_tier)", name, id);
    return;
  }
  if (env->stopping) {
    ERR(KVS_ECLOSED, "%s of request %llu: the daemon is shutting down", name,
        id);
    return;
  }
  if (in)
    n = core_req_swap_blocks(r);
  else
    core_req_blocks(r, &n);
  items = kvs__arena_alloc(a, (n ? n : 1) * (in ? sizeof(core_promo)
                                                : sizeof(core_move)));
  if (!items) {
    ERR(KVS_ENOMEM, "out of memory");
    return;
  }
  memset(sw, 0, sizeof(*sw));
  sw->cb = on_swapped;
  sw->data = ds;
  sw->r = r;
  sw->in = in;
  if (in) {
    sw->before = core_req_swap_written(r);
    rc = core_swap_in(env->core, r, items, n, &nitems);
  } else {
    sw->before = core_req_num_written(r);
    rc = core_swap_out(env->core, r, items, n, &nitems);
  }
  if (rc == KVS_ESTATE) {
    ERR(rc, "%s of request %llu: it is %s", name, id,
        in ? "not swapped out" : "swapped out already");
    return;
  }
  if (rc == KVS_ENOSPC) {
    ERR(rc, in ? "swap-in of request %llu: not enough free blocks in the "
                 "pool (the reserve kept); try again when some are"
               : "swap-out of request %llu: no room below the pool (the "
                 "tiers are full of swapped requests' blocks)", id);
    return;
  }
  if (rc < 0) {
    core_error(res, a, rc, name, op->req_id);
    return;
  }
  if (nitems > 0) {
    rc = in ? tiers_swap_in(env->tiers, sw, items, nitems)
            : tiers_swap_out(env->tiers, sw, items, nitems);
    if (rc == 0) { /* the bytes are moving: on_swapped answers */
      ds->held = DISP_HELD_SWAP;
      ds->held_code = op->code;
      ds->held_req = op->req_id;
      return;
    }
  }
  if (nitems == 0 || rc < 0) { /* nothing to copy, or nothing started */
    if (in)
      sw->tokens = core_swap_in_finish(env->core, r, items, nitems, NULL);
    else
      sw->status = core_swap_out_finish(env->core, r, items, nitems, NULL);
  }
  swap_result(ds, op->req_id, sw, res, a);
}

/* ---- Stats, Ping ----------------------------------------------------------- */

/* The partitions a session's Stats covers: its own, or every one for an
 * observer. */
static uint32_t stats_scope(disp_env *env, disp_env **one,
                            disp_env *const **parts) {
  if (env->core == NULL) {
    *parts = env->parts;
    return env->nparts;
  }
  one[0] = env;
  *parts = one;
  return 1;
}

/* The partitions' own lines of a Stats (with tenants). */
static kvs_op_tenant *tenant_lines(disp_env *const *parts, uint32_t n,
                                   kvs__arena *a) {
  kvs_op_tenant *t = kvs__arena_alloc(a, n * sizeof(*t));

  if (!t)
    return NULL;
  for (uint32_t i = 0; i < n; i++) {
    const disp_env *p = parts[i];
    core_stats st;

    core_get_stats(p->core, &st);
    memset(&t[i], 0, sizeof(t[i]));
    t[i].name = p->tenant;
    t[i].num_blocks = st.num_blocks;
    t[i].free_blocks = st.free_blocks;
    t[i].cached_blocks = st.cached_blocks;
    t[i].used_blocks = st.used_blocks;
    t[i].num_requests = st.num_requests;
    t[i].sessions = p->own.sessions;
    t[i].lookups = st.lookups;
    t[i].query_tokens = st.query_tokens;
    t[i].hit_tokens = st.hit_tokens;
    t[i].evictions = st.evictions;
    t[i].no_space = st.no_space;
    t[i].pool_bytes = p->pool->ex.size;
  }
  return t;
}

static void do_stats(disp_sess *ds, const kvs_op *op, kvs_op_result *res,
                     kvs__arena *a) {
  disp_env *env = ds->env;
  disp_env *const *parts, *self[1];
  const disp_counts *cnt = env->counts, *traffic = cnt;
  kvs_op_stats *s = kvs__arena_alloc(a, sizeof(*s));
  tiers_stats ts[TIERS_MAX], one[TIERS_MAX];
  kvs_op_tier *ot;
  uint32_t nt = 0, np = stats_scope(env, self, &parts);
  core_stats st;

  if (!s) {
    ERR(KVS_ENOMEM, "out of memory");
    return;
  }
  /* The check walks the whole pool: once per frame, so that a Batch of
   * Stats{check} cannot stall the loop for max_batch_ops walks. */
  if ((op->flags & KVS_OPF_CHECK) && env->check_frame == cnt->frames_in) {
    ERR(KVS_ELIMIT, "one Stats with check per frame; this one did not run");
    return;
  }
  memset(s, 0, sizeof(*s));
  memset(&st, 0, sizeof(st));
  for (uint32_t i = 0; i < np; i++) {
    core_stats x;
    uint32_t n1 = 0;

    core_get_stats(parts[i]->core, &x);
    core_stats_add(&st, &x);
    s->pool_bytes += parts[i]->pool->ex.size;
    s->daemon_copies += parts[i]->copy->jobs;
    s->daemon_copy_blocks += parts[i]->copy->blocks;
    s->copy_errors += parts[i]->copy->errors;
    tiers_get_stats(parts[i]->tiers, one, &n1);
    tiers_stats_add(ts, &nt, one, n1);
  }
  s->num_blocks = st.num_blocks;
  s->free_blocks = st.free_blocks;
  s->cached_blocks = st.cached_blocks;
  s->used_blocks = st.used_blocks;
  s->num_requests = st.num_requests;
  s->lookups = st.lookups;
  s->query_tokens = st.query_tokens;
  s->hit_tokens = st.hit_tokens;
  s->hit_blocks = st.hit_blocks;
  s->miss_blocks = st.miss_blocks;
  s->allocated_blocks = st.allocated_blocks;
  s->evictions = st.evictions;
  s->cow_copies = st.cow_copies;
  s->sealed_blocks = st.sealed_blocks;
  s->no_space = st.no_space;
  s->tier_lost = st.tier_lost;
  s->swapped_requests = st.swapped_requests;
  s->swap_outs = st.swap_outs;
  s->swap_ins = st.swap_ins;
  s->swap_failures = st.swap_failures;
  s->swap_out_blocks = st.swap_out_blocks;
  s->swap_kept_blocks = st.swap_kept_blocks;
  s->swap_in_blocks = st.swap_in_blocks;
  s->swap_resident_blocks = st.swap_resident_blocks;
  s->indexed_blocks = st.indexed_blocks;
  if (env->core != NULL && env->cfg->ntenants)
    traffic = &env->own; /* a tenant's: its own traffic only */
  s->sessions = traffic->sessions;
  s->frames_in = traffic->frames_in;
  s->compact_frames = traffic->compact_frames;
  s->protocol_errors = traffic->protocol_errors;
  s->queued_bytes = traffic->queued_bytes;
  s->backend = env->pool->ex.backend;
  s->gpu_uuid = env->pool->ex.gpu_uuid;
  s->check_message = "";
  s->tenant = env->tenant ? env->tenant : "";
  if (env->cfg->ntenants) {
    s->tenants = tenant_lines(parts, np, a);
    if (!s->tenants) {
      ERR(KVS_ENOMEM, "out of memory");
      return;
    }
    s->ntenants = np;
  }
  if (nt && (ot = kvs__arena_alloc(a, nt * sizeof(*ot)))) {
    for (uint32_t i = 0; i < nt; i++) {
      memset(&ot[i], 0, sizeof(ot[i]));
      ot[i].name = ts[i].name;
      ot[i].capacity_bytes = ts[i].capacity_bytes;
      ot[i].slots = ts[i].core.slots;
      ot[i].used = ts[i].core.used;
      ot[i].held = ts[i].core.held;
      ot[i].demotions = ts[i].core.demotions;
      ot[i].promotions = ts[i].core.promotions;
      ot[i].hit_blocks = ts[i].core.hit_blocks;
      ot[i].drops = ts[i].core.drops;
      ot[i].failures = ts[i].core.failures;
      ot[i].bytes_in = ts[i].bytes_in;
      ot[i].bytes_out = ts[i].bytes_out;
      ot[i].io_errors = ts[i].io_errors;
      ot[i].checksum_failures = ts[i].checksum_failures;
    }
    s->tiers = ot;
    s->ntiers = nt;
  }
  if (op->flags & KVS_OPF_CHECK) {
    char *msg = kvs__arena_alloc(a, 512);

    env->check_frame = cnt->frames_in;
    if (!msg) {
      ERR(KVS_ENOMEM, "out of memory");
      return;
    }
    msg[0] = '\0';
    for (uint32_t i = 0; i < np && s->check == 0; i++) {
      const char *name = parts[i]->tenant ? parts[i]->tenant : "";
      int n = name[0] ? snprintf(msg, 512, "tenant %s: ", name) : 0;

      s->check = core_check(parts[i]->core, msg + n, 512 - (size_t)n);
      if (s->check == 0)
        msg[0] = '\0';
    }
    s->check_message = msg;
    if (s->check < 0)
      log_error(0, "pool invariant check failed: %s", msg);
  }
  res->status = 0;
  res->u.stats = s;
}

/* ---- the ops of a frame ---------------------------------------------------- */

static void run_op(disp_sess *ds, const kvs_op *op, int batch,
                   kvs_op_result *res, kvs__arena *a) {
  if (ds->env->core == NULL && op->code != KVS_OP_NONE &&
      op->code != KVS_OP_STATS && op->code != KVS_OP_PING) {
    ERR(KVS_EPERM, "this session belongs to no tenant: it may only observe "
        "(Stats, Ping)");
    return;
  }
  switch (op->code) {
  case KVS_OP_NONE: /* refused by the codec: its result says why */
    break;
  case KVS_OP_LOOKUP:
    do_lookup(ds, op, batch, res, a);
    break;
  case KVS_OP_ALLOCATE:
  case KVS_OP_APPEND:
    do_alloc(ds, op, res, a);
    break;
  case KVS_OP_COMMIT:
    do_commit(ds, op, res, a);
    break;
  case KVS_OP_FORK:
    do_fork(ds, op, res, a);
    break;
  case KVS_OP_FREE:
    do_free(ds, op, res, a);
    break;
  case KVS_OP_PREEMPT:
    do_preempt(ds, op, res, a);
    break;
  case KVS_OP_SWAP_OUT:
  case KVS_OP_SWAP_IN:
    do_swap(ds, op, batch, res, a);
    break;
  case KVS_OP_STATS:
    do_stats(ds, op, res, a);
    break;
  case KVS_OP_PING:
    res->status = 0;
    res->u.pong.data = op->bytes; /* lives as long as the op */
    res->u.pong.len = op->nbytes;
    break;
  default:
    ERR(KVS_EUNKNOWN, "unknown or empty request op (%u)", (unsigned)op->code);
    break;
  }
}

int disp_run(disp_sess *ds, const kvs_op *ops, kvs_op_result *res,
             uint32_t n, int batch, kvs__arena *a) {
  uint32_t failed = 0;

  for (uint32_t i = 0; i < n; i++) {
    run_op(ds, &ops[i], batch, &res[i], a);
    if (ds->held != DISP_HELD_NONE) /* (never in a batch) */
      return DISP_HELD;
    /* In a batch only the first failures keep their message. */
    if (batch && res[i].status != 0 && ++failed > KVS_BATCH_MESSAGES)
      res[i].message = "";
  }
  return DISP_DONE;
}

void disp_held_result(disp_sess *ds, kvs_op_result *res, kvs__arena *a) {
  tier_promo *pr = &ds->promo;
  disp_held held = ds->held;

  memset(res, 0, sizeof(*res));
  ds->held = DISP_HELD_NONE;
  if (held == DISP_HELD_SWAP) {
    swap_result(ds, ds->held_req, &ds->swap, res, a);
    return;
  }
  if (!pr->r) {
    ERR(KVS_ECLOSED, "lookup of request %llu: the session closed while its "
        "blocks came up", (unsigned long long)ds->held_req);
    return;
  }
  lookup_result(ds, ds->held_req, pr->r, pr->hit_tokens, pr->promoted_tokens,
                0, res, a);
}

/* ---- the session ----------------------------------------------------------- */

void disp_sess_init(disp_sess *ds, disp_env *env,
                    void (*held_cb)(disp_sess *ds), void *owner) {
  memset(ds, 0, sizeof(*ds));
  ds->env = env;
  ds->held_cb = held_cb;
  ds->owner = owner;
  reqmap_init(&ds->reqs);
}

static void free_one(core_req *r, void *arg) { core_req_free(arg, r); }

void disp_sess_free_requests(disp_sess *ds) {
  if (ds->held == DISP_HELD_LOOKUP)
    ds->promo.r = NULL; /* freed below; the promotion ends without it */
  else if (ds->held == DISP_HELD_SWAP)
    ds->swap.r = NULL;
  reqmap_drain(&ds->reqs, free_one, ds->env->core);
  ds->env->tokens_held -= ds->tokens_held;
  ds->tokens_held = 0;
}

void disp_sess_destroy(disp_sess *ds) {
  reqmap_destroy(&ds->reqs);
  free(ds->copy_pairs);
  ds->copy_pairs = NULL;
  ds->ncopy = ds->copy_cap = 0;
  free(ds->srcs);
  ds->srcs = NULL;
  ds->nsrcs = ds->srcs_cap = 0;
}
