/*
 * ops.c — libkvshare: one call per protocol operation, one round trip each:
 * each builds its op (proto/kvs_op.h), kvs__call encodes it, and its
 * result is read back into the public struct.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_int.h"

/* Never NULL, even for no blocks (so callers may memcpy from it). */
static const uint32_t no_blocks[1] = {KVS_BLOCK_NONE};

void kvs__lookup_result(const kvs_op_result *r, kvs_lookup_result *res) {
  if (!res)
    return;
  memset(res, 0, sizeof *res);
  res->hit_tokens = r->u.lookup.hit_tokens;
  res->num_blocks = r->nblocks;
  res->blocks = r->nblocks ? r->blocks : no_blocks;
}

void kvs__alloc_result(const kvs_op_result *r, kvs_alloc_result *res) {
  if (!res)
    return;
  memset(res, 0, sizeof *res);
  res->first_index = r->u.alloc.first_index;
  res->num_blocks = r->nblocks;
  res->blocks = r->nblocks ? r->blocks : no_blocks;
  res->has_cow = r->u.alloc.has_cow ? (r->u.alloc.cow_copied ? 2 : 1) : 0;
  res->cow_src = r->u.alloc.has_cow ? r->u.alloc.cow_src : KVS_BLOCK_NONE;
  res->cow_dst = r->u.alloc.has_cow ? r->u.alloc.cow_dst : KVS_BLOCK_NONE;
  res->cow_index = r->u.alloc.cow_index;
}

/* Runs one op; its result in *r until the client's next call. */
static int call1(kvs_client *c, const kvs_op *op, kvs_op_result *r) {
  kvs_call call; /* (its one-op storage unused: op and r are the caller's) */

  memset(r, 0, sizeof *r);
  if (!c)
    return KVS_EINVAL;
  call.shape = KVS_SHAPE_OP;
  call.ops = (kvs_op *)op;
  call.res = r;
  call.nops = 1;
  return kvs__call(c, &call);
}

int kvs_lookup(kvs_client *c, uint64_t req_id, const uint32_t *tokens,
               uint32_t n, const void *salt, size_t salt_len,
               kvs_lookup_result *res) {
  kvs_op op = {0};
  kvs_op_result r;

  if (res)
    memset(res, 0, sizeof *res);
  if ((n && !tokens) || (salt_len && !salt) || salt_len > UINT32_MAX)
    return KVS_EINVAL;
  op.code = KVS_OP_LOOKUP;
  op.req_id = req_id;
  op.tokens = tokens;
  op.ntokens = n;
  op.bytes = salt;
  op.nbytes = (uint32_t)salt_len;
  op.flags = c && c->no_promote ? KVS_OPF_NO_PROMOTE : 0;
  int rc = call1(c, &op, &r);
  if (rc == 0)
    kvs__lookup_result(&r, res);
  return rc;
}

static int alloc_op(kvs_client *c, int append, uint64_t req_id, uint32_t n,
                    kvs_alloc_result *res) {
  kvs_op op = {0};
  kvs_op_result r;

  if (res) {
    memset(res, 0, sizeof *res);
    res->cow_src = res->cow_dst = KVS_BLOCK_NONE;
  }
  if (!c)
    return KVS_EINVAL;
  op.code = append ? KVS_OP_APPEND : KVS_OP_ALLOCATE;
  op.req_id = req_id;
  op.num_tokens = n;
  op.flags = c->daemon_copy ? KVS_OPF_DAEMON_COPY : 0;
  int rc = call1(c, &op, &r);
  if (rc == 0)
    kvs__alloc_result(&r, res);
  return rc;
}

int kvs_allocate(kvs_client *c, uint64_t req_id, uint32_t num_tokens,
                 kvs_alloc_result *res) {
  return alloc_op(c, 0, req_id, num_tokens, res);
}

int kvs_append(kvs_client *c, uint64_t req_id, uint32_t num_tokens,
               kvs_alloc_result *res) {
  return alloc_op(c, 1, req_id, num_tokens, res);
}

