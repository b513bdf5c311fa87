#include "kvs_frame.h"

#include <stdlib.h>
#include <string.h>

static void put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static uint16_t get_u16(const uint8_t *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
         ((uint32_t)p[3] << 24);
}

void kvs_frame_header_encode_flags(uint8_t out[KVS_FRAME_HEADER_SIZE],
                                   uint32_t length, uint16_t flags) {
  put_u32(out, KVS_FRAME_MAGIC);
  put_u16(out + 4, (uint16_t)KVS_PROTO_VERSION);
  put_u16(out + 6, flags);
  put_u32(out + 8, length);
}

void kvs_frame_header_encode(uint8_t out[KVS_FRAME_HEADER_SIZE],
                             uint32_t length) {
  kvs_frame_header_encode_flags(out, length, 0);
}

int kvs_frame_header_decode(const uint8_t in[KVS_FRAME_HEADER_SIZE],
                            uint32_t max_frame, kvs_frame_header *h) {
  h->magic = get_u32(in);
  h->version = get_u16(in + 4);
  h->flags = get_u16(in + 6);
  h->length = get_u32(in + 8);
  if (h->magic != KVS_FRAME_MAGIC)
    return KVS_EPROTO;
  if (h->version != KVS_PROTO_VERSION)
    return KVS_EVERSION;
  if (h->flags & ~KVS_FRAME_COMPACT)
    return KVS_EPROTO;
  if (h->length > max_frame)
    return KVS_ETOOBIG;
  return 0;
}

int kvs_frame_parse(const uint8_t *buf, size_t avail, uint32_t max_frame,
                    size_t *frame_len) {
  kvs_frame_header h;
  int rc;

  *frame_len = KVS_FRAME_HEADER_SIZE;
  if (avail < KVS_FRAME_HEADER_SIZE)
    return 0;
  rc = kvs_frame_header_decode(buf, max_frame, &h);
  if (rc < 0)
    return rc;
  *frame_len = KVS_FRAME_HEADER_SIZE + (size_t)h.length;
  return avail >= *frame_len ? 1 : 0;
}

size_t kvs_frame_size(const Kvshare__Envelope *env) {
  return KVS_FRAME_HEADER_SIZE + kvshare__envelope__get_packed_size(env);
}

long kvs_frame_pack_into(const Kvshare__Envelope *env, uint32_t max_frame,
                         uint8_t *buf, size_t cap) {
  size_t len = kvshare__envelope__get_packed_size(env);

  if (len > max_frame || len > UINT32_MAX)
    return KVS_ETOOBIG;
  if (cap < KVS_FRAME_HEADER_SIZE + len)
    return KVS_ERANGE;
  kvs_frame_header_encode(buf, (uint32_t)len);
  kvshare__envelope__pack(env, buf + KVS_FRAME_HEADER_SIZE);
  return (long)(KVS_FRAME_HEADER_SIZE + len);
}

int kvs_frame_pack(const Kvshare__Envelope *env, uint32_t max_frame,
                   uint8_t **out, size_t *out_len) {
  size_t len = kvshare__envelope__get_packed_size(env);
  uint8_t *buf;

  *out = NULL;
  *out_len = 0;
  if (len > max_frame || len > UINT32_MAX)
    return KVS_ETOOBIG;
  buf = malloc(KVS_FRAME_HEADER_SIZE + len);
  if (!buf)
    return KVS_ENOMEM;
  kvs_frame_header_encode(buf, (uint32_t)len);
  kvshare__envelope__pack(env, buf + KVS_FRAME_HEADER_SIZE);
  *out = buf;
  *out_len = KVS_FRAME_HEADER_SIZE + len;
  return 0;
}

/*
 * The decoder's allocator: plain malloc/free (so the envelope can later be
 * freed with protobuf-c's default allocator), charging each allocation
 * kvs__unpack_cost(size) against the budget and refusing one that would go
 * over it.  Frees give nothing back: the charge is what the decode asked for
 * in all, counted the same way as the arena counts it and as the scan bounds
 * it, so the three agree.
 */
struct budget {
  size_t used, limit;
};

