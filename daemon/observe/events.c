/*
 * events.c — the KV event stream (events.h): the core's index events, in
 * runs, into one msgpack batch per loop iteration, published on a ZMQ XPUB
 * socket (a PUB to its subscribers), kept for replay on a ZMQ ROUTER
 * socket.
 *
 * Everything runs on the loop thread.  The batch is sent from a uv_prepare
 * callback (after the iteration's frames, before the loop sleeps); the
 * ROUTER's and the XPUB's ZMQ_FD are watched by uv_polls (it signals a
 * change, the socket's ZMQ_EVENTS says what is ready).
 *
 * What a peer can make the daemon hold is bounded.  No message it sends may
 * be over EV_MSG_MAX (ZMQ_MAXMSGSIZE: libzmq drops the connection; a
 * subscription longer than the topic can never match anyway).
 * Subscriptions are the daemon's to take (ZMQ_XPUB_MANUAL): only those
 * that can match the topic (a prefix of it) are, which bounds the trie the
 * messages go out by.  libzmq still remembers every subscription of a
 * manual XPUB, per connection, to undo it when the peer goes: a connection
 * that sends EV_REFUSED_MAX subscriptions that could never match within
 * EV_REFUSED_MS is disconnected (cut(); its descriptor comes with each
 * message, ZMQ_SRCFD), which frees what libzmq kept for it.  A subscriber
 * of several daemons sends each the others' topics: a few, not 1024.
 *
 * A message's descriptor is the one its connection had when libzmq's
 * thread read it: by the time the loop takes the message that connection
 * may be gone and the number reused by a new one, with up to a pipe's
 * worth of the old one's subscriptions still queued.  So a count belongs
 * to one socket (its inode), and a TCP socket is cut only if it has
 * itself received at least the bytes of the subscriptions counted
 * (tcpi_bytes_received): a new connection is never cut for what an old
 * one sent.
 */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <msgpack.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "daemon/observe/events.h"
#include "daemon/observe/tcpinfo.h"
#include "daemon/log.h"
#include "kvs_utf8.h"

#define EV_RUN_MAX 4096            /* blocks in one event */
#define EV_BATCH_FLUSH (4u << 20)  /* a batch this big goes at once */
#define EV_KEEP_BYTES (64ull << 20)
#define EV_LINGER_MS 500
#define EV_ID_MAX 256              /* ROUTER peer identity */
#define EV_MSG_MAX 256             /* a message from a peer: a subscription
                                      (1 + a topic of 63 at most), a
                                      replay request, a peer identity */
#define EV_REFUSED_MAX 1024        /* subscriptions that cannot match, before
                                      the connection is dropped */
#define EV_REFUSED_MS 10000        /* ... within this long (a subscriber of
                                      several daemons sends each the
                                      others' topics, again on a reconnect,
                                      whose descriptor may be reused) */
#define EV_PEERS_MAX 65536         /* connections counted, by descriptor */
#define EV_RCV_HWM 64              /* of them waiting, per peer */
#define EV_HANDSHAKE_MS 5000       /* a peer silent this long after it
                                      connects is dropped */

#define EV_LORAS_MAX 4096          /* LoRA names kept */
#define EV_X_DEPTH 32              /* nesting of an extra keys object */

enum { RUN_NONE = 0, RUN_STORED, RUN_REMOVED };
enum { EV_FORMAT_MAP = 0, EV_FORMAT_ARRAY = 1 };
/* Where a block is (the event's medium): the pool, then the tiers in
 * core's order (EV_HOST + CORE_TIER_*). */
enum { EV_POOL = 0, EV_HOST, EV_DISK, EV_REMOTE, EV_MEDIUMS };
/* Places an engine key is kept for (the remote tier is not one: a block
 * there outlives what this daemon knows of it). */
enum { EV_IN_POOL = 1, EV_IN_HOST = 2, EV_IN_DISK = 4 };

/* A key as published: the engine's (len 1 to 32: bytes, or an integer
 * when is_int, its 8 bytes in host order), or none (len 0: the daemon's
 * hash). */
typedef struct ev_key {
  uint8_t len, is_int;
  uint8_t b[32];
} ev_key;

/* The engine's key of a hash, while the block is in one of places. */
typedef struct ev_emap {
  uint64_t h;
  ev_key k;
  uint16_t lora;   /* 0 or loras[lora - 1] */
  uint8_t places;  /* EV_IN_* */
  uint8_t used;
} ev_emap;

/* A block of the run being gathered. */
typedef struct ev_ent {
  uint64_t h;
  ev_key k;
  uint32_t xoff, xlen; /* its extra keys in xb (xlen 0: none) */
} ev_ent;

/* A published batch: shared by the replay ring and every message ZMQ
 * still queues with it (zero-copy), freed by the last of them (ZMQ's I/O
 * thread, possibly: the count is atomic). */
typedef struct ev_blob {
  atomic_int refs;
  size_t len;
  uint8_t data[];
} ev_blob;

typedef struct ev_peer {
  int fd;
  uint32_t refused;
  uint64_t since_ms; /* the first of them */
  uint64_t ino;      /* the socket fd was then (refused()) */
} ev_peer;

typedef struct ev_kept {
  uint64_t seq;
  ev_blob *blob;
} ev_kept;

/* A core observed: its callbacks' arg (they query the core they came
 * from), and what events_close detaches. */
typedef struct ev_src {
  events *e;
  core *cr;                /* (queried, never changed, from its callbacks) */
} ev_src;

