/*
 * tcpinfo.c — see tcpinfo.h.
 */
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>

#include "daemon/observe/tcpinfo.h"

/* TCP_CLOSE of the kernel's TCP states (include/net/tcp_states.h; the uapi
 * header has no names for them). */
#define TCPINFO_CLOSE 7

int tcpinfo_get(int fd, tcpinfo *out) {
  struct tcp_info ti;
  socklen_t tl = sizeof(ti);

  memset(&ti, 0, sizeof(ti));
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0)
    return -1;
  out->closed = ti.tcpi_state == TCPINFO_CLOSE;
  out->bytes_received =
      tl >= offsetof(struct tcp_info, tcpi_bytes_received) +
                sizeof(ti.tcpi_bytes_received)
          ? (uint64_t)ti.tcpi_bytes_received
          : UINT64_MAX;
  return 0;
}
