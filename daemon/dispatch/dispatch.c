/*
 * dispatch.c — one Request of one session to the core, one Response back.
 *
 * Request ids are looked up in the session's map only, so a session can never
 * name another's request.  Every argument is checked here before the core
 * sees it; the core's own checks (all-or-nothing) come second.  Every error
 * carries a kvs_status code and a message that names what was wrong.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/tiers/remote.h"
#include "daemon/net/server.h"

#define SALT_MAX 256

/* ---- the daemon's copies for a session ------------------------------ */

int disp_copy_pair(sess *c, uint32_t src, uint32_t dst) {
  core *cr = c->srv->core;
  int rc;

  if (c->srv->copy.failed) /* the device is lost: the worker copies */
    return c->srv->copy.failed;
  if (c->ncopy == c->copy_cap) {
    uint32_t cap = c->copy_cap ? 2 * c->copy_cap : 16;
    uint32_t *p = realloc(c->copy_pairs, 2 * sizeof(uint32_t) * cap);

    if (!p)
      return KVS_ENOMEM;
    c->copy_pairs = p;
    c->copy_cap = cap;
  }
  rc = core_pin(cr, src);
  if (rc < 0)
    return rc;
  rc = core_pin(cr, dst);
  if (rc < 0) {
    core_unpin(cr, src);
    return rc;
  }
  c->copy_pairs[2 * c->ncopy] = src;
  c->copy_pairs[2 * c->ncopy + 1] = dst;
  c->ncopy++;
  return 0;
}

void disp_copies_done(sess *c) {
  uint32_t i;

  for (i = 0; i < 2 * c->ncopy; i++)
    core_unpin(c->srv->core, c->copy_pairs[i]);
  c->ncopy = 0;
}

/* ---- the reply, sized once ---------------------------------------- */

/* A static Status for when the arena cannot allocate. */
static Kvshare__Status nomem_status = {
    PROTOBUF_C_MESSAGE_INIT(&kvshare__status__descriptor), KVS_ENOMEM,
    (char *)"out of memory"};

void disp_status(Kvshare__Response *resp, kvs__arena *a, int code,
                 const char *fmt, ...) {
  Kvshare__Status *st = kvs__arena_alloc(a, sizeof(*st));
  char *msg = kvs__arena_alloc(a, 256);
  va_list ap;

  if (!st || !msg) {
    resp->status = &nomem_status;
    return;
  }
  kvshare__status__init(st);
  st->code = code;
  va_start(ap, fmt);
  vsnprintf(msg, 256, fmt, ap);
  va_end(ap);
  st->message = msg;
  resp->status = st;
}

/* nomem_status without its message, for a Batch's later failures. */
static Kvshare__Status nomem_bare = {
    PROTOBUF_C_MESSAGE_INIT(&kvshare__status__descriptor), KVS_ENOMEM,
    (char *)""};

void disp_batch_trim(Kvshare__Response *r, size_t *failed) {
  if (!r->status || r->status->code == 0 || ++*failed <= DISP_BATCH_MESSAGES)
    return;
  if (r->status == &nomem_status)
    r->status = &nomem_bare;
  else
    r->status->message = (char *)""; /* the code alone */
}

/* Every OK reply points at this one (packing only reads it). */
static Kvshare__Status ok_status = KVSHARE__STATUS__INIT;

void disp_ok(Kvshare__Response *resp) { resp->status = &ok_status; }

static void ok(Kvshare__Response *resp, kvs__arena *a) {
  (void)a;
  disp_ok(resp);
}

#define ERR(...) (disp_status(resp, a, __VA_ARGS__))

/* The session's request id; a swapped one only when swapped_ok (other
 * operations wait for its SwapIn). */
static core_req *get_req(sess *c, uint64_t id, int swapped_ok,
                         Kvshare__Response *resp, kvs__arena *a) {
  core_req *r = reqmap_get(&c->reqs, id);

  if (!r) {
    ERR(KVS_ENOENT, "no request %llu in this session (never created, or "
                    "already freed)",
        (unsigned long long)id);
  } else if (!swapped_ok && core_req_swap_state(r) != CORE_SWAP_NONE) {
    ERR(KVS_ESTATE, "request %llu is swapped out: only SwapIn and Free "
        "apply to it", (unsigned long long)id);
    r = NULL;
  }
  return r;
}

