/*
 * tcpinfo.h — what the kernel knows of a TCP connection, for events.c: the
 * kernel's own struct tcp_info (linux/tcp.h) has fields glibc's copy
 * (netinet/tcp.h, which libuv's header includes) lacks, and the two
 * headers cannot meet in one file.
 */
#ifndef KVS_DAEMON_TCPINFO_H
#define KVS_DAEMON_TCPINFO_H

#include <stdint.h>

typedef struct tcpinfo {
  int closed;              /* in TCP_CLOSE (reset or disconnected) */
  uint64_t bytes_received; /* payload bytes received since it opened
                              (UINT64_MAX: a kernel too old to say) */
} tcpinfo;

/* 0 and *ti for a TCP socket; -1 for anything else (a Unix socket). */
int tcpinfo_get(int fd, tcpinfo *ti);

#endif /* KVS_DAEMON_TCPINFO_H */
