/*
 * pool.c — the free queue: an intrusive doubly-linked list of the ref-0
 * blocks in eviction order (head = next to be allocated).  All O(1).
 */
#include <assert.h>

#include "core_int.h"

void pool_fq_push_head(core *c, uint32_t b) {
  blk *x = &c->blocks[b];
  assert(!x->on_queue && x->ref == 0);
  x->prev = KVS_BLOCK_NONE;
  x->next = c->fq_head;
  if (c->fq_head != KVS_BLOCK_NONE)
    c->blocks[c->fq_head].prev = b;
  else
    c->fq_tail = b;
  c->fq_head = b;
  x->on_queue = 1;
  c->fq_len++;
}

void pool_fq_push_tail(core *c, uint32_t b) {
  blk *x = &c->blocks[b];
  assert(!x->on_queue && x->ref == 0);
  x->next = KVS_BLOCK_NONE;
  x->prev = c->fq_tail;
  if (c->fq_tail != KVS_BLOCK_NONE)
    c->blocks[c->fq_tail].next = b;
  else
    c->fq_head = b;
  c->fq_tail = b;
  x->on_queue = 1;
  c->fq_len++;
}

void pool_fq_unlink(core *c, uint32_t b) {
  blk *x = &c->blocks[b];
  assert(x->on_queue);
  if (x->prev != KVS_BLOCK_NONE)
    c->blocks[x->prev].next = x->next;
  else
    c->fq_head = x->next;
  if (x->next != KVS_BLOCK_NONE)
    c->blocks[x->next].prev = x->prev;
  else
    c->fq_tail = x->prev;
  x->prev = x->next = KVS_BLOCK_NONE;
  x->on_queue = 0;
  c->fq_len--;
}

uint32_t pool_fq_pop_head(core *c) {
  uint32_t b = c->fq_head;
  assert(b != KVS_BLOCK_NONE);
  pool_fq_unlink(c, b);
  return b;
}