static void *budget_alloc(void *data, size_t size) {
  struct budget *b = data;
  size_t c = kvs__unpack_cost(size);

  if (c < size || c > b->limit - b->used)
    return NULL;
  b->used += c;
  return malloc(size);
}

static void budget_free(void *data, void *p) {
  (void)data;
  free(p);
}

/* Reads a varint at *p (below end); 0, or -1 when it is cut or too long. */
static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  unsigned shift = 0;

  *v = 0;
  while (*p < end && shift < 64) {
    uint8_t b = *(*p)++;

    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80))
      return 0;
    shift += 7;
  }
  return -1;
}

/*
 * What protobuf-c 1.4 allocates when it unpacks a message (protobuf-c.c,
 * protobuf_c_message_unpack and parse_member):
 * - the message struct (sizeof_message);
 * - the "scanned members", one per field occurrence: the first 16 on the
 *   stack, then slabs of 32, 64, 128... members of at most 32 bytes each
 *   (its BOUND_SIZEOF_SCANNED_MEMBER_LOG2);
 * - one array per repeated field, of all its elements, packed or not;
 * - a copy of every string (length + 1) and bytes value;
 * - for unknown fields, an array of ProtobufCMessageUnknownField and a copy
 *   of each one's bytes, length prefix included.
 * A singular message field given twice is merged, which allocates again;
 * no sender of ours does that, and it is not counted: such a payload may be
 * refused.
 */
#define PBC_MEMBER_MAX 32u
#define PBC_FIRST_SLAB_LOG2 4u
#define SCAN_MAX_FIELDS 64u /* more fields than any message of ours has */

static size_t repeated_elt_size(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
  case PROTOBUF_C_TYPE_DOUBLE:
    return 8;
  case PROTOBUF_C_TYPE_STRING:
  case PROTOBUF_C_TYPE_MESSAGE:
    return sizeof(void *);
  case PROTOBUF_C_TYPE_BYTES:
    return sizeof(ProtobufCBinaryData);
  default: /* 32-bit numbers, enums, protobuf_c_boolean */
    return 4;
  }
}

/* Elements in a packed run of n bytes at p (as protobuf-c counts them). */
static size_t packed_count(ProtobufCType t, const uint8_t *p, size_t n) {
  size_t i, c = 0;

  switch (t) {
  case PROTOBUF_C_TYPE_SFIXED32:
  case PROTOBUF_C_TYPE_FIXED32:
  case PROTOBUF_C_TYPE_FLOAT:
    return n / 4;
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_FIXED64:
  case PROTOBUF_C_TYPE_DOUBLE:
    return n / 8;
  case PROTOBUF_C_TYPE_BOOL:
    return n;
  default: /* varints: one ends at each byte without the high bit */
    for (i = 0; i < n; i++)
      c += !(p[i] & 0x80);
    return c;
  }
}

struct scan_state {
  kvs_payload_scan *out;
  const ProtobufCFieldDescriptor *seq_field;
};

/*
 * Walks one message's wire format with its descriptor, descending into
 * message-typed fields, and adds what decoding it allocates to the bound.
 * protobuf-c unpacks nested messages by recursion with no depth limit (a
 * few tens of kilobytes of Request { Batch { Request { Batch ... } } }
 * would overflow the stack): a payload nested deeper than
 * KVS_UNPACK_MAX_DEPTH, or malformed on the way, is refused here first.
 * This walk's own recursion is bounded by that limit.
 */
