/*
 * trace.c — reader of Mooncake-format request traces (see trace.h).
 */
#include "tools/replay/trace.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_status.h"

/* Records longer than this are rejected (a prompt of 2^30 tokens is not a
 * prompt, it is a corrupt file). */
#define TRACE_MAX_INPUT (1u << 30)

static void trace_errf(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void trace_errf(char *err, size_t err_len, const char *fmt, ...) {
  va_list ap;
  if (err == NULL || err_len == 0)
    return;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
}

uint32_t trace_token(uint32_t hash_id, uint32_t offset) {
  /* splitmix64 finaliser over (id, offset); the high half is the token. */
  uint64_t x = ((uint64_t)hash_id << 9 | (offset & 511u)) + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (uint32_t)(x >> 32);
}

/* One trace block's tokens [0, n): trace_token(id, 0..n-1), in a loop the
 * compiler turns into vector code (on x86-64, a second copy for CPUs with
 * AVX-512's 64-bit multiply, picked at load time). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "default"),
               optimize("vect-cost-model=dynamic")))
#endif
static void trace_block_tokens(uint32_t id, uint32_t n, uint32_t *out) {
  const uint64_t base = ((uint64_t)id << 9) + 0x9e3779b97f4a7c15ull;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC ivdep
#endif
  for (uint32_t k = 0; k < n; k++) {
    uint64_t x = base + k; /* == (id << 9 | k) + the constant: k < 512 */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    out[k] = (uint32_t)(x >> 32);
  }
}

void trace_rec_tokens(const trace *t, const trace_rec *r, uint32_t *out) {
  const uint32_t *ids = trace_rec_hash_ids(t, r);
  for (uint32_t p = 0; p < r->input_length; p += TRACE_BLOCK_TOKENS) {
    uint32_t n = r->input_length - p;
    trace_block_tokens(ids[p / TRACE_BLOCK_TOKENS],
                       n < TRACE_BLOCK_TOKENS ? n : TRACE_BLOCK_TOKENS, out + p);
  }
}

void trace_free(trace *t) {
  if (t == NULL)
    return;
  free(t->recs);
  free(t->hash_ids);
  free(t);
}

static int trace_rec_cmp(const void *a, const void *b) {
  const trace_rec *x = a, *y = b;
  if (x->timestamp != y->timestamp)
    return x->timestamp < y->timestamp ? -1 : 1;
  return x->line < y->line ? -1 : x->line > y->line;
}

/* An integer member in [0, max], or -1 with err filled. */
static int trace_get_uint(json_t *obj, const char *key, uint64_t max,
                          uint64_t *v, size_t line, char *err, size_t err_len) {
  json_t *j = json_object_get(obj, key);
  if (!json_is_integer(j)) {
    trace_errf(err, err_len, "line %zu: \"%s\" missing or not an integer", line,
               key);
    return -1;
  }
  json_int_t x = json_integer_value(j);
  if (x < 0 || (uint64_t)x > max) {
    trace_errf(err, err_len, "line %zu: \"%s\" = %lld out of range", line, key,
               (long long)x);
    return -1;
  }
  *v = (uint64_t)x;
  return 0;
}

/* Appends one parsed line to t.  Returns 0, KVS_EINVAL or KVS_ENOMEM. */
static int trace_add_line(trace *t, json_t *obj, size_t line, size_t *cap_recs,
                          size_t *cap_ids, char *err, size_t err_len) {
  uint64_t ts, in, out;
  if (!json_is_object(obj)) {
    trace_errf(err, err_len, "line %zu: not a JSON object", line);
    return KVS_EINVAL;
  }
  if (trace_get_uint(obj, "timestamp", UINT64_MAX >> 1, &ts, line, err,
                     err_len) ||
      trace_get_uint(obj, "input_length", TRACE_MAX_INPUT, &in, line, err,
                     err_len) ||
      trace_get_uint(obj, "output_length", TRACE_MAX_INPUT, &out, line, err,
                     err_len))
    return KVS_EINVAL;
  if (in == 0) {
    trace_errf(err, err_len, "line %zu: input_length is 0", line);
    return KVS_EINVAL;
  }
  json_t *ids = json_object_get(obj, "hash_ids");
  if (!json_is_array(ids)) {
    trace_errf(err, err_len, "line %zu: \"hash_ids\" missing or not an array",
               line);
    return KVS_EINVAL;
  }
  size_t n = json_array_size(ids);
  size_t want = (size_t)((in + TRACE_BLOCK_TOKENS - 1) / TRACE_BLOCK_TOKENS);
  if (n != want) {
    trace_errf(err, err_len,
               "line %zu: %zu hash_ids for input_length %llu (want %zu)", line,
               n, (unsigned long long)in, want);
    return KVS_EINVAL;
  }
  if (t->num_recs == *cap_recs) {
    size_t cap = *cap_recs ? *cap_recs * 2 : 1024;
    trace_rec *p = realloc(t->recs, cap * sizeof(*p));
    if (p == NULL)
      return KVS_ENOMEM;
    t->recs = p;
    *cap_recs = cap;
  }
  if (t->num_hash_ids + n > *cap_ids) {
    size_t cap = *cap_ids ? *cap_ids : 4096;
    while (cap < t->num_hash_ids + n)
      cap *= 2;
    uint32_t *p = realloc(t->hash_ids, cap * sizeof(*p));
    if (p == NULL)
      return KVS_ENOMEM;
    t->hash_ids = p;
    *cap_ids = cap;
  }
  for (size_t i = 0; i < n; i++) {
    json_t *j = json_array_get(ids, i);
    json_int_t x = json_is_integer(j) ? json_integer_value(j) : -1;
    if (x < 0 || x >= (json_int_t)UINT32_MAX) {
      trace_errf(err, err_len, "line %zu: hash_ids[%zu] is not an id", line, i);
      return KVS_EINVAL;
    }
    t->hash_ids[t->num_hash_ids + i] = (uint32_t)x;
    if ((uint32_t)x > t->max_hash_id)
      t->max_hash_id = (uint32_t)x;
  }
  trace_rec *r = &t->recs[t->num_recs++];
  r->timestamp = ts;
  r->input_length = (uint32_t)in;
  r->output_length = (uint32_t)out;
  r->num_hash_ids = (uint32_t)n;
  r->line = (uint32_t)line;
  r->first_hash = t->num_hash_ids;
  t->num_hash_ids += n;
  t->input_tokens += in;
  t->output_tokens += out;
  if (in > t->max_input_length)
    t->max_input_length = (uint32_t)in;
  return 0;
}

