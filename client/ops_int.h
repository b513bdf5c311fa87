/*
 * ops_int.h — result decoding shared by the direct calls and the batch.
 */
#ifndef KVS_CLIENT_OPS_INT_H
#define KVS_CLIENT_OPS_INT_H

#include "client/client_int.h"

/* Fill a public result from a Response; KVS_EPROTO when r carries another
 * kind of result. */
int kvs__lookup_result(const Kvshare__Response *r, kvs_lookup_result *res);
int kvs__alloc_result(const Kvshare__Response *r, kvs_alloc_result *res);
int kvs__commit_result(const Kvshare__Response *r, uint32_t *sealed);

#endif /* KVS_CLIENT_OPS_INT_H */