static int scan_message(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                        const uint8_t *end, unsigned depth,
                        struct scan_state *st) {
  kvs_payload_scan *s = st->out;
  size_t counts[SCAN_MAX_FIELDS] = {0};
  size_t members = 0, unknown = 0, cap, i;
  unsigned slab;

  if (depth > KVS_UNPACK_MAX_DEPTH || d->n_fields > SCAN_MAX_FIELDS)
    return -1;
  s->messages++;
  s->alloc_bound += kvs__unpack_cost(d->sizeof_message);
  while (p < end) {
    const ProtobufCFieldDescriptor *f = NULL;
    uint64_t key, v;
    size_t idx = 0, len = 0, elements = 1;

    if (read_varint(&p, end, &key) < 0)
      return -1;
    if ((key >> 3) >= 1 && (key >> 3) <= UINT32_MAX)
      f = protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
    if (f)
      idx = (size_t)(f - d->fields);
    members++;
    switch (key & 7) {
    case 0: /* varint */
      if (read_varint(&p, end, &v) < 0)
        return -1;
      if (f && f == st->seq_field && depth == 0)
        s->seq = v;
      len = 10;
      break;
    case 1: /* 64-bit */
      if ((size_t)(end - p) < 8)
        return -1;
      p += 8;
      len = 8;
      break;
    case 5: /* 32-bit */
      if ((size_t)(end - p) < 4)
        return -1;
      p += 4;
      len = 4;
      break;
    case 2: /* length-delimited: bytes, string, packed, or a message */
      if (read_varint(&p, end, &v) < 0 || v > (uint64_t)(end - p))
        return -1;
      len = (size_t)v + 10;
      if (!f) {
        /* unknown: counted below */
      } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        if (scan_message(f->descriptor, p, p + v, depth + 1, st) < 0)
          return -1;
      } else if (f->type == PROTOBUF_C_TYPE_STRING) {
        s->alloc_bound += kvs__unpack_cost((size_t)v + 1);
      } else if (f->type == PROTOBUF_C_TYPE_BYTES) {
        s->alloc_bound += kvs__unpack_cost((size_t)v);
      } else if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        /* A packed run: one occurrence, many elements. */
        elements = packed_count(f->type, p, (size_t)v);
      }
      p += v;
      break;
    default: /* groups (3, 4) and unknown wire types: protobuf-c refuses */
      return -1;
    }
    if (!f) {
      unknown++;
      s->alloc_bound += kvs__unpack_cost(len);
    } else if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      counts[idx] += elements;
    }
  }
  if (unknown)
    s->alloc_bound +=
        kvs__unpack_cost(unknown * sizeof(ProtobufCMessageUnknownField));
  for (i = 0; i < d->n_fields; i++)
    if (counts[i])
      s->alloc_bound += kvs__unpack_cost(
          counts[i] * repeated_elt_size(d->fields[i].type));
  /* The scanned-member slabs past the first, on the stack. */
  for (cap = 1u << PBC_FIRST_SLAB_LOG2, slab = PBC_FIRST_SLAB_LOG2;
       cap < members; cap += (size_t)1 << slab)
    s->alloc_bound += kvs__unpack_cost((size_t)PBC_MEMBER_MAX << ++slab);
  return 0;
}

int kvs_envelope_scan(const uint8_t *payload, size_t len,
                      kvs_payload_scan *s) {
  struct scan_state st;

  memset(s, 0, sizeof(*s));
  st.out = s;
  st.seq_field = protobuf_c_message_descriptor_get_field_by_name(
      &kvshare__envelope__descriptor, "seq");
  return scan_message(&kvshare__envelope__descriptor, payload, payload + len,
                      0, &st) < 0
             ? KVS_EPROTO
             : 0;
}

size_t kvs__unpack_budget(const kvs_payload_scan *s, size_t limit) {
  /* Room over the bound for what the scan does not count (a merge), never
   * past the caller's limit. */
  size_t slack = s->alloc_bound / 4 + 4096;

  return limit - s->alloc_bound < slack ? limit : s->alloc_bound + slack;
}

int kvs_envelope_unpack(const uint8_t *payload, size_t len,
                        size_t alloc_limit, Kvshare__Envelope **out) {
  kvs_payload_scan scan;
  struct budget b = {0, 0};
  ProtobufCAllocator a = {budget_alloc, budget_free, &b};
  int rc;

  *out = NULL;
  if (!alloc_limit)
    alloc_limit = KVS_UNPACK_LIMIT(len, KVS_UNPACK_OPS_DEFAULT);
  rc = kvs_envelope_scan(payload, len, &scan);
  if (rc < 0)
    return rc;
  if (scan.alloc_bound > alloc_limit)
    return KVS_ELIMIT;
  b.limit = kvs__unpack_budget(&scan, alloc_limit);
  *out = kvshare__envelope__unpack(&a, len, payload);
  return *out ? 0 : KVS_EPROTO;
}

void kvs_envelope_free(Kvshare__Envelope *env) {
  if (env)
    kvshare__envelope__free_unpacked(env, NULL);
}
