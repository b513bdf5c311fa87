#include "daemon/net/sockpoll.h"

#include <sched.h>

#include "daemon/log.h"

static void on_idle(uv_idle_t *h) {
  sockpoll *p = h->data;

  if (uv_hrtime() - p->last >= p->ns) {
    uv_idle_stop(h);
    p->polling = 0;
  } else {
    sched_yield(); /* a client on this core gets to run */
  }
}

void sockpoll_init(sockpoll *p, uv_loop_t *loop, uint32_t us) {
  p->ns = (uint64_t)us * 1000;
  p->last = 0;
  p->polling = 0;
  p->closed = 0;
  p->frames = p->frames_awake = 0;
  if (p->ns) {
    uv_idle_init(loop, &p->idle);
    p->idle.data = p;
  }
}

void sockpoll_kick(sockpoll *p) {
  if (!p->ns || p->closed)
    return;
  p->last = uv_hrtime();
  if (!p->polling && uv_idle_start(&p->idle, on_idle) == 0)
    p->polling = 1;
}

void sockpoll_frame(sockpoll *p) {
  if (!p->ns || p->closed)
    return;
  p->frames++;
  p->frames_awake += p->polling;
}

void sockpoll_close(sockpoll *p) {
  if (!p->ns || p->closed)
    return;
  p->closed = 1;
  p->polling = 0;
  uv_close((uv_handle_t *)&p->idle, NULL);
  log_info(0, "socket polling (socket_poll_us %llu): %llu of %llu frames "
           "came while the daemon polled", (unsigned long long)(p->ns / 1000),
           (unsigned long long)p->frames_awake, (unsigned long long)p->frames);
}
