/*
 * ops.c — libkvshare: one call per protocol operation, one round trip each.
 */
#include <stddef.h>
#include <string.h>

#include "client/client_int.h"
#include "client/ops_int.h"

/* Never NULL, even for no blocks (so callers may memcpy from it). */
static const uint32_t no_blocks[1] = {KVS_BLOCK_NONE};

/* A successful op that produced nothing may come back with no result: read
 * that as an empty one. */
int kvs__lookup_result(const Kvshare__Response *r, kvs_lookup_result *res) {
  if (r->result_case == KVSHARE__RESPONSE__RESULT__NOT_SET) {
    if (res) {
      memset(res, 0, sizeof *res);
      res->blocks = no_blocks;
    }
    return 0;
  }
  if (r->result_case != KVSHARE__RESPONSE__RESULT_LOOKUP || !r->lookup)
    return KVS_EPROTO;
  if (res) {
    res->hit_tokens = r->lookup->hit_tokens;
    res->num_blocks = (uint32_t)r->lookup->n_blocks;
    res->blocks = res->num_blocks ? r->lookup->blocks : no_blocks;
  }
  return 0;
}

int kvs__alloc_result(const Kvshare__Response *r, kvs_alloc_result *res) {
  if (r->result_case == KVSHARE__RESPONSE__RESULT__NOT_SET) {
    if (res) {
      memset(res, 0, sizeof *res);
      res->blocks = no_blocks;
      res->cow_src = res->cow_dst = KVS_BLOCK_NONE;
    }
    return 0;
  }
  if (r->result_case != KVSHARE__RESPONSE__RESULT_ALLOC || !r->alloc)
    return KVS_EPROTO;
  if (res) {
    const Kvshare__AllocResult *a = r->alloc;
    res->first_index = a->first_index;
    res->num_blocks = (uint32_t)a->n_blocks;
    res->blocks = res->num_blocks ? a->blocks : no_blocks;
    res->has_cow = a->has_cow ? (a->cow_copied ? 2 : 1) : 0;
    res->cow_src = a->has_cow ? a->cow_src : KVS_BLOCK_NONE;
    res->cow_dst = a->has_cow ? a->cow_dst : KVS_BLOCK_NONE;
    res->cow_index = a->cow_index;
  }
  return 0;
}

int kvs__commit_result(const Kvshare__Response *r, uint32_t *sealed) {
  uint32_t s = 0;
  if (r->result_case == KVSHARE__RESPONSE__RESULT_COMMIT && r->commit)
    s = r->commit->sealed;
  else if (r->result_case != KVSHARE__RESPONSE__RESULT__NOT_SET)
    return KVS_EPROTO;
  if (sealed)
    *sealed = s;
  return 0;
}

/* Runs one request; on success keeps the reply in c->last. */
static int call(kvs_client *c, Kvshare__Request *req,
                Kvshare__Response **resp) {
  if (!c)
    return KVS_EINVAL;
  return kvs__call(c, req, resp);
}

int kvs_lookup(kvs_client *c, uint64_t req_id, const uint32_t *tokens,
               uint32_t n, const void *salt, size_t salt_len,
               kvs_lookup_result *res) {
  if (res)
    memset(res, 0, sizeof *res);
  if ((n && !tokens) || (salt_len && !salt))
    return KVS_EINVAL;
  Kvshare__Lookup m = KVSHARE__LOOKUP__INIT;
  m.req_id = req_id;
  m.n_tokens = n;
  m.tokens = (uint32_t *)tokens;
  m.salt.len = salt_len;
  m.salt.data = (uint8_t *)salt;
  m.no_promote = c && c->no_promote;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  req.op_case = KVSHARE__REQUEST__OP_LOOKUP;
  req.lookup = &m;
  Kvshare__Response *r;
  int rc = call(c, &req, &r);
  return rc ? rc : kvs__lookup_result(r, res);
}