kvs_op_keys *kvs__keys_copy(const kvs_block_keys *k, int *rc) {
  size_t n = k->nblocks, hb = k->hash_bytes ? n * k->hash_len : 0;
  size_t lora = k->lora_name ? strlen(k->lora_name) + 1 : 0, xb = 0, size;
  kvs_op_keys *o;
  kvs_op_bytes *bytes;
  uint8_t *p;

  *rc = KVS_EINVAL;
  if (n == 0 || !k->hashes == !k->hash_bytes ||
      (k->hash_bytes && (k->hash_len == 0 || k->hash_len > 32)) ||
      (k->extra && !k->extra_len) || n > UINT32_MAX / 64)
    return NULL;
  for (size_t i = 0; k->extra && i < n; i++)
    xb += k->extra_len[i];
  size = sizeof(*o) + (k->hash_bytes ? n : 0) * sizeof(kvs_op_bytes) +
         (k->extra ? n : 0) * sizeof(kvs_op_bytes) +
         (k->hashes ? n * sizeof(uint64_t) : 0) + hb + xb + lora;
  *rc = KVS_ENOMEM;
  if ((o = calloc(1, size)) == NULL)
    return NULL;
  bytes = (kvs_op_bytes *)(o + 1);
  p = (uint8_t *)(bytes + (k->hash_bytes ? n : 0) + (k->extra ? n : 0));
  o->nblocks = (uint32_t)n;
  if (k->hashes) {
    memcpy(p, k->hashes, n * sizeof(uint64_t));
    o->hashes = (const uint64_t *)(void *)p;
    p += n * sizeof(uint64_t);
  } else {
    memcpy(p, k->hash_bytes, hb);
    for (size_t i = 0; i < n; i++)
      bytes[i] = (kvs_op_bytes){k->hash_len, p + i * k->hash_len};
    o->hash_bytes = bytes;
    bytes += n;
    p += hb;
  }
  if (k->extra) {
    memcpy(p, k->extra, xb);
    for (size_t i = 0, off = 0; i < n; off += k->extra_len[i++])
      bytes[i] = (kvs_op_bytes){k->extra_len[i], p + off};
    o->extra = bytes;
    o->nextra = (uint32_t)n;
    p += xb;
  }
  if (lora) {
    memcpy(p, k->lora_name, lora);
    o->lora_name = (const char *)p;
  }
  *rc = 0;
  return o;
}

int kvs_commit(kvs_client *c, uint64_t req_id, uint32_t start,
               const uint32_t *tokens, uint32_t n, const uint32_t *blocks,
               uint32_t nblocks, uint32_t *sealed) {
  return kvs_commit_keys(c, req_id, start, tokens, n, blocks, nblocks, NULL,
                         sealed);
}

int kvs_commit_keys(kvs_client *c, uint64_t req_id, uint32_t start,
                    const uint32_t *tokens, uint32_t n, const uint32_t *blocks,
                    uint32_t nblocks, const kvs_block_keys *keys,
                    uint32_t *sealed) {
  kvs_op op = {0};
  kvs_op_result r;
  kvs_op_keys *k = NULL;
  int rc;

  if (sealed)
    *sealed = 0;
  if (nblocks && !blocks)
    return KVS_EINVAL;
  if (keys && (k = kvs__keys_copy(keys, &rc)) == NULL)
    return rc;
  op.keys = k;
  op.code = KVS_OP_COMMIT;
  op.req_id = req_id;
  op.start = start;
  op.num_tokens = n;
  if (tokens) {
    op.tokens = tokens;
    op.ntokens = n;
  }
  op.blocks = nblocks ? blocks : NULL;
  op.nblocks = nblocks;
  rc = call1(c, &op, &r);
  free(k);
  if (rc == 0 && sealed)
    *sealed = r.u.commit.sealed;
  return rc;
}

/* An op on a request id alone (Fork's child aside): status only. */
static int id_op(kvs_client *c, uint8_t code, uint64_t req_id,
                 uint64_t child_id) {
  kvs_op op = {0};
  kvs_op_result r;

  op.code = code;
  op.req_id = req_id;
  op.child_id = child_id;
  return call1(c, &op, &r);
}

