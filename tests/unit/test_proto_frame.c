/* Framing: header encode/decode, incremental parsing, envelope round trips,
 * bad magic/version/flags (the compact flag accepted, any other refused),
 * oversize, truncated and undecodable payloads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvs_frame.h"

static void test_header_round_trip(void **state) {
  uint8_t h[KVS_FRAME_HEADER_SIZE];
  kvs_frame_header d;

  (void)state;
  kvs_frame_header_encode(h, 1234567);
  /* The magic reads "KVS1" in memory order; fields are little-endian. */
  assert_memory_equal(h, "KVS1", 4);
  assert_int_equal(h[4], 1);
  assert_int_equal(h[5], 0);
  assert_int_equal(h[6], 0);
  assert_int_equal(h[7], 0);
  assert_int_equal(h[8], 1234567 & 0xff);
  assert_int_equal(h[11], (1234567 >> 24) & 0xff);
  assert_int_equal(kvs_frame_header_decode(h, KVS_FRAME_MAX_DEFAULT, &d), 0);
  assert_int_equal(d.magic, KVS_FRAME_MAGIC);
  assert_int_equal(d.version, KVS_PROTO_VERSION);
  assert_int_equal(d.flags, 0);
  assert_int_equal(d.length, 1234567);
}

static void test_header_errors(void **state) {
  uint8_t h[KVS_FRAME_HEADER_SIZE];
  kvs_frame_header d;

  (void)state;
  kvs_frame_header_encode(h, 100);
  h[0] = 'X';
  assert_int_equal(kvs_frame_header_decode(h, 1000, &d), KVS_EPROTO);

  kvs_frame_header_encode(h, 100);
  h[4] = 2;
  assert_int_equal(kvs_frame_header_decode(h, 1000, &d), KVS_EVERSION);
  assert_int_equal(d.version, 2);

  /* The one flag there is (a compact payload) is accepted and read back;
   * every other bit, alone or beside it, is refused. */
  kvs_frame_header_encode_flags(h, 100, KVS_FRAME_COMPACT);
  assert_int_equal(kvs_frame_header_decode(h, 1000, &d), 0);
  assert_int_equal(d.flags, KVS_FRAME_COMPACT);
  assert_int_equal(d.length, 100);
  for (unsigned bit = 1; bit < 16; bit++) {
    kvs_frame_header_encode_flags(h, 100, (uint16_t)(1u << bit));
    assert_int_equal(kvs_frame_header_decode(h, 1000, &d), KVS_EPROTO);
    kvs_frame_header_encode_flags(h, 100,
                                  (uint16_t)(1u << bit | KVS_FRAME_COMPACT));
    assert_int_equal(kvs_frame_header_decode(h, 1000, &d), KVS_EPROTO);
  }

  kvs_frame_header_encode(h, 1001);
  assert_int_equal(kvs_frame_header_decode(h, 1000, &d), KVS_ETOOBIG);
  assert_int_equal(d.length, 1001);
  kvs_frame_header_encode(h, 1000);
  assert_int_equal(kvs_frame_header_decode(h, 1000, &d), 0);

  /* Garbage: every byte 0xff. */
  memset(h, 0xff, sizeof(h));
  assert_true(kvs_frame_header_decode(h, 1000, &d) < 0);
}

static void fill_request(Kvshare__Envelope *env, Kvshare__Request *req,
                         Kvshare__Commit *c, uint32_t *tokens, size_t n) {
  kvshare__envelope__init(env);
  kvshare__request__init(req);
  kvshare__commit__init(c);
  c->req_id = 0x123456789abcull;
  c->start = 16;
  c->n_tokens = n;
  c->tokens = tokens;
  req->op_case = KVSHARE__REQUEST__OP_COMMIT;
  req->commit = c;
  env->seq = 42;
  env->body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  env->request = req;
}

