/*
 * partition.c — a tenant's partition: its pool, core, copy engine and
 * tiers (partition.h).
 */
#include <stdio.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/part/partition.h"
#include "kvs_status.h"

/* x * blocks / pool_blocks, without overflow. */
static uint64_t share_of(uint64_t x, uint32_t blocks, uint32_t pool_blocks) {
  if (!pool_blocks)
    return 0;
  return (uint64_t)((unsigned __int128)x * blocks / pool_blocks);
}

int part_config(const cfg *c, uint32_t index, uint32_t blocks,
                uint32_t pool_blocks, cfg *out, char *err, size_t err_len) {
  const cfg_tenant *t;
  int n;

  *out = *c;
  if (c->ntenants == 0)
    return 0;
  if (index >= c->ntenants) {
    snprintf(err, err_len, "no tenant %u", index);
    return KVS_EINVAL;
  }
  t = &c->tenants[index];
  if (c->gpu_memory_fraction > 0) {
    snprintf(err, err_len, "gpu_memory_fraction cannot size a pool split "
             "among tenants: give pool_bytes or pool_blocks");
    return KVS_EINVAL;
  }
  out->pool_blocks = blocks;
  out->pool_bytes = 0;
  out->layout.num_blocks = blocks;
  out->host_tier_bytes = share_of(c->host_tier_bytes, blocks, pool_blocks);
  out->disk_tier_bytes = share_of(c->disk_tier_bytes, blocks, pool_blocks);
  if (c->disk_tier[0]) {
    n = snprintf(out->disk_tier, sizeof(out->disk_tier), "%s.%s",
                 c->disk_tier, t->name);
    if (n < 0 || (size_t)n >= sizeof(out->disk_tier)) {
      snprintf(err, err_len, "tenant %s: disk_tier %s.%s is too long",
               t->name, c->disk_tier, t->name);
      return KVS_EINVAL;
    }
  }
  n = snprintf(out->remote_tier_prefix, sizeof(out->remote_tier_prefix),
               "%s:%s", c->remote_tier_prefix, t->name);
  if (n < 0 || (size_t)n >= sizeof(out->remote_tier_prefix)) {
    snprintf(err, err_len, "tenant %s: the remote key prefix %s:%s is too "
             "long (%zu bytes at most)", t->name, c->remote_tier_prefix,
             t->name, sizeof(out->remote_tier_prefix) - 1);
    return KVS_EINVAL;
  }
  snprintf(out->part_tenant, sizeof(out->part_tenant), "%s", t->name);
  return 0;
}

static int make_core(partition *p) {
  core_config cc;
  char err[256];
  int rc;

  core_config_init(&cc);
  cc.num_blocks = p->layout.num_blocks;
  cc.block_size = p->layout.block_size;
  cc.reserve_blocks = p->cfg.reserve_blocks;
  cc.root = core_tenant_root(core_root_hash(&p->layout, p->cfg.model_id),
                             p->cfg.part_tenant);
  cc.verify_tokens = p->cfg.verify_tokens;
  /* The KV events carry token ids, also for blocks brought up from a tier. */
  cc.keep_tokens = p->cfg.kv_events_endpoint[0] != '\0';
  cc.policy = p->cfg.policy;
  cc.tier_window = cfg_tier_window(&p->cfg, p->layout.num_blocks,
                                   p->layout.block_stride);
  rc = tiers_slots(&p->cfg, &p->layout, p->pool, cc.tier_slots, err,
                   sizeof(err));
  if (rc < 0) {
    log_error(0, "%s%stiers: %s", p->name, p->name[0] ? ": " : "", err);
    return rc;
  }
  rc = core_create(&cc, &p->core);
  if (rc < 0)
    log_error(rc, "%s%screating the core (policy '%s')", p->name,
              p->name[0] ? ": " : "", p->cfg.policy);
  return rc;
}

int part_open(partition *p, const cfg *c, uint32_t index, uint32_t blocks,
              uint32_t pool_blocks) {
  char err[256];
  int rc;

  p->index = index;
  p->name = c->ntenants ? c->tenants[index].name : "";
  rc = part_config(c, index, blocks, pool_blocks, &p->cfg, err, sizeof(err));
  if (rc < 0) {
    log_error(0, "%s", err);
    return rc;
  }
  p->layout = p->cfg.layout;
  rc = backend_open(&p->cfg, &p->layout, &p->pool, err, sizeof(err));
  if (rc < 0) {
    if (p->name[0])
      log_error(0, "tenant %s: pool (backend %s, %u blocks): %s", p->name,
                c->backend, blocks, err);
    else
      log_error(0, "pool (backend %s): %s", c->backend, err);
    return rc;
  }
  if (p->name[0])
    log_info(0, "tenant %s: %u blocks, %s", p->name, p->layout.num_blocks,
             p->pool->desc);
  else
    log_info(0, "pool: %s", p->pool->desc);
  return make_core(p);
}

int part_start(partition *p, uv_loop_t *loop, const disp_counts *counts) {
  char err[256];
  int rc;

  rc = copy_engine_init(&p->copy, loop, p->pool);
  if (rc < 0) {
    log_error(rc, "%s%sthe copy engine", p->name, p->name[0] ? ": " : "");
    return rc;
  }
  p->copy_open = 1;
  rc = tiers_open(loop, &p->cfg, p->core, p->pool, &p->copy, &p->tiers, err,
                  sizeof(err));
  if (rc < 0) {
    log_error(0, "%s%s%s", p->name, p->name[0] ? ": " : "", err);
    return rc;
  }
  p->disp.cfg = &p->cfg;
  p->disp.layout = p->layout;
  p->disp.core = p->core;
  p->disp.tiers = p->tiers;
  p->disp.copy = &p->copy;
  p->disp.pool = p->pool;
  p->disp.counts = counts;
  p->disp.tenant = p->name;
  p->disp.max_tokens = p->cfg.max_tenant_tokens
                           ? p->cfg.max_tenant_tokens
                           : 4 * p->cfg.max_session_tokens;
  return 0;
}

int part_io_idle(const partition *p) {
  return (!p->copy_open || copy_idle(&p->copy)) && tiers_idle(p->tiers);
}

void part_stop_movers(partition *p) {
  tiers_close(p->tiers);
  p->tiers = p->disp.tiers = NULL;
  if (p->copy_open)
    copy_engine_close(&p->copy);
  p->copy_open = 0;
}

int part_check_exit(const partition *p) {
  char err[256];
  core_stats st;
  int rc;

  if (!p->core)
    return 0;
  rc = core_check(p->core, err, sizeof(err));
  if (rc < 0) {
    log_error(rc, "%s%spool invariant violated at exit: %s", p->name,
              p->name[0] ? ": " : "", err);
    return -1;
  }
  core_get_stats(p->core, &st);
  if (st.used_blocks || st.num_requests) {
    log_error(0, "%s%sat exit %u blocks are still in use by %u requests",
              p->name, p->name[0] ? ": " : "", st.used_blocks,
              st.num_requests);
    return -1;
  }
  return 0;
}

void part_close(partition *p) {
  core_destroy(p->core);
  p->core = NULL;
  backend_close(p->pool);
  p->pool = NULL;
}
