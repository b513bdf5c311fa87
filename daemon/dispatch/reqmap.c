#include "daemon/dispatch/reqmap.h"

#include <stdlib.h>

static size_t hash_id(uint64_t id) {
  /* a 64-bit finalizer: ids are often small consecutive numbers */
  id ^= id >> 33;
  id *= 0xff51afd7ed558ccdull;
  id ^= id >> 33;
  id *= 0xc4ceb9fe1a85ec53ull;
  id ^= id >> 33;
  return (size_t)id;
}

void reqmap_init(reqmap *m) {
  m->slots = NULL;
  m->cap = 0;
  m->count = 0;
  m->last = 0;
}

void reqmap_destroy(reqmap *m) {
  free(m->slots);
  reqmap_init(m);
}

static reqmap_slot *find(reqmap *m, uint64_t id) {
  size_t i;

  if (!m->cap)
    return NULL;
  /* Ids are unique in the map, so a slot holding id is its slot, however
   * the table changed since it was remembered. */
  if (m->last < m->cap && m->slots[m->last].req && m->slots[m->last].id == id)
    return &m->slots[m->last];
  for (i = hash_id(id) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    reqmap_slot *s = &m->slots[i];

    if (!s->req)
      return NULL;
    if (s->id == id) {
      m->last = i;
      return s;
    }
  }
}

core_req *reqmap_get(reqmap *m, uint64_t id) {
  reqmap_slot *s = find(m, id);

  return s ? s->req : NULL;
}

uint64_t *reqmap_cost(reqmap *m, uint64_t id) {
  reqmap_slot *s = find(m, id);

  return s ? &s->cost : NULL;
}

static void insert(reqmap_slot *slots, size_t cap, uint64_t id, core_req *r,
                   uint64_t cost) {
  size_t i = hash_id(id) & (cap - 1);

  while (slots[i].req)
    i = (i + 1) & (cap - 1);
  slots[i].id = id;
  slots[i].req = r;
  slots[i].cost = cost;
}

int reqmap_put(reqmap *m, uint64_t id, core_req *req) {
  if ((m->count + 1) * 4 > m->cap * 3) { /* keep the load under 3/4 */
    size_t cap = m->cap ? m->cap * 2 : 16, i;
    reqmap_slot *slots = calloc(cap, sizeof(*slots));

    if (!slots)
      return KVS_ENOMEM;
    for (i = 0; i < m->cap; i++)
      if (m->slots[i].req)
        insert(slots, cap, m->slots[i].id, m->slots[i].req,
               m->slots[i].cost);
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
  }
  insert(m->slots, m->cap, id, req, 0);
  m->count++;
  return 0;
}

/* Linear probing with backward-shift deletion: no tombstones. */
static void remove_slot(reqmap *m, size_t i) {
  size_t j = i;

  m->slots[i].req = NULL;
  for (;;) {
    size_t home;

    j = (j + 1) & (m->cap - 1);
    if (!m->slots[j].req)
      break;
    home = hash_id(m->slots[j].id) & (m->cap - 1);
    /* move j back to i unless its home lies cyclically in (i, j] */
    if ((j > i && (home <= i || home > j)) ||
        (j < i && (home <= i && home > j))) {
      m->slots[i] = m->slots[j];
      m->slots[j].req = NULL;
      i = j;
    }
  }
  m->count--;
}

core_req *reqmap_del(reqmap *m, uint64_t id, uint64_t *cost) {
  reqmap_slot *s = find(m, id);
  core_req *r;

  if (!s)
    return NULL;
  r = s->req;
  if (cost)
    *cost = s->cost;
  remove_slot(m, (size_t)(s - m->slots));
  return r;
}

void reqmap_drain(reqmap *m, void (*fn)(core_req *req, void *arg),
                  void *arg) {
  size_t i;

  for (i = 0; i < m->cap; i++)
    if (m->slots[i].req) {
      core_req *r = m->slots[i].req;

      m->slots[i].req = NULL;
      m->count--;
      fn(r, arg);
    }
}
