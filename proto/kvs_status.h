/*
 * kvs_status.h — the status codes of kvshare, from one list.
 *
 * Every function of libkvshare, the daemon core and the wire protocol returns
 * 0 for success or one of the negative codes below.  System errors that pass
 * through unchanged are -errno (all errno values are below 4096); kvshare's
 * own codes start at -4001 so the two never collide.  The numeric values are
 * part of the wire format: never renumber, only append.
 */
#ifndef KVS_STATUS_H
#define KVS_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message) */
#define KVS_STATUS_MAP(X)                                                     \
  X(OK, 0, "success")                                                         \
  X(EINVAL, -4001, "invalid argument")                                        \
  X(ENOSPC, -4002, "no space: not enough free blocks")                        \
  X(ENOENT, -4003, "no such request")                                         \
  X(EEXIST, -4004, "request id already in use")                               \
  X(ERANGE, -4005, "value out of range")                                      \
  X(EMISMATCH, -4006, "tokens do not match what the request already holds")   \
  X(ESTATE, -4007, "operation not allowed in the request's current state")    \
  X(ENOMEM, -4008, "out of memory")                                           \
  X(EPROTO, -4009, "protocol error: malformed frame or message")              \
  X(EVERSION, -4010, "protocol version not supported")                        \
  X(ETOOBIG, -4011, "frame larger than the limit")                            \
  X(EUNKNOWN, -4012, "unknown message type")                                  \
  X(EPERM, -4013, "permission denied")                                        \
  X(ELIMIT, -4014, "limit reached")                                           \
  X(ECLOSED, -4015, "connection closed")                                      \
  X(EINTERNAL, -4016, "internal error")                                       \
  X(ENOTSUP, -4017, "not supported")                                          \
  X(EIO, -4018, "I/O error")                                                  \
  X(ENODEV, -4019, "no device: backend not available")                      \
  X(EDEVICE, -4020, "device fault: the GPU context is lost")                \
  X(ECHECKSUM, -4021, "stored block failed its checksum")

typedef enum kvs_status {
#define KVS_STATUS_ENUM(name, val, msg) KVS_##name = (val),
  KVS_STATUS_MAP(KVS_STATUS_ENUM)
#undef KVS_STATUS_ENUM
} kvs_status;

/* A static message for a status (kvshare code or -errno).  Never NULL. */
const char *kvs_strerror(int status);

/* The code's name without prefix ("ENOSPC", "OK"), or "E?" when unknown. */
const char *kvs_status_name(int status);

#ifdef __cplusplus
}
#endif
#endif /* KVS_STATUS_H */