int trace_load(const char *path, size_t limit, trace **out, char *err,
               size_t err_len) {
  int rc = 0;
  char *buf = NULL;
  size_t buf_cap = 0, cap_recs = 0, cap_ids = 0, line = 0;
  trace *t = NULL;
  FILE *f = fopen(path, "re");

  *out = NULL;
  trace_errf(err, err_len, "ok");
  if (f == NULL) {
    rc = -errno;
    trace_errf(err, err_len, "%s: %s", path, strerror(errno));
    goto out;
  }
  t = calloc(1, sizeof(*t));
  if (t == NULL) {
    rc = KVS_ENOMEM;
    goto out;
  }
  for (;;) {
    if (limit > 0 && t->num_recs == limit)
      break;
    errno = 0;
    ssize_t len = getline(&buf, &buf_cap, f);
    if (len < 0) {
      if (errno != 0) {
        rc = errno == ENOMEM ? KVS_ENOMEM : -errno;
        trace_errf(err, err_len, "%s: %s", path, strerror(errno));
        goto out;
      }
      break;
    }
    line++;
    size_t skip = strspn(buf, " \t\r\n");
    if ((ssize_t)skip == len)
      continue;
    json_error_t jerr;
    json_t *obj = json_loadb(buf, (size_t)len, 0, &jerr);
    if (obj == NULL) {
      rc = KVS_EINVAL;
      trace_errf(err, err_len, "line %zu: %s", line, jerr.text);
      goto out;
    }
    rc = trace_add_line(t, obj, line, &cap_recs, &cap_ids, err, err_len);
    json_decref(obj);
    if (rc != 0)
      goto out;
  }
  if (t->num_recs == 0) {
    rc = KVS_EINVAL;
    trace_errf(err, err_len, "%s: no records", path);
    goto out;
  }
  /* The ids are dense in the released traces; consumers index arrays by id,
   * so refuse ids that would make those arrays absurdly large. */
  if ((uint64_t)t->max_hash_id >= 16 * (uint64_t)t->num_hash_ids + (1u << 20)) {
    rc = KVS_EINVAL;
    trace_errf(err, err_len, "%s: hash ids are not dense (max %u for %zu ids)",
               path, t->max_hash_id, t->num_hash_ids);
    goto out;
  }
  qsort(t->recs, t->num_recs, sizeof(*t->recs), trace_rec_cmp);
  *out = t;
  t = NULL;
out:
  if (rc == KVS_ENOMEM)
    trace_errf(err, err_len, "%s: out of memory", path);
  free(buf);
  trace_free(t);
  if (f != NULL)
    fclose(f);
  return rc;
}

void trace_skip(trace *t, size_t n) {
  if (n > t->num_recs)
    n = t->num_recs;
  memmove(t->recs, t->recs + n, (t->num_recs - n) * sizeof(*t->recs));
  t->num_recs -= n;
  t->input_tokens = t->output_tokens = 0;
  t->max_input_length = 0;
  for (size_t i = 0; i < t->num_recs; i++) {
    const trace_rec *r = &t->recs[i];
    t->input_tokens += r->input_length;
    t->output_tokens += r->output_length;
    if (r->input_length > t->max_input_length)
      t->max_input_length = r->input_length;
  }
}
