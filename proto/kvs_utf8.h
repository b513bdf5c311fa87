/*
 * kvs_utf8.h — is a byte string UTF-8 (RFC 3629: shortest forms, no
 * surrogates, nothing over U+10FFFF)?  With `text`, control characters
 * (C0, DEL, C1) are refused too: what lands in /metrics labels, KV events
 * and logs must be text.  Header-only; the daemon's options, its event
 * stream and its checks of what clients send share it.
 */
#ifndef KVS_UTF8_H
#define KVS_UTF8_H

#include <stddef.h>
#include <stdint.h>

static inline int kvs_utf8_valid(const uint8_t *p, size_t n, int text) {
  const uint8_t *end = p + n;

  while (p < end) {
    unsigned c = *p, k, len, cp;

    if (c < 0x80) {
      if (text && (c < 0x20 || c == 0x7f))
        return 0;
      p++;
      continue;
    }
    if (c >= 0xc2 && c <= 0xdf)
      len = 1, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
      len = 2, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
      len = 3, cp = c & 0x07;
    else
      return 0;
    if ((size_t)(end - p) <= len)
      return 0;
    for (k = 1; k <= len; k++) {
      if ((p[k] & 0xc0) != 0x80)
        return 0;
      cp = cp << 6 | (p[k] & 0x3f);
    }
    if ((len == 2 && cp < 0x800) ||
        (len == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff) ||
        (text && cp >= 0x80 && cp <= 0x9f))
      return 0;
    p += len + 1;
  }
  return 1;
}

#endif
