/*
 * sockpath.h — the socket path a client uses when none is given: linked
 * into libkvshare (kvs_connect) and into the kvshare CLI, which names the
 * path it tried in its messages.
 */
#ifndef KVS_CLIENT_SOCKPATH_H
#define KVS_CLIENT_SOCKPATH_H

#include <stddef.h>

/* $KVS_SOCKET when set, else $XDG_RUNTIME_DIR/kvshare/kvshared.sock when
 * that variable is an absolute path (written into buf), else
 * KVS_DEFAULT_SOCKET.  The result lives as long as buf and the
 * environment. */
const char *kvs__default_socket(char *buf, size_t len);

#endif