int kvs_fork(kvs_client *c, uint64_t req_id, uint64_t child_id) {
  return id_op(c, KVS_OP_FORK, req_id, child_id);
}

int kvs_free(kvs_client *c, uint64_t req_id) {
  return id_op(c, KVS_OP_FREE, req_id, 0);
}

int kvs_preempt(kvs_client *c, uint64_t req_id) {
  return id_op(c, KVS_OP_PREEMPT, req_id, 0);
}

/* One Stats round trip; *out lives until the client's next call. */
static int stats_call(kvs_client *c, int check, const kvs_op_stats **out) {
  kvs_op op = {0};
  kvs_op_result r;

  op.code = KVS_OP_STATS;
  op.flags = check ? KVS_OPF_CHECK : 0;
  int rc = call1(c, &op, &r);
  if (rc)
    return rc;
  if (!r.u.stats)
    return KVS_EPROTO;
  *out = r.u.stats;
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
  const kvs_op_stats *s;
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
  const kvs_op_stats *s;
  int rc = stats_call(c, 0, &s);
  if (rc)
    return rc;
  for (size_t i = 0; i < s->ntiers && i < max; i++) {
    const kvs_op_tier *t = &s->tiers[i];
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
  *n = s->ntiers;
  if (tier_lost)
    *tier_lost = s->tier_lost;
  return 0;
}

int kvs_tenant_stats_get(kvs_client *c, kvs_tenant_stats *out, uint32_t max,
                         uint32_t *n) {
  if (!n || (max && !out))
    return KVS_EINVAL;
  *n = 0;
  const kvs_op_stats *s;
  int rc = stats_call(c, 0, &s);
  if (rc)
    return rc;
  for (uint32_t i = 0; i < s->ntenants && i < max; i++) {
    const kvs_op_tenant *t = &s->tenants[i];
    kvs_tenant_stats *o = &out[i];
    memset(o, 0, sizeof *o);
    kvs__copy_str(o->name, sizeof o->name, t->name);
    o->num_blocks = t->num_blocks;
    o->free_blocks = t->free_blocks;
    o->cached_blocks = t->cached_blocks;
    o->used_blocks = t->used_blocks;
    o->num_requests = t->num_requests;
    o->sessions = t->sessions;
    o->lookups = t->lookups;
    o->query_tokens = t->query_tokens;
    o->hit_tokens = t->hit_tokens;
    o->evictions = t->evictions;
    o->no_space = t->no_space;
    o->pool_bytes = t->pool_bytes;
  }
  *n = s->ntenants;
  return 0;
}

int kvs_swap_stats_get(kvs_client *c, kvs_swap_stats *st) {
  if (!st)
    return KVS_EINVAL;
  memset(st, 0, sizeof *st);
  const kvs_op_stats *s;
  int rc = stats_call(c, 0, &s);
  if (rc)
    return rc;
  st->swapped_requests = s->swapped_requests;
  for (size_t i = 0; i < s->ntiers; i++)
    st->held_slots += s->tiers[i].held;
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
  kvs_op op = {0};
  kvs_op_result r;

  if (res) {
    memset(res, 0, sizeof *res);
    res->blocks = no_blocks;
  }
  op.code = in ? KVS_OP_SWAP_IN : KVS_OP_SWAP_OUT;
  op.req_id = req_id;
  int rc = call1(c, &op, &r);
  if (rc)
    return rc;
  if (res) {
    res->tokens = r.u.swap.tokens;
    res->lost_tokens = r.u.swap.lost_tokens;
    res->copied_blocks = r.u.swap.copied_blocks;
    res->num_blocks = r.nblocks;
    res->blocks = r.nblocks ? r.blocks : no_blocks;
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
  kvs_op op = {0};
  kvs_op_result r;

  if ((len && !payload) || len > UINT32_MAX)
    return KVS_EINVAL;
  op.code = KVS_OP_PING;
  op.bytes = payload;
  op.nbytes = (uint32_t)len;
  int rc = call1(c, &op, &r);
  if (rc)
    return rc;
  if (r.u.pong.len != len ||
      (len && memcmp(r.u.pong.data, payload, len) != 0))
    return KVS_EPROTO;
  return 0;
}
