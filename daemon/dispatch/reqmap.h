/*
 * reqmap.h — a session's request ids: an open-addressing hash map from the
 * client's 64-bit request id to the core's request.  Ids are scoped to one
 * session: two sessions may use the same id for different requests.
 */
#ifndef KVS_DAEMON_REQMAP_H
#define KVS_DAEMON_REQMAP_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/core/core.h"

typedef struct reqmap_slot {
  uint64_t id;
  core_req *req; /* NULL: empty slot */
  uint64_t cost; /* token positions charged to the session for it */
} reqmap_slot;

typedef struct reqmap {
  reqmap_slot *slots;
  size_t cap;   /* 0 or a power of two */
  size_t count;
  size_t last;  /* the slot the last lookup found: a step's ops come in
                   runs on one id (append then commit, lookup .. free) */
} reqmap;

void reqmap_init(reqmap *m);
void reqmap_destroy(reqmap *m); /* frees the table, not the requests */
core_req *reqmap_get(reqmap *m, uint64_t id);
/* Adds id (which must not be there), with cost 0.  0 or KVS_ENOMEM. */
int reqmap_put(reqmap *m, uint64_t id, core_req *req);
/* The cost recorded for id (NULL when id is not there); valid until the
 * next put or del. */
uint64_t *reqmap_cost(reqmap *m, uint64_t id);
/* Removes id; returns its request (and its cost in *cost, may be NULL) or
 * NULL. */
core_req *reqmap_del(reqmap *m, uint64_t id, uint64_t *cost);
/* Calls fn on every request and empties the map (fn must not use m). */
void reqmap_drain(reqmap *m, void (*fn)(core_req *req, void *arg), void *arg);

#endif
