/*
 * hash.c — block identity: chained XXH3-128.
 *   hash(block i) = XXH3_128(hash(block i-1) || salt digest || token ids)
 * The root parent is derived from the layout and the model id, so caches of
 * different models or layouts never match.
 */
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "core.h"

static kvs_hash128 from_xxh(XXH128_hash_t x) {
  kvs_hash128 h = {x.low64, x.high64};
  return h;
}

kvs_hash128 core_block_hash(kvs_hash128 parent, kvs_hash128 salt,
                            const uint32_t *tokens, uint32_t n) {
  uint64_t head[4] = {parent.lo, parent.hi, salt.lo, salt.hi};
  size_t tbytes = (size_t)n * sizeof(uint32_t);
  if (tbytes <= 1024) { /* one shot over a stack copy: the common case */
    unsigned char buf[sizeof(head) + 1024];
    memcpy(buf, head, sizeof(head));
    memcpy(buf + sizeof(head), tokens, tbytes);
    return from_xxh(XXH3_128bits(buf, sizeof(head) + tbytes));
  }
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, head, sizeof(head));
  XXH3_128bits_update(&st, tokens, tbytes);
  return from_xxh(XXH3_128bits_digest(&st));
}

kvs_hash128 core_root_hash(const kvs_layout *l, const char *model_id) {
  XXH3_state_t st;
  static const char tag[] = "kvshare/root/v1";
  uint32_t f[5] = {l->block_size, l->num_layers, l->num_kv_heads, l->head_dim,
                   l->dtype};
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, tag, sizeof(tag));
  XXH3_128bits_update(&st, f, sizeof(f));
  /* The int8 format (rows rotated, then a scale and a minimum per row) is
   * named too: blocks of the earlier int8 formats, the same dtype value
   * (symmetric with one scale per row; then unrotated with a minimum),
   * must never match one of today's (disk slots, remote keys). */
  if (l->dtype == KVS_DTYPE_INT8) {
    static const char fmt[] = "int8/hadamard/zero-point";
    XXH3_128bits_update(&st, fmt, sizeof(fmt));
  }
  if (model_id != NULL)
    XXH3_128bits_update(&st, model_id, strlen(model_id));
  return from_xxh(XXH3_128bits_digest(&st));
}

kvs_hash128 core_tenant_root(kvs_hash128 root, const char *tenant) {
  XXH3_state_t st;
  static const char tag[] = "kvshare/tenant/v1";

  if (tenant == NULL || tenant[0] == '\0')
    return root;
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, tag, sizeof(tag));
  XXH3_128bits_update(&st, &root, sizeof(root));
  XXH3_128bits_update(&st, tenant, strlen(tenant));
  return from_xxh(XXH3_128bits_digest(&st));
}
