/* sockpath.c — the default socket path (sockpath.h). */
#include "client/sockpath.h"

#include <stdio.h>
#include <stdlib.h>

#include "client/kvshare.h"

const char *kvs__default_socket(char *buf, size_t len) {
  const char *p = getenv("KVS_SOCKET");
  if (p && *p)
    return p;
  const char *x = getenv("XDG_RUNTIME_DIR");
  if (x && x[0] == '/' &&
      (size_t)snprintf(buf, len, "%s/kvshare/kvshared.sock", x) < len)
    return buf;
  return KVS_DEFAULT_SOCKET;
}
