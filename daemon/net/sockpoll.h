/*
 * sockpoll.h — polling the sessions' sockets for a while after a frame
 * instead of sleeping (socket_poll_us; off by default).
 *
 * A round trip over a Unix socket between two sleeping processes costs
 * two wake-ups, which on a VM are most of it (a 256-op scheduler step: 2.5
 * to 3x slower than the daemon's work on it).  After each frame read, a
 * uv_idle handle keeps the loop from blocking (epoll with a zero timeout)
 * for socket_poll_us, yielding the CPU each turn, so that the client's
 * next request finds the daemon awake; a client that spins on its reply
 * for a while (KVS_SOCKET_SPIN_US) takes out the other wake-up.  The cost
 * is a CPU kept busy while clients are busy, as with the request rings
 * (ring_poll_us), which spare the system calls too.
 */
#ifndef KVS_DAEMON_SOCKPOLL_H
#define KVS_DAEMON_SOCKPOLL_H

#include <stdint.h>
#include <uv.h>

typedef struct sockpoll {
  uv_idle_t idle;
  uint64_t ns;   /* socket_poll_us in ns; 0: off (no handle) */
  uint64_t last; /* uv_hrtime() of the last frame */
  int polling, closed;
  uint64_t frames, frames_awake; /* from sockets; of them, while polling */
} sockpoll;

/* Off (us 0) or ready to poll; nothing to close when off. */
void sockpoll_init(sockpoll *p, uv_loop_t *loop, uint32_t us);
/* Bytes were read from a socket: poll for p->ns from now (no-op when off
 * or closed). */
void sockpoll_kick(sockpoll *p);
/* A whole frame from a socket is handled: counted, and whether the daemon
 * was polling when it came (before the kick of its read). */
void sockpoll_frame(sockpoll *p);
/* Stops polling for good and closes the handle (the daemon is stopping);
 * logs how many frames found the daemon polling. */
void sockpoll_close(sockpoll *p);

#endif