static int room_for_request(sess *c, Kvshare__Response *resp,
                            kvs__arena *a) {
  if (c->reqs.count < c->srv->cfg->max_requests)
    return 1;
  ERR(KVS_ELIMIT, "the session already holds %zu requests (max_requests)",
      c->reqs.count);
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
static int over_budget(sess *c, uint64_t more, uint64_t released,
                       const char *op, uint64_t id, Kvshare__Response *resp,
                       kvs__arena *a) {
  uint64_t max = c->srv->cfg->max_session_tokens;

  if (c->tokens_held - released + more <= max)
    return 0;
  ERR(KVS_ELIMIT, "%s of request %llu: the session would hold %llu token "
                  "positions, over max_session_tokens (%llu); free requests "
                  "first",
      op, (unsigned long long)id,
      (unsigned long long)(c->tokens_held - released + more),
      (unsigned long long)max);
  return 1;
}

/* Charges request id (in the map) for what it holds now. */
static void account(sess *c, uint64_t id, const core_req *r) {
  uint64_t *cost = reqmap_cost(&c->reqs, id), now = req_cost(r);

  if (!cost)
    return;
  c->tokens_held = c->tokens_held - *cost + now;
  *cost = now;
}

/* Copies blocks [from, n) of r's table into the arena. */
static uint32_t *copy_table(core_req *r, uint32_t from, size_t *count,
                            kvs__arena *a) {
  uint32_t n;
  const uint32_t *t = core_req_blocks(r, &n);
  uint32_t *out;

  *count = 0;
  if (from >= n)
    return NULL;
  out = kvs__arena_alloc(a, (n - from) * sizeof(*out));
  if (!out)
    return NULL;
  memcpy(out, t + from, (n - from) * sizeof(*out));
  *count = n - from;
  return out;
}

static void core_error(Kvshare__Response *resp, kvs__arena *a, int rc,
                       const char *op, uint64_t id) {
  ERR(rc, "%s of request %llu: %s", op, (unsigned long long)id,
      kvs_strerror(rc));
}

static void lookup_reply(sess *c, uint64_t id, core_req *r, uint32_t hit,
                         uint32_t promoted, uint32_t below,
                         Kvshare__Response *resp, kvs__arena *a) {
  Kvshare__LookupResult *res;

  account(c, id, r);
  res = kvs__arena_alloc(a, sizeof(*res));
  if (!res) {
    ERR(KVS_ENOMEM, "out of memory");
    return; /* the request stands; the client may look at Stats */
  }
  kvshare__lookup_result__init(res);
  res->hit_tokens = hit;
  res->promoted_tokens = promoted;
  res->below_tokens = below;
  res->blocks = copy_table(r, 0, &res->n_blocks, a);
  resp->result_case = KVSHARE__RESPONSE__RESULT_LOOKUP;
  resp->lookup = res;
  ok(resp, a);
}

void disp_lookup_promoted(sess *c, Kvshare__Response *resp, kvs__arena *a) {
  tier_promo *pr = &c->promo;

  if (!pr->r) {
    ERR(KVS_ECLOSED, "lookup of request %llu: the session closed while its "
        "blocks came up", (unsigned long long)pr->req_id);
    return;
  }
  lookup_reply(c, pr->req_id, pr->r, pr->hit_tokens, pr->promoted_tokens, 0,
               resp, a);
}

/* The store below every tier: the rest of the chain, once the Lookup's
 * other promotions are done.  0: started (sess_promoted sends the reply
 * later). */
static int lookup_remote(sess *c, tier_promo *pr) {
  srv *s = c->srv;

  if (!s->remote || !pr->r || s->stopping)
    return 1;
  return rmoves_promote(s->remote, pr, sess_promoted);
}

/* The Lookup's promotions from the tiers are done: on to the remote tier,
 * else the reply. */
static void lookup_tiers_done(tier_promo *pr) {
  if (lookup_remote(pr->data, pr) != 0)
    sess_promoted(pr);
}

static void do_lookup(sess *c, const Kvshare__Lookup *l,
                      Kvshare__Response *resp, kvs__arena *a) {
  core *cr = c->srv->core;
  core_req *r = reqmap_get(&c->reqs, l->req_id);
  core_lookup_out out;
  uint32_t hit = 0, promoted = 0, below = 0;
  int created = 0, rc;

  if (l->n_tokens == 0 || l->n_tokens > UINT32_MAX) {
    ERR(KVS_EINVAL, "lookup of request %llu needs 1 to 2^32-1 tokens",
        (unsigned long long)l->req_id);
    return;
  }
  if (over_budget(c, l->n_tokens, r ? *reqmap_cost(&c->reqs, l->req_id) : 0,
                  "lookup", l->req_id, resp, a))
    return;
  if (!r) {
    if (l->salt.len > SALT_MAX) {
      ERR(KVS_EINVAL, "salt of %zu bytes is longer than %d", l->salt.len,
          SALT_MAX);
      return;
    }
    if (!room_for_request(c, resp, a))
      return;
    rc = core_req_create(cr, l->salt.data, l->salt.len, &r);
    if (rc < 0) {
      core_error(resp, a, rc, "create", l->req_id);
      return;
    }
    created = 1;
  }
  {
    srv *s = c->srv;
    int promote = (s->tiers || s->remote) && !c->in_batch &&
                  !l->no_promote && !s->stopping;
    uint32_t room = promote && s->tiers ? tiers_promote_room(s->tiers) : 0;
    tier_promo *pr = &c->promo;
    core_promo *promos = room ? kvs__arena_alloc(a, room * sizeof(*promos))
                              : NULL;

    rc = core_lookup_promote(cr, r, l->tokens, (uint32_t)l->n_tokens,
                             promos != NULL, promos, room, &out);
    hit = out.hit_tokens;
    if (rc == 0 && promote) {
      memset(pr, 0, sizeof(*pr));
      pr->cb = lookup_tiers_done;
      pr->data = c;
      pr->r = r;
      pr->req_id = l->req_id;
    }
    if (rc == 0 && out.npromos) {
      int st = tiers_promote(s->tiers, pr, promos, out.npromos);
      if (st < 0) { /* nothing started: every promotion failed */
        hit = core_promote_finish(cr, r, promos, out.npromos, NULL);
      } else if (st == 1) {
        hit = pr->hit_tokens;
        promoted = pr->promoted_tokens;
      } else {
        c->promoting = 1; /* the reply waits: handle_request sees it */
      }
    }
    below = (out.tier_blocks[0] + out.tier_blocks[1]) *
            c->srv->layout.block_size;
    if (out.npromos)
      below = 0;
    if (rc == 0 && promote && !c->promoting) {
      pr->hit_tokens = hit;
      pr->promoted_tokens = promoted;
      if (lookup_remote(c, pr) == 0)
        c->promoting = 1; /* the reply waits for the remote tier */
    }
  }
  if (rc == KVS_ESTATE) {
    ERR(rc, core_req_swap_state(r) ? "lookup of request %llu: it is swapped "
            "out; SwapIn brings it back"
            : "lookup of request %llu: it already holds blocks; look up a "
              "new or preempted request",
        (unsigned long long)l->req_id);
    goto fail;
  }
  if (rc < 0) {
    core_error(resp, a, rc, "lookup", l->req_id);
    goto fail;
  }
  if (created) {
    rc = reqmap_put(&c->reqs, l->req_id, r);
    if (rc < 0) {
      core_error(resp, a, rc, "lookup", l->req_id);
      goto fail;
    }
  }
  if (c->promoting)
    return; /* the reply is built when the blocks are up */
  lookup_reply(c, l->req_id, r, hit, promoted, below, resp, a);
  return;
fail:
  if (created) {
    if (c->promoting)
      c->promo.r = NULL; /* its promotion ends with no request */
    core_req_free(cr, r);
  }
}

static void do_alloc(sess *c, uint64_t id, uint32_t n, int append,
                     int daemon_copy, Kvshare__Response *resp,
                     kvs__arena *a) {
  const kvs_layout *l = &c->srv->layout;
  core_req *r = get_req(c, id, 0, resp, a);
  const char *op = append ? "append" : "allocate";
  Kvshare__AllocResult *res;
  core_cow cow = {KVS_BLOCK_NONE, KVS_BLOCK_NONE};
  uint32_t before, after, i;
  const uint32_t *t;
  int rc;

  if (!r)
    return;
  if (n == 0) {
    ERR(KVS_EINVAL, "%s of request %llu: num_tokens is 0", op,
        (unsigned long long)id);
    return;
  }
  if ((uint64_t)core_req_num_slots(r) + n >
      (uint64_t)l->num_blocks * l->block_size) {
    ERR(KVS_ERANGE, "%s of request %llu: %u more tokens would exceed the "
                    "whole pool (%u blocks of %u tokens)",
        op, (unsigned long long)id, n, l->num_blocks, l->block_size);
    return;
  }
  if (over_budget(c, n, 0, op, id, resp, a))
    return;
  core_req_blocks(r, &before);
  rc = append ? core_append(c->srv->core, r, n, &cow)
              : core_allocate(c->srv->core, r, n, &cow);
  if (rc == KVS_ENOSPC) {
    ERR(rc, "%s of request %llu: no space for %u more tokens", op,
        (unsigned long long)id, n);
    return;
  }
  if (rc < 0) {
    core_error(resp, a, rc, op, id);
    return;
  }
  account(c, id, r);
  res = kvs__arena_alloc(a, sizeof(*res));
  if (!res) {
    ERR(KVS_ENOMEM, "out of memory");
    return;
  }
  kvshare__alloc_result__init(res);
  res->first_index = before;
  res->blocks = copy_table(r, before, &res->n_blocks, a);
  if (cow.src != KVS_BLOCK_NONE) {
    t = core_req_blocks(r, &after);
    res->has_cow = 1;
    res->cow_src = cow.src;
    res->cow_dst = cow.dst;
    res->cow_index = before ? before - 1 : 0;
    for (i = after; i-- > 0;)
      if (t[i] == cow.dst) {
        res->cow_index = i;
        break;
      }
    /* Asked to, the daemon copies before it replies; when it cannot (out
     * of memory, a block pinned 255 times) the worker copies as usual. */
    if (daemon_copy && disp_copy_pair(c, cow.src, cow.dst) == 0)
      res->cow_copied = 1;
  }
  resp->result_case = KVSHARE__RESPONSE__RESULT_ALLOC;
  resp->alloc = res;
  ok(resp, a);
}

static void do_commit(sess *c, const Kvshare__Commit *m,
                      Kvshare__Response *resp, kvs__arena *a) {
  const kvs_layout *l = &c->srv->layout;
  core_req *r = get_req(c, m->req_id, 0, resp, a);
  unsigned long long id = (unsigned long long)m->req_id;
  Kvshare__CommitResult *res;
  uint32_t n, sealed = 0, ntable, first, i;
  const uint32_t *table;
  int rc;

  if (!r)
    return;
  if (m->n_tokens > UINT32_MAX) {
    ERR(KVS_EINVAL, "commit of request %llu: too many tokens", id);
    return;
  }
  n = m->n_tokens ? (uint32_t)m->n_tokens : m->num_tokens;
  if (m->n_tokens && m->num_tokens && m->num_tokens != m->n_tokens) {
    ERR(KVS_EINVAL, "commit of request %llu: num_tokens %u but %zu tokens", id,
        m->num_tokens, m->n_tokens);
    return;
  }
  if (n == 0) {
    ERR(KVS_EINVAL, "commit of request %llu: no tokens", id);
    return;
  }
  if ((uint64_t)m->start + n > core_req_num_slots(r)) {
    ERR(KVS_ERANGE, "commit of request %llu: positions [%u, %llu) were not "
                    "allocated to it (it has %u slots)",
        id, m->start, (unsigned long long)m->start + n, core_req_num_slots(r));
    return;
  }
  if (m->start > core_req_num_written(r)) {
    ERR(KVS_ERANGE, "commit of request %llu: start %u leaves a gap after the "
                    "%u positions already written",
        id, m->start, core_req_num_written(r));
    return;
  }
  if (m->n_blocks) {
    uint32_t last = (m->start + n - 1) / l->block_size;

    first = m->start / l->block_size;
    table = core_req_blocks(r, &ntable);
    if (m->n_blocks != (size_t)(last - first + 1)) {
      ERR(KVS_EINVAL, "commit of request %llu names %zu blocks; positions "
                      "[%u, %u) span %u",
          id, m->n_blocks, m->start, m->start + n, last - first + 1);
      return;
    }
    for (i = 0; i < m->n_blocks; i++) {
      uint32_t b = m->blocks[i];

      if (b >= l->num_blocks) {
        ERR(KVS_ERANGE, "commit of request %llu: block id %u is out of range "
                        "(the pool has %u blocks)",
            id, b, l->num_blocks);
        return;
      }
      if (first + i >= ntable || table[first + i] != b) {
        ERR(KVS_EINVAL, "commit of request %llu: block %u is not the "
                        "request's block at table index %u (that is %u): it "
                        "was not written by this request",
            id, b, first + i,
            first + i < ntable ? table[first + i] : KVS_BLOCK_NONE);
        return;
      }
    }
  }
  rc = core_commit(c->srv->core, r, m->start, m->n_tokens ? m->tokens : NULL,
                   n, &sealed);
  if (rc == KVS_EMISMATCH) {
    ERR(rc, "commit of request %llu: tokens in [%u, %u) do not match the "
            "tokens the request already holds",
        id, m->start, m->start + n);
    return;
  }
  if (rc == KVS_EINVAL) {
    ERR(rc, "commit of request %llu: tokens missing for positions the "
            "daemon does not know",
        id);
    return;
  }
  if (rc < 0) {
    core_error(resp, a, rc, "commit", m->req_id);
    return;
  }
  account(c, m->req_id, r);
  res = kvs__arena_alloc(a, sizeof(*res));
  if (!res) {
    ERR(KVS_ENOMEM, "out of memory");
    return;
  }
  kvshare__commit_result__init(res);
  res->sealed = sealed;
  resp->result_case = KVSHARE__RESPONSE__RESULT_COMMIT;
  resp->commit = res;
  ok(resp, a);
}

static void do_fork(sess *c, const Kvshare__Fork *f, Kvshare__Response *resp,
                    kvs__arena *a) {
  core_req *r = get_req(c, f->req_id, 0, resp, a), *child;
  int rc;

  if (!r)
    return;
  if (reqmap_get(&c->reqs, f->child_id)) {
    ERR(KVS_EEXIST, "fork of request %llu: child id %llu is already in use",
        (unsigned long long)f->req_id, (unsigned long long)f->child_id);
    return;
  }
  if (!room_for_request(c, resp, a))
    return;
  if (over_budget(c, req_cost(r), 0, "fork", f->req_id, resp, a))
    return;
  rc = core_fork(c->srv->core, r, &child);
  if (rc == KVS_ESTATE) {
    ERR(rc, "fork of request %llu: it has %u slots but only %u are "
            "committed; commit the rest before forking",
        (unsigned long long)f->req_id, core_req_num_slots(r),
        core_req_num_written(r));
    return;
  }
  if (rc < 0) {
    core_error(resp, a, rc, "fork", f->req_id);
    return;
  }
  rc = reqmap_put(&c->reqs, f->child_id, child);
  if (rc < 0) {
    core_req_free(c->srv->core, child);
    core_error(resp, a, rc, "fork", f->req_id);
    return;
  }
  account(c, f->child_id, child);
  ok(resp, a);
}

static void do_free(sess *c, uint64_t id, Kvshare__Response *resp,
                    kvs__arena *a) {
  uint64_t cost = 0;
  core_req *r = reqmap_del(&c->reqs, id, &cost);

  if (!r) {
    ERR(KVS_ENOENT, "free of request %llu: no such request in this session "
                    "(never created, or already freed)",
        (unsigned long long)id);
    return;
  }
  c->tokens_held -= cost;
  core_req_free(c->srv->core, r);
  ok(resp, a);
}

static void do_preempt(sess *c, uint64_t id, Kvshare__Response *resp,
                       kvs__arena *a) {
  core_req *r = get_req(c, id, 0, resp, a);
  int rc;

  if (!r)
    return;
  rc = core_preempt(c->srv->core, r);
  if (rc < 0) {
    core_error(resp, a, rc, "preempt", id);
    return;
  }
  account(c, id, r);
  ok(resp, a);
}

/* ---- swap ------------------------------------------------------------------ */

static void swap_reply(sess *c, const tier_swap *sw, Kvshare__Response *resp,
                       kvs__arena *a) {
  const char *op = sw->in ? "swap-in" : "swap-out";
  Kvshare__SwapResult *res;

  if (!sw->r) {
    ERR(KVS_ECLOSED, "%s of request %llu: the session closed while its "
        "blocks moved", op, (unsigned long long)sw->req_id);
    return;
  }
  account(c, sw->req_id, sw->r);
  if (sw->status < 0) {
    ERR(sw->status, "%s of request %llu: a copy below failed (%s); the "
        "request keeps its blocks, as before", op,
        (unsigned long long)sw->req_id, kvs_strerror(sw->status));
    return;
  }
  res = kvs__arena_alloc(a, sizeof(*res));
  if (!res) {
    ERR(KVS_ENOMEM, "out of memory");
    return;
  }
  kvshare__swap_result__init(res);
  res->copied_blocks = sw->copied;
  if (sw->in) {
    res->tokens = sw->tokens;
    res->lost_tokens = sw->before - sw->tokens;
    res->blocks = copy_table(sw->r, 0, &res->n_blocks, a);
  } else {
    res->tokens = sw->before;
  }
  resp->result_case = KVSHARE__RESPONSE__RESULT_SWAP;
  resp->swap = res;
  ok(resp, a);
}

void disp_swap_done(sess *c, Kvshare__Response *resp, kvs__arena *a) {
  swap_reply(c, &c->swap, resp, a);
}

static void do_swap(sess *c, uint64_t id, int in, Kvshare__Response *resp,
                    kvs__arena *a) {
  srv *s = c->srv;
  core *cr = s->core;
  const char *op = in ? "swap-in" : "swap-out";
  core_req *r = get_req(c, id, 1, resp, a);
  tier_swap *sw = &c->swap;
  uint32_t n, nitems = 0;
  void *items;
  int rc;

  if (!r)
    return;
  if (c->in_batch) {
    ERR(KVS_ENOTSUP, "%s of request %llu: not inside a Batch (its reply "
        "waits for the copies); send it on its own", op,
        (unsigned long long)id);
    return;
  }
  if (!s->tiers) {
    ERR(KVS_ENOTSUP, "%s of request %llu: the daemon has no tier below the "
        "pool (host_tier_bytes, disk_tier)", op, (unsigned long long)id);
    return;
  }
  if (s->stopping) {
    ERR(KVS_ECLOSED, "%s of request %llu: the daemon is shutting down", op,
        (unsigned long long)id);
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
  sw->cb = sess_swapped;
  sw->data = c;
  sw->r = r;
  sw->req_id = id;
  sw->in = in;
  if (in) {
    sw->before = core_req_swap_written(r);
    rc = core_swap_in(cr, r, items, n, &nitems);
  } else {
    sw->before = core_req_num_written(r);
    rc = core_swap_out(cr, r, items, n, &nitems);
  }
  if (rc == KVS_ESTATE) {
    ERR(rc, "%s of request %llu: it is %s", op, (unsigned long long)id,
        in ? "not swapped out" : "swapped out already");
    return;
  }
  if (rc == KVS_ENOSPC) {
    ERR(rc, in ? "swap-in of request %llu: not enough free blocks in the "
                 "pool (the reserve kept); try again when some are"
               : "swap-out of request %llu: no room below the pool (the "
                 "tiers are full of swapped requests' blocks)",
        (unsigned long long)id);
    return;
  }
  if (rc < 0) {
    core_error(resp, a, rc, op, id);
    return;
  }
  if (nitems > 0) {
    rc = in ? tiers_swap_in(s->tiers, sw, items, nitems)
            : tiers_swap_out(s->tiers, sw, items, nitems);
    if (rc == 0) {
      c->swapping = 1; /* the reply waits: handle_request sees it */
      return;
    }
  }
  if (nitems == 0 || rc < 0) { /* nothing to copy, or nothing started */
    if (in)
      sw->tokens = core_swap_in_finish(cr, r, items, nitems, NULL);
    else
      sw->status = core_swap_out_finish(cr, r, items, nitems, NULL);
  }
  swap_reply(c, sw, resp, a);
}

static void do_stats(sess *c, const Kvshare__Stats *q, Kvshare__Response *resp,
                     kvs__arena *a) {
  srv *s = c->srv;
  Kvshare__StatsResult *res = kvs__arena_alloc(a, sizeof(*res));
  core_stats st;

  if (!res) {
    ERR(KVS_ENOMEM, "out of memory");
    return;
  }
  /* The check walks the whole pool: once per frame, so that a Batch of
   * Stats{check} cannot stall the loop for max_batch_ops walks. */
  if (q->check && s->check_frame == s->frames_in) {
    ERR(KVS_ELIMIT, "one Stats with check per frame; this one did not run");
    return;
  }
  core_get_stats(s->core, &st);
  kvshare__stats_result__init(res);
  res->num_blocks = st.num_blocks;
  res->free_blocks = st.free_blocks;
  res->cached_blocks = st.cached_blocks;
  res->used_blocks = st.used_blocks;
  res->num_requests = st.num_requests;
  res->lookups = st.lookups;
  res->query_tokens = st.query_tokens;
  res->hit_tokens = st.hit_tokens;
  res->hit_blocks = st.hit_blocks;
  res->miss_blocks = st.miss_blocks;
  res->allocated_blocks = st.allocated_blocks;
  res->evictions = st.evictions;
  res->cow_copies = st.cow_copies;
  res->sealed_blocks = st.sealed_blocks;
  res->no_space = st.no_space;
  res->sessions = s->nsessions;
  res->frames_in = s->frames_in;
  res->compact_frames = s->compact_frames;
  res->protocol_errors = s->protocol_errors;
  res->queued_bytes = s->queued;
  res->backend = (char *)s->pool->ex.backend;
  res->gpu_uuid = (char *)s->pool->ex.gpu_uuid;
  res->pool_bytes = s->pool->ex.size;
  res->daemon_copies = s->copy.jobs;
  res->daemon_copy_blocks = s->copy.blocks;
  res->copy_errors = s->copy.errors;
  res->tier_lost = st.tier_lost;
  res->swapped_requests = st.swapped_requests;
  res->swap_outs = st.swap_outs;
  res->swap_ins = st.swap_ins;
  res->swap_failures = st.swap_failures;
  res->swap_out_blocks = st.swap_out_blocks;
  res->swap_kept_blocks = st.swap_kept_blocks;
  res->swap_in_blocks = st.swap_in_blocks;
  res->swap_resident_blocks = st.swap_resident_blocks;
  res->indexed_blocks = st.indexed_blocks;
  {
    tiers_stats ts[SRV_TIERS];
    uint32_t nt = 0;

    srv_tiers_stats(s, ts, &nt);
    Kvshare__TierStats *ms = nt ? kvs__arena_alloc(a, nt * sizeof(*ms)) : NULL;
    Kvshare__TierStats **mp = nt ? kvs__arena_alloc(a, nt * sizeof(*mp)) : NULL;
    if (nt && ms && mp) {
      for (uint32_t i = 0; i < nt; i++) {
        kvshare__tier_stats__init(&ms[i]);
        ms[i].name = (char *)ts[i].name;
        ms[i].capacity_bytes = ts[i].capacity_bytes;
        ms[i].slots = ts[i].core.slots;
        ms[i].used = ts[i].core.used;
        ms[i].demotions = ts[i].core.demotions;
        ms[i].promotions = ts[i].core.promotions;
        ms[i].hit_blocks = ts[i].core.hit_blocks;
        ms[i].drops = ts[i].core.drops;
        ms[i].failures = ts[i].core.failures;
        ms[i].bytes_in = ts[i].bytes_in;
        ms[i].bytes_out = ts[i].bytes_out;
        ms[i].io_errors = ts[i].io_errors;
        ms[i].checksum_failures = ts[i].checksum_failures;
        ms[i].held = ts[i].core.held;
        mp[i] = &ms[i];
      }
      res->n_tiers = nt;
      res->tiers = mp;
    }
  }
  if (q->check) {
    char *msg = kvs__arena_alloc(a, 512);

    s->check_frame = s->frames_in;

    if (!msg) {
      ERR(KVS_ENOMEM, "out of memory");
      return;
    }
    msg[0] = '\0';
    res->check = core_check(s->core, msg, 512);
    res->check_message = msg;
    if (res->check < 0)
      log_error(0, "pool invariant check failed: %s", msg);
  }
  resp->result_case = KVSHARE__RESPONSE__RESULT_STATS;
  resp->stats = res;
  ok(resp, a);
}

static void do_batch(sess *c, const Kvshare__Batch *b, Kvshare__Response *resp,
                     kvs__arena *a) {
  Kvshare__BatchResult *res = kvs__arena_alloc(a, sizeof(*res));
  Kvshare__Response **replies = NULL;
  size_t i, failed = 0;

  if (b->n_ops > c->srv->cfg->max_batch_ops) {
    ERR(KVS_ELIMIT, "batch of %zu ops is over max_batch_ops (%u); none ran",
        b->n_ops, c->srv->cfg->max_batch_ops);
    return;
  }
  if (b->n_ops)
    replies = kvs__arena_alloc(a, b->n_ops * sizeof(*replies));
  if (!res || (b->n_ops && !replies)) {
    ERR(KVS_ENOMEM, "out of memory");
    return;
  }
  kvshare__batch_result__init(res);
  c->in_batch = 1;
  for (i = 0; i < b->n_ops; i++) {
    Kvshare__Response *r = kvs__arena_alloc(a, sizeof(*r));

    if (!r) {
      c->in_batch = 0;
      ERR(KVS_ENOMEM, "out of memory after %zu of %zu ops", i, b->n_ops);
      return;
    }
    kvshare__response__init(r);
    if (b->ops[i]->op_case == KVSHARE__REQUEST__OP_BATCH)
      disp_status(r, a, KVS_EINVAL, "op %zu: a batch inside a batch", i);
    else
      disp_request(c, b->ops[i], r, a);
    disp_batch_trim(r, &failed);
    replies[i] = r;
  }
  c->in_batch = 0;
  res->n_replies = b->n_ops;
  res->replies = replies;
  resp->result_case = KVSHARE__RESPONSE__RESULT_BATCH;
  resp->batch = res;
  ok(resp, a);
}

void disp_request(sess *c, const Kvshare__Request *req,
                  Kvshare__Response *resp, kvs__arena *a) {
  switch (req->op_case) {
  case KVSHARE__REQUEST__OP_LOOKUP:
    do_lookup(c, req->lookup, resp, a);
    break;
  case KVSHARE__REQUEST__OP_ALLOCATE:
    do_alloc(c, req->allocate->req_id, req->allocate->num_tokens, 0,
             req->allocate->daemon_copy, resp, a);
    break;
  case KVSHARE__REQUEST__OP_APPEND:
    do_alloc(c, req->append->req_id, req->append->num_tokens, 1,
             req->append->daemon_copy, resp, a);
    break;
  case KVSHARE__REQUEST__OP_COMMIT:
    do_commit(c, req->commit, resp, a);
    break;
  case KVSHARE__REQUEST__OP_FORK:
    do_fork(c, req->fork, resp, a);
    break;
  case KVSHARE__REQUEST__OP_FREE:
    do_free(c, req->free->req_id, resp, a);
    break;
  case KVSHARE__REQUEST__OP_PREEMPT:
    do_preempt(c, req->preempt->req_id, resp, a);
    break;
  case KVSHARE__REQUEST__OP_STATS:
    do_stats(c, req->stats, resp, a);
    break;
  case KVSHARE__REQUEST__OP_BATCH:
    do_batch(c, req->batch, resp, a);
    break;
  case KVSHARE__REQUEST__OP_PACKED_BATCH:
    if (c->in_batch)
      ERR(KVS_EINVAL, "a packed batch inside a batch");
    else
      disp_packed_batch(c, req->packed_batch, resp, a);
    break;
  case KVSHARE__REQUEST__OP_SWAP_OUT:
    do_swap(c, req->swap_out->req_id, 0, resp, a);
    break;
  case KVSHARE__REQUEST__OP_SWAP_IN:
    do_swap(c, req->swap_in->req_id, 1, resp, a);
    break;
  case KVSHARE__REQUEST__OP_PING:
    resp->result_case = KVSHARE__RESPONSE__RESULT_PONG;
    resp->pong = req->ping->payload; /* lives as long as the request */
    ok(resp, a);
    break;
  default:
    ERR(KVS_EUNKNOWN, "unknown or empty request op (%d)", (int)req->op_case);
    break;
  }
}