static int alloc_op(kvs_client *c, int append, uint64_t req_id, uint32_t n,
                    kvs_alloc_result *res) {
  if (res) {
    memset(res, 0, sizeof *res);
    res->cow_src = res->cow_dst = KVS_BLOCK_NONE;
  }
  Kvshare__Allocate a = KVSHARE__ALLOCATE__INIT;
  Kvshare__Append p = KVSHARE__APPEND__INIT;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  if (!c)
    return KVS_EINVAL;
  if (append) {
    p.req_id = req_id;
    p.num_tokens = n;
    p.daemon_copy = c->daemon_copy;
    req.op_case = KVSHARE__REQUEST__OP_APPEND;
    req.append = &p;
  } else {
    a.req_id = req_id;
    a.num_tokens = n;
    a.daemon_copy = c->daemon_copy;
    req.op_case = KVSHARE__REQUEST__OP_ALLOCATE;
    req.allocate = &a;
  }
  Kvshare__Response *r;
  int rc = call(c, &req, &r);
  return rc ? rc : kvs__alloc_result(r, res);
}

int kvs_allocate(kvs_client *c, uint64_t req_id, uint32_t num_tokens,
                 kvs_alloc_result *res) {
  return alloc_op(c, 0, req_id, num_tokens, res);
}

int kvs_append(kvs_client *c, uint64_t req_id, uint32_t num_tokens,
               kvs_alloc_result *res) {
  return alloc_op(c, 1, req_id, num_tokens, res);
}

int kvs_commit(kvs_client *c, uint64_t req_id, uint32_t start,
               const uint32_t *tokens, uint32_t n, const uint32_t *blocks,
               uint32_t nblocks, uint32_t *sealed) {
  if (sealed)
    *sealed = 0;
  if (nblocks && !blocks)
    return KVS_EINVAL;
  Kvshare__Commit m = KVSHARE__COMMIT__INIT;
  m.req_id = req_id;
  m.start = start;
  if (tokens) {
    m.n_tokens = n;
    m.tokens = (uint32_t *)tokens;
  }
  m.num_tokens = n;
  m.n_blocks = nblocks;
  m.blocks = (uint32_t *)blocks;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  req.op_case = KVSHARE__REQUEST__OP_COMMIT;
  req.commit = &m;
  Kvshare__Response *r;
  int rc = call(c, &req, &r);
  return rc ? rc : kvs__commit_result(r, sealed);
}

int kvs_fork(kvs_client *c, uint64_t req_id, uint64_t child_id) {
  Kvshare__Fork m = KVSHARE__FORK__INIT;
  m.req_id = req_id;
  m.child_id = child_id;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  req.op_case = KVSHARE__REQUEST__OP_FORK;
  req.fork = &m;
  Kvshare__Response *r;
  return call(c, &req, &r);
}

int kvs_free(kvs_client *c, uint64_t req_id) {
  Kvshare__Free m = KVSHARE__FREE__INIT;
  m.req_id = req_id;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  req.op_case = KVSHARE__REQUEST__OP_FREE;
  req.free = &m;
  Kvshare__Response *r;
  return call(c, &req, &r);
}

int kvs_preempt(kvs_client *c, uint64_t req_id) {
  Kvshare__Preempt m = KVSHARE__PREEMPT__INIT;
  m.req_id = req_id;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  req.op_case = KVSHARE__REQUEST__OP_PREEMPT;
  req.preempt = &m;
  Kvshare__Response *r;
  return call(c, &req, &r);
}

/* One Stats round trip; *out lives until the client's next call. */
static int stats_call(kvs_client *c, int check,
                      const Kvshare__StatsResult **out) {
  Kvshare__Stats m = KVSHARE__STATS__INIT;
  m.check = check ? 1 : 0;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  req.op_case = KVSHARE__REQUEST__OP_STATS;
  req.stats = &m;
  Kvshare__Response *r;
  int rc = call(c, &req, &r);
  if (rc)
    return rc;
  if (r->result_case != KVSHARE__RESPONSE__RESULT_STATS || !r->stats)
    return KVS_EPROTO;
  *out = r->stats;
  return 0;
}