struct events {
  uv_loop_t *loop;
  ev_src *srcs;            /* the cores observed */
  uint32_t nsrcs;
  void *zctx, *pub, *router;
  uv_poll_t rpoll, ppoll;
  char pub_ep[300];        /* as bound (ZMQ_LAST_ENDPOINT) */
  int pub_port;            /* its TCP port (0: not TCP) */
  ev_peer *peers;          /* refused subscriptions, by descriptor */
  uint32_t npeers;
  int drop_logged;
  uv_prepare_t prep;
  int open_handles;
  char topic[64];
  size_t topic_len;
  const char *mediums[EV_MEDIUMS];
  uint32_t format;         /* EV_FORMAT_* */
  uint32_t bs;
  /* the batch being built: its events, packed */
  msgpack_sbuffer body;
  msgpack_packer pk;       /* writes into body (body_write) */
  uint32_t nevents;
  int lost;                /* out of memory: this batch is incomplete */
  /* the run being gathered into one event */
  int run;
  int run_medium;          /* EV_POOL ... */
  ev_ent *ents;
  uint32_t nh;
  uint32_t *tokens;        /* nh * bs when run_tokens */
  int run_tokens;
  int run_parent;
  int run_extra;           /* some block has extra keys */
  uint16_t run_lora;
  uint64_t parent;
  ev_key parent_key;
  kvs_hash128 last;        /* the run's last hash: the next one's parent */
  msgpack_sbuffer xb;      /* the run's extra keys */
  /* the engine's keys: by hash (the daemon's: those of different cores
   * never collide), the commit's being sealed, LoRA names */
  ev_emap *emap;
  uint32_t emask, ecount;
  const kvs_op_keys *keys;
  uint32_t keys_first;
  uint16_t keys_lora;
  char *loras[EV_LORAS_MAX];
  uint32_t nloras;
  /* kept for replay: a ring of cap */
  ev_kept *kept;
  uint32_t cap, head, count;
  uint64_t kept_bytes;
  uint64_t next_seq;
  events_stats st;
};

static void take_subscriptions(events *e);
static void refused(events *e, int fd);

/* ---- building a batch -------------------------------------------------- */

/* The packer's writer: a failure to grow marks the batch lost. */
static int body_write(void *data, const char *buf, size_t len) {
  events *e = data;

  if (msgpack_sbuffer_write(&e->body, buf, len) < 0) {
    e->lost = 1;
    return -1;
  }
  return 0;
}

static void blob_unref(void *data, void *hint) {
  ev_blob *b = hint;

  (void)data;
  if (atomic_fetch_sub(&b->refs, 1) == 1)
    free(b);
}

/* Queues blob as one frame of a message on socket s (zero-copy). */
static int send_blob(void *s, ev_blob *b, int flags) {
  zmq_msg_t m;

  atomic_fetch_add(&b->refs, 1);
  if (zmq_msg_init_data(&m, b->data, b->len, blob_unref, b) < 0) {
    blob_unref(NULL, b);
    return -1;
  }
  if (zmq_msg_send(&m, s, flags) < 0) {
    zmq_msg_close(&m); /* (drops the reference) */
    return -1;
  }
  return 0;
}

static void pack_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);

  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

/* ---- the engine's keys ------------------------------------------------- */

/* h's home slot in a table of emask + 1 (multiply-shift). */
static uint32_t emap_home(uint64_t h, uint32_t emask) {
  return (uint32_t)(h * 0x9e3779b97f4a7c15ull >> 32) & emask;
}

/* h's entry (the engine's key it is published as), or NULL. */
static ev_emap *emap_find(const events *e, uint64_t h) {
  if (e->ecount == 0)
    return NULL;
  for (uint32_t i = emap_home(h, e->emask);; i = (i + 1) & e->emask) {
    ev_emap *m = &e->emap[i];

    if (!m->used)
      return NULL;
    if (m->h == h)
      return m;
  }
}

static int emap_grow(events *e) {
  uint32_t cap = e->emask ? (e->emask + 1) * 2 : 1024;
  ev_emap *old = e->emap, *t = calloc(cap, sizeof(*t));
  uint32_t omask = e->emask;

  if (t == NULL)
    return -1;
  e->emap = t;
  e->emask = cap - 1;
  for (uint32_t i = 0; old && i <= omask; i++) {
    if (!old[i].used)
      continue;
    uint32_t j = emap_home(old[i].h, e->emask);

    while (t[j].used)
      j = (j + 1) & e->emask;
    t[j] = old[i];
  }
  free(old);
  return 0;
}

/* h's entry, made (with no place yet) when it has none; NULL: no memory. */
static ev_emap *emap_put(events *e, uint64_t h) {
  ev_emap *m = emap_find(e, h);
  uint32_t i;

  if (m)
    return m;
  if ((e->ecount + 1) * 2 > e->emask + 1 && emap_grow(e) < 0)
    return NULL;
  for (i = emap_home(h, e->emask); e->emap[i].used; i = (i + 1) & e->emask)
    ;
  m = &e->emap[i];
  memset(m, 0, sizeof(*m));
  m->used = 1;
  m->h = h;
  e->ecount++;
  return m;
}

/* Entry m is out of every place: gone (backward-shift deletion). */
static void emap_del(events *e, ev_emap *m) {
  uint32_t i = (uint32_t)(m - e->emap), j = i;

  for (;;) {
    j = (j + 1) & e->emask;
    if (!e->emap[j].used)
      break;
    uint32_t home = emap_home(e->emap[j].h, e->emask);
    /* j's entry may move to i when its home is not in (i, j] */
    if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
      e->emap[i] = e->emap[j];
      i = j;
    }
  }
  e->emap[i].used = 0;
  e->ecount--;
}

/* h is in place p (EV_IN_*) now, or no longer. */
static void emap_place(events *e, uint64_t h, uint8_t p, int in) {
  ev_emap *m = emap_find(e, h);

  if (m == NULL)
    return;
  if (in)
    m->places |= p;
  else if ((m->places &= (uint8_t)~p) == 0)
    emap_del(e, m);
}

/* The LoRA name's number (1 up), interned; 0 for none, -1: no room. */
static int lora_id(events *e, const char *name) {
  if (name == NULL || !name[0])
    return 0;
  for (uint32_t i = 0; i < e->nloras; i++)
    if (strcmp(e->loras[i], name) == 0)
      return (int)i + 1;
  if (e->nloras == EV_LORAS_MAX)
    return -1;
  if ((e->loras[e->nloras] = strdup(name)) == NULL)
    return -1;
  return (int)++e->nloras;
}

/* The end of the msgpack object at p (before end), or NULL when it is not
 * one that every subscriber can decode: nesting over EV_X_DEPTH, a count
 * over the bytes left, a string that is not UTF-8, a map key that is not a
 * string, an extension type, a reserved byte.  Allocates nothing. */