static void test_pack_unpack(void **state) {
  Kvshare__Envelope env, *out;
  Kvshare__Request req;
  Kvshare__Commit c;
  uint32_t tokens[100];
  uint8_t *buf;
  size_t len, flen, i;

  (void)state;
  for (i = 0; i < 100; i++)
    tokens[i] = (uint32_t)(i * 7919u);
  fill_request(&env, &req, &c, tokens, 100);
  assert_int_equal(kvs_frame_pack(&env, KVS_FRAME_MAX_DEFAULT, &buf, &len), 0);
  assert_int_equal(len, kvs_frame_size(&env));

  /* Incremental: every prefix is "need more", the whole is one frame. */
  for (i = 0; i < len; i++) {
    assert_int_equal(kvs_frame_parse(buf, i, KVS_FRAME_MAX_DEFAULT, &flen), 0);
    if (i >= KVS_FRAME_HEADER_SIZE)
      assert_int_equal(flen, len);
  }
  assert_int_equal(kvs_frame_parse(buf, len, KVS_FRAME_MAX_DEFAULT, &flen), 1);
  assert_int_equal(flen, len);

  assert_int_equal(kvs_envelope_unpack(buf + KVS_FRAME_HEADER_SIZE,
                                       len - KVS_FRAME_HEADER_SIZE, 0, &out),
                   0);
  assert_int_equal(out->seq, 42);
  assert_int_equal(out->body_case, KVSHARE__ENVELOPE__BODY_REQUEST);
  assert_int_equal(out->request->op_case, KVSHARE__REQUEST__OP_COMMIT);
  assert_int_equal(out->request->commit->req_id, 0x123456789abcull);
  assert_int_equal(out->request->commit->start, 16);
  assert_int_equal(out->request->commit->n_tokens, 100);
  assert_memory_equal(out->request->commit->tokens, tokens, sizeof(tokens));
  kvs_envelope_free(out);
  kvs_envelope_free(NULL);

  /* pack_into: the same bytes; too small a buffer is KVS_ERANGE. */
  {
    uint8_t buf2[1024];

    assert_int_equal(kvs_frame_pack_into(&env, KVS_FRAME_MAX_DEFAULT, buf2,
                                         sizeof(buf2)),
                     (long)len);
    assert_memory_equal(buf, buf2, len);
    assert_int_equal(kvs_frame_pack_into(&env, KVS_FRAME_MAX_DEFAULT, buf2,
                                         len - 1),
                     KVS_ERANGE);
  }
  free(buf);
}

static void test_oversize(void **state) {
  Kvshare__Envelope env;
  Kvshare__Request req;
  Kvshare__Commit c;
  uint32_t tokens[1000];
  uint8_t *buf = (uint8_t *)1, small[64];
  size_t len = 1;

  (void)state;
  memset(tokens, 0x7f, sizeof(tokens));
  fill_request(&env, &req, &c, tokens, 1000);
  assert_int_equal(kvs_frame_pack(&env, 1000, &buf, &len), KVS_ETOOBIG);
  assert_null(buf);
  assert_int_equal(len, 0);
  assert_int_equal(kvs_frame_pack_into(&env, 1000, small, sizeof(small)),
                   KVS_ETOOBIG);

  /* A header announcing more than the limit is refused before any payload. */
  kvs_frame_header_encode(small, KVS_FRAME_MAX_DEFAULT + 1);
  assert_int_equal(kvs_frame_parse(small, KVS_FRAME_HEADER_SIZE,
                                   KVS_FRAME_MAX_DEFAULT, &len),
                   KVS_ETOOBIG);
}

static void test_truncated_and_garbage(void **state) {
  Kvshare__Envelope env, *out = NULL;
  Kvshare__Request req;
  Kvshare__Commit c;
  uint32_t tokens[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 300000};
  uint8_t *buf, garbage[256];
  size_t len, i;

  (void)state;
  fill_request(&env, &req, &c, tokens, 10);
  assert_int_equal(kvs_frame_pack(&env, KVS_FRAME_MAX_DEFAULT, &buf, &len), 0);
  /* A payload cut short inside the packed tokens does not decode. */
  assert_int_equal(kvs_envelope_unpack(buf + KVS_FRAME_HEADER_SIZE,
                                       len - KVS_FRAME_HEADER_SIZE - 1, 0,
                                       &out),
                   KVS_EPROTO);
  assert_null(out);
  free(buf);

  /* Garbage either fails cleanly or decodes into something freeable. */
  srand(7);
  for (i = 0; i < 2000; i++) {
    size_t j, n = (size_t)(rand() % (int)sizeof(garbage));

    for (j = 0; j < n; j++)
      garbage[j] = (uint8_t)rand();
    if (kvs_envelope_unpack(garbage, n, 0, &out) == 0)
      kvs_envelope_free(out);
  }
  /* 0xff bytes: a varint that never ends. */
  memset(garbage, 0xff, sizeof(garbage));
  assert_int_equal(kvs_envelope_unpack(garbage, sizeof(garbage), 0, &out),
                   KVS_EPROTO);
}