/* kvs_stats_get has three versions: KVSHARE_0.5 (the default, what a
 * program built with this header calls) fills the whole struct; KVSHARE_0.2
 * and KVSHARE_0.1, for programs built against those, fill only the fields
 * their struct had. */
int kvs__stats_get_v05(kvs_client *c, int check, kvs_stats *st);
int kvs__stats_get_v02(kvs_client *c, int check, kvs_stats *st);
int kvs__stats_get_v01(kvs_client *c, int check, kvs_stats *st);
__asm__(".symver kvs__stats_get_v05, kvs_stats_get@@KVSHARE_0.5");
__asm__(".symver kvs__stats_get_v02, kvs_stats_get@KVSHARE_0.2");
__asm__(".symver kvs__stats_get_v01, kvs_stats_get@KVSHARE_0.1");

/* The old versions: the whole struct, cut to what it had then. */
static int stats_get_upto(kvs_client *c, int check, kvs_stats *st,
                          size_t end) {
  kvs_stats all;
  if (!st)
    return KVS_EINVAL;
  int rc = kvs__stats_get_v05(c, check, &all);
  memcpy(st, &all, end);
  return rc;
}

int kvs__stats_get_v01(kvs_client *c, int check, kvs_stats *st) {
  return stats_get_upto(c, check, st, offsetof(kvs_stats, backend));
}

int kvs__stats_get_v02(kvs_client *c, int check, kvs_stats *st) {
  return stats_get_upto(c, check, st, offsetof(kvs_stats, queued_bytes));
}

int kvs__stats_get_v05(kvs_client *c, int check, kvs_stats *st) {
  if (!st)
    return KVS_EINVAL;
  memset(st, 0, sizeof *st);
  const Kvshare__StatsResult *s;
  int rc = stats_call(c, check, &s);
  if (rc)
    return rc;
  st->num_blocks = s->num_blocks;
  st->free_blocks = s->free_blocks;
  st->cached_blocks = s->cached_blocks;
  st->used_blocks = s->used_blocks;
  st->num_requests = s->num_requests;
  st->sessions = s->sessions;
  st->lookups = s->lookups;
  st->query_tokens = s->query_tokens;
  st->hit_tokens = s->hit_tokens;
  st->hit_blocks = s->hit_blocks;
  st->miss_blocks = s->miss_blocks;
  st->allocated_blocks = s->allocated_blocks;
  st->evictions = s->evictions;
  st->cow_copies = s->cow_copies;
  st->sealed_blocks = s->sealed_blocks;
  st->no_space = s->no_space;
  st->frames_in = s->frames_in;
  st->protocol_errors = s->protocol_errors;
  st->check = s->check;
  kvs__copy_str(st->check_message, sizeof st->check_message, s->check_message);
  kvs__copy_str(st->backend, sizeof st->backend, s->backend);
  kvs__copy_str(st->gpu_uuid, sizeof st->gpu_uuid, s->gpu_uuid);
  st->pool_bytes = s->pool_bytes;
  st->daemon_copies = s->daemon_copies;
  st->daemon_copy_blocks = s->daemon_copy_blocks;
  st->copy_errors = s->copy_errors;
  st->queued_bytes = s->queued_bytes;
  st->indexed_blocks = s->indexed_blocks;
  return 0;
}