static const uint8_t *mp_object(const uint8_t *p, const uint8_t *end,
                                int depth, int key) {
  uint64_t n = 0, items = 0;
  size_t hdr = 1;
  int str = 0, bin = 0;
  uint8_t c;

  if (p >= end || depth > EV_X_DEPTH)
    return NULL;
  c = *p;
#define BE(k) (end - p > (k) ? 0 : 1)
#define GET(k, v)                                                            \
  do {                                                                       \
    if (BE(k))                                                               \
      return NULL;                                                           \
    v = 0;                                                                   \
    for (int i_ = 1; i_ <= (k); i_++)                                        \
      v = v << 8 | p[i_];                                                    \
    hdr = 1 + (k);                                                           \
  } while (0)
  if (key && !((c >= 0xa0 && c <= 0xbf) || c == 0xd9 || c == 0xda ||
               c == 0xdb))
    return NULL; /* (map keys are strings) */
  if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3)
    return p + 1;
  if (c >= 0xa0 && c <= 0xbf)
    n = c & 0x1f, str = 1;
  else if (c >= 0x90 && c <= 0x9f)
    items = c & 0x0f;
  else if (c >= 0x80 && c <= 0x8f)
    items = 2u * (c & 0x0f);
  else
    switch (c) {
    case 0xcc: case 0xd0: return BE(1) ? NULL : p + 2;
    case 0xcd: case 0xd1: return BE(2) ? NULL : p + 3;
    case 0xca: case 0xce: case 0xd2: return BE(4) ? NULL : p + 5;
    case 0xcb: case 0xcf: case 0xd3: return BE(8) ? NULL : p + 9;
    case 0xd9: GET(1, n); str = 1; break;
    case 0xda: GET(2, n); str = 1; break;
    case 0xdb: GET(4, n); str = 1; break;
    case 0xc4: GET(1, n); bin = 1; break;
    case 0xc5: GET(2, n); bin = 1; break;
    case 0xc6: GET(4, n); bin = 1; break;
    case 0xdc: GET(2, items); break;
    case 0xdd: GET(4, items); break;
    case 0xde: GET(2, items); items *= 2; break;
    case 0xdf: GET(4, items); items *= 2; break;
    default: return NULL; /* ext types, 0xc1 */
    }
#undef GET
#undef BE
  p += hdr;
  if (str || bin) {
    if (n > (uint64_t)(end - p))
      return NULL;
    if (str && !kvs_utf8_valid(p, (size_t)n, 0))
      return NULL;
    return p + n;
  }
  if (items > (uint64_t)(end - p)) /* each item takes a byte at least */
    return NULL;
  int map = c == 0xde || c == 0xdf || (c >= 0x80 && c <= 0x8f);
  for (uint64_t i = 0; i < items && p; i++)
    p = mp_object(p, end, depth + 1, map && i % 2 == 0);
  return p;
}

int events_keys_begin(events *e, const kvs_op *op, uint32_t first, char *err,
                      size_t len) {
  const kvs_op_keys *k = op->keys;
  int lora;

  if (e == NULL || k == NULL)
    return 0;
  for (uint32_t i = 0; i < k->nextra; i++) {
    const uint8_t *x = k->extra[i].data, *xend = x + k->extra[i].len;

    if (k->extra[i].len && mp_object(x, xend, 0, 0) != xend) {
      snprintf(err, len, "extra keys %u are not one msgpack object that "
               "every subscriber decodes (UTF-8 strings, string map keys, "
               "no extension types, nesting %d at most)", i, EV_X_DEPTH);
      return -1;
    }
  }
  /* The LoRA name table is full: the blocks go out with no name (counted),
   * the commit is not refused for the events' sake. */
  if ((lora = lora_id(e, k->lora_name)) < 0) {
    e->st.lora_failures++;
    lora = 0;
  }
  e->keys = k;
  e->keys_first = first;
  e->keys_lora = (uint16_t)lora;
  return 0;
}

void events_keys_end(events *e) {
  if (e)
    e->keys = NULL;
}

/* ---- building a batch (2) ------------------------------------------------ */

static void pack_key(msgpack_packer *pk, const ev_key *k, uint64_t h) {
  if (k->len == 0) {
    msgpack_pack_uint64(pk, h);
  } else if (k->is_int) {
    uint64_t v;

    memcpy(&v, k->b, sizeof(v));
    msgpack_pack_uint64(pk, v);
  } else {
    msgpack_pack_bin(pk, k->len);
    msgpack_pack_bin_body(pk, k->b, k->len);
  }
}

/* A field's name, in the map encoding (the array one has only values). */
static void pack_field(msgpack_packer *pk, int map, const char *name) {
  if (map)
    pack_str(pk, name);
}

/* An event's start: a map of n fields with its "type", or an array of n
 * values with its name first. */
static void pack_event(msgpack_packer *pk, int map, uint32_t n,
                       const char *type) {
  if (map)
    msgpack_pack_map(pk, n);
  else
    msgpack_pack_array(pk, n);
  pack_field(pk, map, "type");
  pack_str(pk, type);
}

static void pack_hashes(events *e) {
  msgpack_pack_array(&e->pk, e->nh);
  for (uint32_t i = 0; i < e->nh; i++)
    pack_key(&e->pk, &e->ents[i].k, e->ents[i].h);
}

static void pack_lora(events *e) {
  if (e->run_lora)
    pack_str(&e->pk, e->loras[e->run_lora - 1]);
  else
    msgpack_pack_nil(&e->pk);
}

