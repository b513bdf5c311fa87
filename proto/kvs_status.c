#include "kvs_status.h"

#include <string.h>

const char *kvs_strerror(int status) {
  switch (status) {
#define KVS_STATUS_MSG(name, val, msg) \
  case val:                            \
    return msg;
    KVS_STATUS_MAP(KVS_STATUS_MSG)
#undef KVS_STATUS_MSG
  default:
    break;
  }
  if (status < 0 && status > -4096)
    return strerror(-status);
  return "unknown status";
}

const char *kvs_status_name(int status) {
  switch (status) {
#define KVS_STATUS_STR(name, val, msg) \
  case val:                            \
    return #name;
    KVS_STATUS_MAP(KVS_STATUS_STR)
#undef KVS_STATUS_STR
  default:
    return "E?";
  }
}