int kvs_tier_stats_get(kvs_client *c, kvs_tier_stats *out, uint32_t max,
                       uint32_t *n, uint64_t *tier_lost) {
  if (!n || (max && !out))
    return KVS_EINVAL;
  *n = 0;
  if (tier_lost)
    *tier_lost = 0;
  const Kvshare__StatsResult *s;
  int rc = stats_call(c, 0, &s);
  if (rc)
    return rc;
  for (size_t i = 0; i < s->n_tiers && i < max; i++) {
    const Kvshare__TierStats *t = s->tiers[i];
    kvs_tier_stats *o = &out[i];
    memset(o, 0, sizeof *o);
    kvs__copy_str(o->name, sizeof o->name, t->name);
    o->capacity_bytes = t->capacity_bytes;
    o->slots = t->slots;
    o->used = t->used;
    o->demotions = t->demotions;
    o->promotions = t->promotions;
    o->hit_blocks = t->hit_blocks;
    o->drops = t->drops;
    o->failures = t->failures;
    o->bytes_in = t->bytes_in;
    o->bytes_out = t->bytes_out;
    o->io_errors = t->io_errors;
    o->checksum_failures = t->checksum_failures;
  }
  *n = (uint32_t)s->n_tiers;
  if (tier_lost)
    *tier_lost = s->tier_lost;
  return 0;
}

int kvs_swap_stats_get(kvs_client *c, kvs_swap_stats *st) {
  if (!st)
    return KVS_EINVAL;
  memset(st, 0, sizeof *st);
  const Kvshare__StatsResult *s;
  int rc = stats_call(c, 0, &s);
  if (rc)
    return rc;
  st->swapped_requests = s->swapped_requests;
  for (size_t i = 0; i < s->n_tiers; i++)
    st->held_slots += s->tiers[i]->held;
  st->swap_outs = s->swap_outs;
  st->swap_ins = s->swap_ins;
  st->failures = s->swap_failures;
  st->out_blocks = s->swap_out_blocks;
  st->kept_blocks = s->swap_kept_blocks;
  st->in_blocks = s->swap_in_blocks;
  st->resident_blocks = s->swap_resident_blocks;
  return 0;
}

static int swap_op(kvs_client *c, int in, uint64_t req_id,
                   kvs_swap_result *res) {
  Kvshare__SwapOut o = KVSHARE__SWAP_OUT__INIT;
  Kvshare__SwapIn i = KVSHARE__SWAP_IN__INIT;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  Kvshare__Response *r;
  int rc;

  if (res) {
    memset(res, 0, sizeof *res);
    res->blocks = no_blocks;
  }
  if (in) {
    i.req_id = req_id;
    req.op_case = KVSHARE__REQUEST__OP_SWAP_IN;
    req.swap_in = &i;
  } else {
    o.req_id = req_id;
    req.op_case = KVSHARE__REQUEST__OP_SWAP_OUT;
    req.swap_out = &o;
  }
  rc = call(c, &req, &r);
  if (rc)
    return rc;
  if (r->result_case != KVSHARE__RESPONSE__RESULT_SWAP || !r->swap)
    return KVS_EPROTO;
  if (res) {
    res->tokens = r->swap->tokens;
    res->lost_tokens = r->swap->lost_tokens;
    res->copied_blocks = r->swap->copied_blocks;
    res->num_blocks = (uint32_t)r->swap->n_blocks;
    res->blocks = res->num_blocks ? r->swap->blocks : no_blocks;
  }
  return 0;
}

int kvs_swap_out(kvs_client *c, uint64_t req_id, kvs_swap_result *res) {
  return swap_op(c, 0, req_id, res);
}

int kvs_swap_in(kvs_client *c, uint64_t req_id, kvs_swap_result *res) {
  return swap_op(c, 1, req_id, res);
}

int kvs_ping(kvs_client *c, const void *payload, size_t len) {
  if (len && !payload)
    return KVS_EINVAL;
  Kvshare__Ping m = KVSHARE__PING__INIT;
  m.payload.len = len;
  m.payload.data = (uint8_t *)payload;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  req.op_case = KVSHARE__REQUEST__OP_PING;
  req.ping = &m;
  Kvshare__Response *r;
  int rc = call(c, &req, &r);
  if (rc)
    return rc;
  if (len == 0 && r->result_case == KVSHARE__RESPONSE__RESULT__NOT_SET)
    return 0;
  if (r->result_case != KVSHARE__RESPONSE__RESULT_PONG ||
      r->pong.len != len || (len && memcmp(r->pong.data, payload, len) != 0))
    return KVS_EPROTO;
  return 0;
}