/* The gathered run becomes one event of the batch. */
static void run_end(events *e) {
  msgpack_packer *pk = &e->pk;
  const char *medium = e->mediums[e->run_medium];
  int map = e->format == EV_FORMAT_MAP;

  if (e->run == RUN_STORED) {
    int extra = map && e->run_extra;

    pack_event(pk, map, 8 + extra, "BlockStored");
    pack_field(pk, map, "block_hashes");
    pack_hashes(e);
    pack_field(pk, map, "parent_block_hash");
    if (e->run_parent)
      pack_key(pk, &e->parent_key, e->parent);
    else
      msgpack_pack_nil(pk);
    pack_field(pk, map, "token_ids");
    if (e->run_tokens) {
      size_t n = (size_t)e->nh * e->bs;

      msgpack_pack_array(pk, n);
      for (size_t i = 0; i < n; i++)
        msgpack_pack_uint32(pk, e->tokens[i]);
    } else {
      msgpack_pack_array(pk, 0);
    }
    pack_field(pk, map, "block_size");
    msgpack_pack_uint32(pk, e->bs);
    pack_field(pk, map, "lora_id");
    msgpack_pack_nil(pk);
    pack_field(pk, map, "medium");
    pack_str(pk, medium);
    pack_field(pk, map, "lora_name");
    pack_lora(e);
    if (extra) {
      pack_field(pk, map, "extra_keys");
      msgpack_pack_array(pk, e->nh);
      for (uint32_t i = 0; i < e->nh; i++) {
        if (e->ents[i].xlen == 0)
          msgpack_pack_nil(pk);
        else
          body_write(e, e->xb.data + e->ents[i].xoff, e->ents[i].xlen);
      }
    }
    e->st.stored += e->nh;
  } else if (e->run == RUN_REMOVED) {
    pack_event(pk, map, 3, "BlockRemoved");
    pack_field(pk, map, "block_hashes");
    pack_hashes(e);
    pack_field(pk, map, "medium");
    pack_str(pk, medium);
    e->st.removed += e->nh;
  }
  if (e->run != RUN_NONE) {
    e->nevents++;
    if (e->run_medium != EV_POOL)
      e->st.tier_blocks += e->nh;
  }
  e->run = RUN_NONE;
  e->nh = 0;
  e->run_extra = 0;
  msgpack_sbuffer_clear(&e->xb);
}

/* The ring takes the caller's reference to b. */
static void keep(events *e, uint64_t seq, ev_blob *b) {
  ev_kept *k;

  while (e->count &&
         (e->count == e->cap || e->kept_bytes + b->len > EV_KEEP_BYTES)) {
    k = &e->kept[e->head];
    e->kept_bytes -= k->blob->len;
    blob_unref(NULL, k->blob);
    e->head = (e->head + 1) % e->cap;
    e->count--;
  }
  k = &e->kept[(e->head + e->count) % e->cap];
  k->seq = seq;
  k->blob = b;
  e->kept_bytes += b->len;
  e->count++;
}

static void seq_bytes(uint8_t out[8], uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8)
    out[i] = (uint8_t)v;
}