static void test_alloc_limit(void **state) {
  Kvshare__Envelope env, *out = NULL;
  Kvshare__Request req, **ops;
  Kvshare__Batch batch;
  Kvshare__Ping ping;
  uint8_t *buf;
  size_t len, i, n = 5000;

  (void)state;
  /* A batch of many tiny ops expands a lot when decoded. */
  kvshare__envelope__init(&env);
  kvshare__request__init(&req);
  kvshare__batch__init(&batch);
  kvshare__ping__init(&ping);
  ops = calloc(n, sizeof(*ops));
  assert_non_null(ops);
  {
    static Kvshare__Request op;

    kvshare__request__init(&op);
    op.op_case = KVSHARE__REQUEST__OP_PING;
    op.ping = &ping;
    for (i = 0; i < n; i++)
      ops[i] = &op;
  }
  batch.n_ops = n;
  batch.ops = ops;
  req.op_case = KVSHARE__REQUEST__OP_BATCH;
  req.batch = &batch;
  env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  env.request = &req;
  assert_int_equal(kvs_frame_pack(&env, KVS_FRAME_MAX_DEFAULT, &buf, &len), 0);
  /* Within the default budget it decodes... */
  assert_int_equal(kvs_envelope_unpack(buf + KVS_FRAME_HEADER_SIZE,
                                       len - KVS_FRAME_HEADER_SIZE, 0, &out),
                   0);
  assert_int_equal(out->request->batch->n_ops, n);
  kvs_envelope_free(out);
  /* ...and a tight budget refuses it before decoding... */
  assert_int_equal(kvs_envelope_unpack(buf + KVS_FRAME_HEADER_SIZE,
                                       len - KVS_FRAME_HEADER_SIZE, 4096,
                                       &out),
                   KVS_ELIMIT);
  assert_null(out);
  /* ...as does every budget below the scan's bound. */
  for (i = 1; i < 20000; i += 7) {
    out = NULL;
    assert_int_equal(kvs_envelope_unpack(buf + KVS_FRAME_HEADER_SIZE,
                                         len - KVS_FRAME_HEADER_SIZE, i, &out),
                     KVS_ELIMIT);
    assert_null(out);
  }
  free(buf);
  free(ops);
}

/* Appends a varint. */
static size_t put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;

  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  return n;
}

/* An Envelope holding Request { Batch { ops: Request { Batch ... } } },
 * `levels` Batches deep, built inside out at the end of buf; returns its
 * start.  Each level wraps the previous one in two length-delimited fields. */
static uint8_t *nested_batches(uint8_t *buf, size_t cap, unsigned levels,
                               size_t *len) {
  uint8_t *end = buf + cap, *p = end, hdr[24];
  unsigned i;

  for (i = 0; i < levels; i++) {
    size_t h;

    h = put_varint(hdr, (1 << 3) | 2);          /* Batch.ops */
    h += put_varint(hdr + h, (uint64_t)(end - p));
    p -= h;
    memcpy(p, hdr, h);
    h = put_varint(hdr, (9 << 3) | 2);          /* Request.batch */
    h += put_varint(hdr + h, (uint64_t)(end - p));
    p -= h;
    memcpy(p, hdr, h);
  }
  {
    size_t h = put_varint(hdr, (4 << 3) | 2);   /* Envelope.request */

    h += put_varint(hdr + h, (uint64_t)(end - p));
    p -= h;
    memcpy(p, hdr, h);
  }
  *len = (size_t)(end - p);
  return p;
}

/* Regression: protobuf-c recurses once per nested message with no limit; a
 * 34 KB frame of nested Batches overflowed the daemon's stack (SIGSEGV). */
static void test_deep_nesting(void **state) {
  size_t cap = 4u << 20, len;
  uint8_t *buf = malloc(cap), *p;
  Kvshare__Envelope *out = NULL;

  (void)state;
  assert_non_null(buf);
  /* A Batch inside a Batch still decodes (the daemon answers it EINVAL). */
  p = nested_batches(buf, cap, 2, &len);
  assert_int_equal(kvs_envelope_unpack(p, len, 0, &out), 0);
  assert_int_equal(out->request->op_case, KVSHARE__REQUEST__OP_BATCH);
  assert_int_equal(out->request->batch->ops[0]->op_case,
                   KVSHARE__REQUEST__OP_BATCH);
  kvs_envelope_free(out);
  /* Up to the limit: Envelope 0, Request 1, Batch 2, ... */
  p = nested_batches(buf, cap, (KVS_UNPACK_MAX_DEPTH - 1) / 2, &len);
  assert_int_equal(kvs_envelope_unpack(p, len, 0, &out), 0);
  kvs_envelope_free(out);
  p = nested_batches(buf, cap, KVS_UNPACK_MAX_DEPTH / 2 + 1, &len);
  assert_int_equal(kvs_envelope_unpack(p, len, 0, &out), KVS_EPROTO);
  assert_null(out);
  /* Far past it: refused, not a stack overflow. */
  p = nested_batches(buf, cap, 200000, &len);
  assert_int_equal(kvs_envelope_unpack(p, len, 0, &out), KVS_EPROTO);
  assert_null(out);
  /* Cut in the middle of the nesting: refused as well. */
  p = nested_batches(buf, cap, 1000, &len);
  assert_int_equal(kvs_envelope_unpack(p, len / 2, 0, &out), KVS_EPROTO);
  free(buf);
}

static void test_status_names(void **state) {
  (void)state;
  assert_string_equal(kvs_status_name(KVS_ETOOBIG), "ETOOBIG");
  assert_string_equal(kvs_strerror(KVS_EVERSION),
                      "protocol version not supported");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_header_round_trip),
      cmocka_unit_test(test_header_errors),
      cmocka_unit_test(test_pack_unpack),
      cmocka_unit_test(test_oversize),
      cmocka_unit_test(test_truncated_and_garbage),
      cmocka_unit_test(test_alloc_limit),
      cmocka_unit_test(test_deep_nesting),
      cmocka_unit_test(test_status_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