/* The batch goes: PUB (topic, seq, payload), and into the ring. */
static void flush(events *e) {
  msgpack_sbuffer hdr;
  msgpack_packer hp;
  struct timespec ts;
  uint8_t seq8[8];
  ev_blob *b = NULL;
  uint64_t seq;

  run_end(e);
  if (e->nevents == 0 && !e->lost)
    return;
  seq = e->next_seq++; /* a lost batch still takes its number: the gap
                          shows */
  msgpack_sbuffer_init(&hdr);
  msgpack_packer_init(&hp, &hdr, msgpack_sbuffer_write);
  clock_gettime(CLOCK_REALTIME, &ts);
  if (e->format == EV_FORMAT_MAP)
    msgpack_pack_map(&hp, 2);
  else
    msgpack_pack_array(&hp, 2);
  pack_field(&hp, e->format == EV_FORMAT_MAP, "ts");
  msgpack_pack_double(&hp, (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
  pack_field(&hp, e->format == EV_FORMAT_MAP, "events");
  msgpack_pack_array(&hp, e->nevents);
  if (!e->lost && hdr.data)
    b = malloc(sizeof(*b) + hdr.size + e->body.size);
  if (b == NULL) {
    e->st.dropped++;
    log_warn(KVS_ENOMEM, "kv events: batch %llu (%u events) lost",
             (unsigned long long)seq, e->nevents);
  } else {
    atomic_init(&b->refs, 1);
    b->len = hdr.size + e->body.size;
    memcpy(b->data, hdr.data, hdr.size);
    memcpy(b->data + hdr.size, e->body.data, e->body.size);
    seq_bytes(seq8, seq);
    /* PUB never blocks: a subscriber over its queue's limit loses the
     * message (its sequence numbers jump), which the daemon does not see. */
    if (zmq_send(e->pub, e->topic, e->topic_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(e->pub, seq8, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        send_blob(e->pub, b, ZMQ_DONTWAIT) < 0)
      e->st.dropped++;
    else
      e->st.batches++;
    take_subscriptions(e);
    keep(e, seq, b);
  }
  msgpack_sbuffer_destroy(&hdr);
  msgpack_sbuffer_clear(&e->body);
  e->nevents = 0;
  e->lost = 0;
}

static void on_prepare(uv_prepare_t *h) {
  events *e = h->data;

  flush(e);
  uv_prepare_stop(h);
}

/* The run's arrays, allocated at the first event (run_end keeps nh below
 * EV_RUN_MAX). */
static int run_room(events *e) {
  if (e->ents == NULL) {
    e->ents = malloc(EV_RUN_MAX * sizeof(*e->ents));
    e->tokens = malloc((size_t)EV_RUN_MAX * e->bs * sizeof(*e->tokens));
    if (e->ents == NULL || e->tokens == NULL) {
      free(e->ents);
      free(e->tokens);
      e->ents = NULL;
      e->tokens = NULL;
      e->lost = 1;
      return -1;
    }
  }
  return 0;
}

/* Before an event: a batch grown big goes at once (never in the middle of
 * a block's events: on_sealed completes the entry on_stored adds). */
static void before_event(events *e) {
  if (e->body.size >= EV_BATCH_FLUSH)
    flush(e);
  uv_prepare_start(&e->prep, on_prepare); /* no-op when started */
}

/* h's key, as published: the engine's when it gave one. */
static void key_of(const events *e, uint64_t h, ev_key *k, uint16_t *lora) {
  const ev_emap *m = emap_find(e, h);

  if (m) {
    *k = m->k;
    *lora = m->lora;
  } else {
    k->len = 0;
    *lora = 0;
  }
}

/* A block of a stored run (medium md, parent: chained to the run's last,
 * else it starts one). */
static void add_stored(events *e, int md, kvs_hash128 h,
                       const kvs_hash128 *parent, const uint32_t *tokens) {
  int tk = tokens != NULL;
  ev_key k;
  uint16_t lora;

  key_of(e, h.lo, &k, &lora);
  if (e->keys && md == EV_POOL) /* (sealed by a commit with keys: on_sealed
                                   gives it the engine's) */
    lora = e->keys_lora;
  before_event(e);
  /* A pool run is a chain; a tier's is any blocks, none the parent of the
   * next (as vLLM's offloading reports its copies). */
  if (e->run != RUN_STORED || e->run_medium != md || tk != e->run_tokens ||
      lora != e->run_lora || e->nh == EV_RUN_MAX ||
      (md == EV_POOL
           ? parent == NULL || parent->lo != e->last.lo ||
                 parent->hi != e->last.hi
           : parent != NULL || e->run_parent)) {
    run_end(e);
    e->run = RUN_STORED;
    e->run_medium = md;
    e->run_tokens = tk;
    e->run_lora = lora;
    e->run_parent = parent != NULL;
    e->parent = parent ? parent->lo : 0;
    if (parent)
      key_of(e, parent->lo, &e->parent_key, &lora);
  }
  if (run_room(e) == 0) {
    ev_ent *x = &e->ents[e->nh++];

    if (tk)
      memmove(e->tokens + (size_t)(e->nh - 1) * e->bs, tokens,
              (size_t)e->bs * sizeof(*tokens));
    x->h = h.lo;
    x->k = k;
    x->xlen = 0;
    e->last = h;
  }
}

static void add_removed(events *e, int md, uint64_t h) {
  ev_key k;
  uint16_t lora;

  key_of(e, h, &k, &lora);
  before_event(e);
  if (e->run != RUN_REMOVED || e->run_medium != md || e->nh == EV_RUN_MAX) {
    run_end(e);
    e->run = RUN_REMOVED;
    e->run_medium = md;
  }
  if (run_room(e) == 0) {
    e->ents[e->nh].h = h;
    e->ents[e->nh++].k = k;
  }
}

static void on_stored(void *arg, kvs_hash128 h, const kvs_hash128 *parent,
                      const uint32_t *tokens) {
  events *e = ((ev_src *)arg)->e;

  emap_place(e, h.lo, EV_IN_POOL, 1);
  add_stored(e, EV_POOL, h, parent, tokens);
}

/* (right after on_stored for the same block) A commit sealed h at pos:
 * with the engine's keys for it, they become h's.  (Only the core that
 * runs the commit seals while the keys are set: one core's operation never
 * calls into another's.) */
static void on_sealed(void *arg, kvs_hash128 h, uint32_t b, uint32_t pos) {
  const ev_src *src = arg;
  events *e = src->e;
  const kvs_op_keys *k = e->keys;
  uint32_t i;
  ev_emap *m;
  ev_ent *x;

  (void)b;
  if (k == NULL || pos < e->keys_first || (i = pos - e->keys_first) >= k->nblocks)
    return;
  /* A block whose copies below went out under the daemon's hash keeps it:
   * their removals must name what their stores named. */
  if (emap_find(e, h.lo) == NULL && core_tier_holds(src->cr, h)) {
    e->st.key_failures++;
    return;
  }
  if ((m = emap_put(e, h.lo)) == NULL) {
    e->st.key_failures++;
    return;
  }
  if (m->k.len) {
    /* known already (a copy below): the first key stays, so that every
     * event about the block agrees */
  } else if (k->hashes) {
    m->k.is_int = 1;
    m->k.len = 8;
    memcpy(m->k.b, &k->hashes[i], 8);
  } else {
    m->k.is_int = 0;
    m->k.len = (uint8_t)k->hash_bytes[i].len;
    memcpy(m->k.b, k->hash_bytes[i].data, m->k.len);
  }
  if (m->places == 0)
    m->lora = e->keys_lora;
  m->places |= EV_IN_POOL;
  if (e->run != RUN_STORED || e->nh == 0 || e->ents[e->nh - 1].h != h.lo)
    return; /* (lost to memory) */
  x = &e->ents[e->nh - 1]; /* (its run has the commit's LoRA name) */
  x->k = m->k;
  if (k->nextra && k->extra[i].len &&
      msgpack_sbuffer_write(&e->xb, (const char *)k->extra[i].data,
                            k->extra[i].len) == 0) {
    x->xoff = (uint32_t)(e->xb.size - k->extra[i].len);
    x->xlen = (uint32_t)k->extra[i].len;
    e->run_extra = 1;
  }
}

static void on_removed(void *arg, kvs_hash128 h) {
  events *e = ((ev_src *)arg)->e;

  add_removed(e, EV_POOL, h.lo);
  emap_place(e, h.lo, EV_IN_POOL, 0);
}

static const uint8_t tier_place[] = {EV_IN_HOST, EV_IN_DISK, 0};

static void on_tier(void *arg, kvs_hash128 h, int t, int present) {
  events *e = ((ev_src *)arg)->e;

  if (t < 0 || t > CORE_TIER_REMOTE)
    return;
  if (present) {
    emap_place(e, h.lo, tier_place[t], 1);
    add_stored(e, EV_HOST + t, h, NULL, NULL);
  } else {
    add_removed(e, EV_HOST + t, h.lo);
    emap_place(e, h.lo, tier_place[t], 0);
  }
}

static void tier_each(void *arg, kvs_hash128 h, int t) {
  on_tier(arg, h, t, 1);
}

static void all_cleared(events *e) {
  run_end(e);
  pack_event(&e->pk, e->format == EV_FORMAT_MAP, 1, "AllBlocksCleared");
  e->nevents++;
  flush(e);
}

/* ---- replay ------------------------------------------------------------ */

static int send_frame(void *s, const void *p, size_t n, int more) {
  return zmq_send(s, p, n, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) < 0 ? -1 : 0;
}

/* One answer to the peer id: [id, ("",) seq8, payload] (b's bytes, or
 * none). */
static int send_reply(events *e, const uint8_t *id, size_t idlen, int delim,
                      const uint8_t seq8[8], ev_blob *b) {
  int rc = send_frame(e->router, id, idlen, 1);

  if (rc == 0 && delim)
    rc = send_frame(e->router, "", 0, 1);
  if (rc == 0)
    rc = send_frame(e->router, seq8, 8, 1);
  if (rc == 0)
    rc = b ? send_blob(e->router, b, ZMQ_DONTWAIT)
           : send_frame(e->router, "", 0, 0);
  return rc;
}

/* One request of n frames: [id, "", seq8] (REQ, or a DEALER sending the
 * empty delimiter) or [id, seq8]; answered in the same shape (with the
 * delimiter when the second frame is empty).  bad: a frame was too long to
 * keep. */
static void serve_replay(events *e, uint8_t frames[3][EV_ID_MAX],
                         const size_t lens[3], int n, int bad) {
  static const uint8_t end8[8] = {0xff, 0xff, 0xff, 0xff,
                                  0xff, 0xff, 0xff, 0xff};
  int delim = n >= 3 && lens[1] == 0;
  uint64_t start = 0;
  uint8_t seq8[8];
  int rc = 0;

  if (bad || (n != 2 && n != 3) || lens[n - 1] != 8 || (n == 3 && !delim)) {
    if (e->st.bad_requests++ == 0)
      log_warn(0, "kv events: a malformed replay request (%d frames); "
               "expected [8-byte big-endian sequence number]", n);
    if (n < 2 || lens[0] == 0)
      return;
    start = UINT64_MAX; /* answered with the end marker alone: the peer
                           does not wait for nothing */
  } else {
    for (int i = 0; i < 8; i++)
      start = start << 8 | frames[n - 1][i];
    e->st.replays++;
  }
  for (uint32_t i = 0; i < e->count && rc == 0; i++) {
    const ev_kept *k = &e->kept[(e->head + i) % e->cap];

    if (k->seq < start)
      continue;
    seq_bytes(seq8, k->seq);
    rc = send_reply(e, frames[0], lens[0], delim, seq8, k->blob);
  }
  if (rc == 0)
    rc = send_reply(e, frames[0], lens[0], delim, end8, NULL);
  if (rc < 0)
    log_debug(zmq_errno(), "kv events: a replay was cut short");
}

/* Subscriptions (XPUB_MANUAL): each taken when it can match the topic,
 * counted and ignored when not.  Also after every send: libzmq's ZMQ_FD
 * signals edges, which a send may consume. */
static void take_subscriptions(events *e) {
  for (;;) {
    zmq_msg_t m;
    const uint8_t *buf;
    int zev = 0, n, fd;
    size_t sz = sizeof(zev);

    /* (zmq_recv looks at libzmq's commands every 100 calls, ZMQ_EVENTS at
     * every one: ZMQ_EVENTS is asked only when zmq_recv finds nothing) */
    zmq_msg_init(&m);
    n = zmq_msg_recv(&m, e->pub, ZMQ_DONTWAIT);
    if (n < 0) {
      zmq_msg_close(&m);
      if (zmq_errno() == EINTR)
        continue;
      if (zmq_errno() == EAGAIN &&
          zmq_getsockopt(e->pub, ZMQ_EVENTS, &zev, &sz) == 0 &&
          (zev & ZMQ_POLLIN))
        continue;
      return;
    }
    buf = zmq_msg_data(&m);
    fd = zmq_msg_get(&m, ZMQ_SRCFD); /* the connection's (-1: none) */
    if (n >= 1 && (buf[0] == 0 || buf[0] == 1) &&
        (size_t)n - 1 <= e->topic_len &&
        memcmp(buf + 1, e->topic, (size_t)n - 1) == 0) {
      /* (to the peer whose message this was) */
      zmq_setsockopt(e->pub, buf[0] ? ZMQ_SUBSCRIBE : ZMQ_UNSUBSCRIBE,
                     buf + 1, (size_t)n - 1);
      if (buf[0])
        e->st.subscriptions++;
    } else if (n >= 1 && buf[0] == 1) {
      refused(e, fd);
    } /* (an unsubscription that cannot match: nothing to undo) */
    zmq_msg_close(&m);
  }
}

/* Is fd one of the connections the events endpoint accepted?  (It came
 * with a message a moment ago; libzmq's thread could have closed it since,
 * and the number been reused: then it is still one of ours, or nothing is
 * done.) */
static int ours(const events *e, int fd) {
  struct sockaddr_storage a;
  socklen_t al = sizeof(a);

  if (getsockname(fd, (struct sockaddr *)&a, &al) != 0)
    return 0;
  if (a.ss_family == AF_UNIX)
    return strncmp(e->pub_ep, "ipc://", 6) == 0 &&
           strncmp(((struct sockaddr_un *)&a)->sun_path, e->pub_ep + 6,
                   sizeof(((struct sockaddr_un *)&a)->sun_path)) == 0;
  if (a.ss_family == AF_INET)
    return ntohs(((struct sockaddr_in *)&a)->sin_port) == e->pub_port;
  if (a.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&a)->sin6_port) == e->pub_port;
  return 0;
}

/* The fewest bytes a subscription that cannot match takes on the wire:
 * a frame's flags and size, the 1 and at least one byte of topic (an
 * empty topic is a prefix of every topic: it matches). */
#define EV_REFUSED_MIN_BYTES 4u

/* Ends connection fd now, leaving the descriptor to libzmq to close; 0
 * when it did.  After shutdown(), Linux still hands over everything queued
 * for reading (up to the receive buffer, megabytes on loopback), which
 * libzmq reads and keeps; only new data gets a reset.  connect() to
 * AF_UNSPEC disconnects a TCP socket at once: an abortive close (the peer
 * gets a reset, the queues are emptied, later reads fail).  A socket it
 * already cut (TCP_CLOSE: libzmq has yet to see it) is left alone, so that
 * what libzmq read of it before does not count a second drop; so is one
 * that has received fewer bytes than EV_REFUSED_MAX subscriptions take: it
 * cannot have sent them (a new connection on a reused descriptor, the old
 * one's messages still queued).  A Unix socket takes no TCP_INFO, refuses
 * the disconnect and needs only shutdown(): its peer's writes fail at
 * once. */
static int cut(int fd) {
  tcpinfo ti;
  struct sockaddr sa;

  if (tcpinfo_get(fd, &ti) == 0) {
    if (ti.closed ||
        ti.bytes_received < (uint64_t)EV_REFUSED_MAX * EV_REFUSED_MIN_BYTES)
      return -1;
    memset(&sa, 0, sizeof(sa));
    sa.sa_family = AF_UNSPEC;
    if (connect(fd, &sa, sizeof(sa)) == 0)
      return 0;
  }
  return shutdown(fd, SHUT_RDWR);
}

/* A subscription from connection fd (-1: libzmq's own) could never match:
 * the connection goes after EV_REFUSED_MAX of them (above), counted for
 * the socket fd is now (its inode: a reused descriptor starts afresh). */
static void refused(events *e, int fd) {
  ev_peer *p;
  struct stat st;

  e->st.refused_subscriptions++;
  if (fd < 0 || fstat(fd, &st) != 0)
    return;
  p = &e->peers[(unsigned)fd % e->npeers]; /* (fd itself, below the
                                              descriptor limit) */
  if (p->fd != fd || p->ino != (uint64_t)st.st_ino ||
      uv_now(e->loop) - p->since_ms > EV_REFUSED_MS) {
    p->fd = fd;
    p->ino = (uint64_t)st.st_ino;
    p->refused = 0;
    p->since_ms = uv_now(e->loop);
  }
  if (++p->refused < EV_REFUSED_MAX)
    return;
  p->fd = -1;
  if (!ours(e, fd) || cut(fd) != 0)
    return;
  e->st.subscriber_drops++;
  log_at(e->drop_logged ? LOG_DEBUG : LOG_WARN, 0,
         "kv events: a peer of %s sent %u subscriptions that cannot match "
         "topic '%s': its connection dropped (counted in "
         "kvshare_kv_event_subscriber_drops_total; logged once)", e->pub_ep,
         EV_REFUSED_MAX, e->topic);
  e->drop_logged = 1;
}

static void on_pub(uv_poll_t *h, int status, int revents) {
  (void)status;
  (void)revents;
  take_subscriptions(h->data);
}

static void on_router(uv_poll_t *h, int status, int revents) {
  events *e = h->data;
  uint8_t frames[3][EV_ID_MAX];

  (void)status;
  (void)revents;
  for (;;) {
    int zev = 0, n = 0, more = 1, bad = 0;
    size_t sz = sizeof(zev), lens[3] = {0, 0, 0};

    if (zmq_getsockopt(e->router, ZMQ_EVENTS, &zev, &sz) < 0 ||
        !(zev & ZMQ_POLLIN))
      break;
    while (more) {
      zmq_msg_t m;

      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, e->router, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        break;  /* (a message comes whole or not at all) */
      }
      more = zmq_msg_more(&m);
      if (n < 3 && zmq_msg_size(&m) <= EV_ID_MAX) {
        lens[n] = zmq_msg_size(&m);
        memcpy(frames[n], zmq_msg_data(&m), lens[n]);
      } else {
        bad = 1;
      }
      n++;
      zmq_msg_close(&m);
    }
    if (n > 0)
      serve_replay(e, frames, lens, n, bad);
    else if (zmq_errno() != EINTR)
      break;
  }
}

/* ---- open / close ------------------------------------------------------ */

static void on_closed(uv_handle_t *h) {
  events *e = h->data;

  if (--e->open_handles > 0)
    return;
  for (uint32_t i = 0; i < e->count; i++)
    blob_unref(NULL, e->kept[(e->head + i) % e->cap].blob);
  free(e->kept);
  free(e->peers);
  free(e->srcs);
  free(e->ents);
  free(e->tokens);
  free(e->emap);
  for (uint32_t i = 0; i < e->nloras; i++)
    free(e->loras[i]);
  msgpack_sbuffer_destroy(&e->body);
  msgpack_sbuffer_destroy(&e->xb);
  free(e);
}

static void *bind_socket(events *e, int type, const char *ep, int hwm,
                         char *err, size_t len) {
  void *s = zmq_socket(e->zctx, type);
  int linger = EV_LINGER_MS, rcvhwm = EV_RCV_HWM, hs = EV_HANDSHAKE_MS;
  int manual = 1;
  int64_t maxmsg = EV_MSG_MAX;

  if (s == NULL) {
    snprintf(err, len, "zmq_socket: %s", zmq_strerror(zmq_errno()));
    return NULL;
  }
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
  /* Bounds on what a peer makes the daemon hold (above). */
  if (zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg)) < 0 ||
      zmq_setsockopt(s, ZMQ_RCVHWM, &rcvhwm, sizeof(rcvhwm)) < 0 ||
      zmq_setsockopt(s, ZMQ_HANDSHAKE_IVL, &hs, sizeof(hs)) < 0 ||
      (type == ZMQ_XPUB &&
       zmq_setsockopt(s, ZMQ_XPUB_MANUAL, &manual, sizeof(manual)) < 0)) {
    snprintf(err, len, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
    zmq_close(s);
    return NULL;
  }
  if (zmq_bind(s, ep) < 0) {
    snprintf(err, len, "cannot bind %s: %s", ep, zmq_strerror(zmq_errno()));
    zmq_close(s);
    return NULL;
  }
  return s;
}

int events_open(uv_loop_t *loop, const cfg *c, core *const *cores,
                uint32_t ncores, const char *medium, uint32_t block_size,
                events **out, char *err, size_t len) {
  core_observer obs;
  events *e;
  int fd, pfd = -1;
  size_t fsz = sizeof(fd);

  *out = NULL;
  if (!c->kv_events_endpoint[0])
    return 0;
  assert(ncores >= 1);
  e = calloc(1, sizeof(*e));
  if (e == NULL ||
      (e->kept = calloc(c->kv_events_buffer, sizeof(ev_kept))) == NULL ||
      (e->srcs = calloc(ncores, sizeof(ev_src))) == NULL) {
    if (e)
      free(e->kept);
    free(e);
    snprintf(err, len, "out of memory");
    return -1;
  }
  e->loop = loop;
  e->cap = c->kv_events_buffer;
  for (uint32_t i = 0; i < ncores; i++) {
    assert(cores[i] != NULL);
    e->srcs[i].e = e;
    e->srcs[i].cr = cores[i];
  }
  e->nsrcs = ncores;
  e->mediums[EV_POOL] = medium;
  /* (under a host pool, whose medium is CPU, the host tier's is told
   * apart) */
  e->mediums[EV_HOST] = strcmp(medium, "CPU") == 0 ? "CPU_TIER" : "CPU";
  e->mediums[EV_DISK] = "DISK";
  e->mediums[EV_REMOTE] = "REMOTE";
  e->format = c->kv_events_format;
  e->bs = block_size;
  msgpack_sbuffer_init(&e->xb);
  snprintf(e->topic, sizeof(e->topic), "%s", c->kv_events_topic);
  e->topic_len = strlen(e->topic);
  msgpack_sbuffer_init(&e->body);
  msgpack_packer_init(&e->pk, e, body_write);
  {
    /* Sequence numbers go on growing across restarts (the first is the
     * start time in microseconds): a subscriber of the daemon before sees
     * a jump, asks for a replay and gets this one's AllBlocksCleared. */
    struct timespec now;

    clock_gettime(CLOCK_REALTIME, &now);
    e->next_seq = (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000;
  }
  e->zctx = zmq_ctx_new();
  if (e->zctx == NULL) {
    snprintf(err, len, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    goto fail;
  }
  /* A subscriber's queue holds at most what the replay ring keeps. */
  e->pub = bind_socket(e, ZMQ_XPUB, c->kv_events_endpoint,
                       (int)c->kv_events_buffer, err, len);
  if (e->pub == NULL)
    goto fail;
  if (zmq_getsockopt(e->pub, ZMQ_FD, &pfd, &fsz) < 0) {
    snprintf(err, len, "ZMQ_FD: %s", zmq_strerror(zmq_errno()));
    goto fail;
  }
  {
    size_t eplen = sizeof(e->pub_ep) - 1;
    const char *colon;

    if (zmq_getsockopt(e->pub, ZMQ_LAST_ENDPOINT, e->pub_ep, &eplen) < 0)
      e->pub_ep[0] = '\0'; /* (then no drop: the endpoint is unknown) */
    colon = strrchr(e->pub_ep, ':');
    if (strncmp(e->pub_ep, "tcp://", 6) == 0 && colon)
      e->pub_port = atoi(colon + 1);
  }
  {
    struct rlimit rl;

    e->npeers = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < EV_PEERS_MAX
                    ? (uint32_t)rl.rlim_cur
                    : EV_PEERS_MAX;
    if (e->npeers == 0 || !(e->peers = calloc(e->npeers, sizeof(ev_peer)))) {
      snprintf(err, len, "out of memory");
      goto fail;
    }
    for (uint32_t i = 0; i < e->npeers; i++)
      e->peers[i].fd = -1;
  }
  if (c->kv_events_replay_endpoint[0]) {
    /* One whole replay fits a peer's queue. */
    int hwm = (int)(2 * (c->kv_events_buffer + 1) * 4);

    e->router = bind_socket(e, ZMQ_ROUTER, c->kv_events_replay_endpoint,
                            hwm, err, len);
    if (e->router == NULL)
      goto fail;
    if (zmq_getsockopt(e->router, ZMQ_FD, &fd, &fsz) < 0) {
      snprintf(err, len, "ZMQ_FD: %s", zmq_strerror(zmq_errno()));
      goto fail;
    }
    if (uv_poll_init(loop, &e->rpoll, fd) < 0) {
      snprintf(err, len, "cannot watch the replay socket");
      goto fail;
    }
    e->rpoll.data = e;
    uv_poll_start(&e->rpoll, UV_READABLE, on_router);
    e->open_handles++;
  }
  /* (the last handles: nothing fails after them) */
  uv_poll_init(loop, &e->ppoll, pfd);
  e->ppoll.data = e;
  uv_poll_start(&e->ppoll, UV_READABLE, on_pub);
  e->open_handles++;
  uv_prepare_init(loop, &e->prep);
  e->prep.data = e;
  e->open_handles++;

  all_cleared(e); /* (once: it clears what every core published) */
  memset(&obs, 0, sizeof(obs));
  obs.stored = on_stored;
  obs.removed = on_removed;
  obs.sealed = on_sealed;
  obs.tier = on_tier;
  for (uint32_t i = 0; i < e->nsrcs; i++) {
    ev_src *src = &e->srcs[i];
    int rc;

    obs.arg = src;
    rc = core_add_observer(src->cr, &obs);
    assert(rc == 0); /* (room for CORE_OBSERVERS: the daemon adds two at
                        most, this and the remote tier's) */
    (void)rc;
    /* (a persisted tier, restored) */
    core_tier_each(src->cr, tier_each, src);
  }
  log_info(0, "kv events: publishing on %s%s%s (topic '%s', medium %s, "
           "%s encoding)", c->kv_events_endpoint,
           e->router ? ", replay on " : "",
           e->router ? c->kv_events_replay_endpoint : "", e->topic, medium,
           e->format == EV_FORMAT_MAP ? "map" : "array");
  *out = e;
  return 0;

fail:
  if (e->router)
    zmq_close(e->router);
  if (e->pub)
    zmq_close(e->pub);
  if (e->zctx)
    zmq_ctx_term(e->zctx);
  free(e->kept);
  free(e->peers);
  free(e->srcs);
  msgpack_sbuffer_destroy(&e->body);
  msgpack_sbuffer_destroy(&e->xb);
  free(e);
  return -1;
}

void events_close(events *e) {
  if (e == NULL)
    return;
  for (uint32_t i = 0; i < e->nsrcs; i++)
    core_remove_observer(e->srcs[i].cr, &e->srcs[i]);
  flush(e);
  all_cleared(e);
  if (e->router) {
    uv_close((uv_handle_t *)&e->rpoll, on_closed);
    zmq_close(e->router);
  }
  uv_close((uv_handle_t *)&e->ppoll, on_closed);
  zmq_close(e->pub);
  zmq_ctx_term(e->zctx); /* up to the linger: the last batches go out */
  uv_close((uv_handle_t *)&e->prep, on_closed);
}

void events_get_stats(const events *e, events_stats *st) {
  memset(st, 0, sizeof(*st));
  if (e == NULL)
    return;
  *st = e->st;
  st->kept = e->count;
  st->kept_bytes = e->kept_bytes;
}
