"""events_flood — what one unauthenticated peer of the KV event sockets can
make kvshared hold, run by test_events_flood.sh.

A daemon publishes on tcp://127.0.0.1 with topic "kv".  A subscriber of
"kv" and one of "k" (a prefix) must get every batch; one of "kvx" gets
none (as from any PUB).  Then the floods: 200,000 distinct subscriptions
and one of 8 MiB from one peer, a 4 MiB subscription from another, and
10,000 replay requests of 100 KiB.  The daemon's heap (and, but under
ASan, its RSS) may grow by at most 16 MiB over all of them (it grew by
731 MB before the bounds); the refused
subscriptions are counted, and every 1024 of them from one connection drop
it (the flooder reconnects each time); the good subscribers, never
dropped, get the events of work done afterwards; the daemon exits 0 on
SIGTERM.

Usage: events_flood.py BUILD DIR
"""
import os
import socket
import sys
import threading
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvs_testlib import drive, free_port, metric as metric_of, rss, \
    start_daemon  # noqa: E402

BUILD, DIR = sys.argv[1], sys.argv[2]
GROWTH = 16 << 20


def fail(msg):
    print("FAIL: " + msg, flush=True)
    log = os.path.join(DIR, "d.log")
    if os.path.exists(log):
        print(open(log).read()[-4000:])
    sys.exit(1)


def metric(port, name):
    v = metric_of(port, name)
    if v is None:
        fail("no %s in /metrics" % name)
    return v


# What the daemon holds is its heap (kvshare_heap_bytes): bounded in both
# builds, as sampled.  RSS is bounded too in the plain build, where it
# follows the heap; under ASan it also counts the shadow memory and the
# size-class regions the sanitizer's allocator maps and keeps after frees,
# which follow how fast libzmq's allocations churn (+14 to +52 MiB here
# for a heap that peaked at +0.1 to +1.7 MiB; +69 MiB in a CI run): there
# it is printed, not bounded.  The allocator's quarantine (256 MiB by
# default) is kept small all the same.  (An ASan build: gcc's links
# libasan, clang's carries the runtime; both name __asan_init.)
env = dict(os.environ)
with open(os.path.join(BUILD, "kvshared"), "rb") as f:
    ASAN = b"__asan_init" in f.read()
if ASAN:
    env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") +
                           ":quarantine_size_mb=1:thread_local_quarantine_size_kb=64")
ev_port, mport = free_port(), free_port()
d, sock, _, ready = start_daemon(
    BUILD, DIR, "d",
    ["--pool-blocks", "64",
     "--kv-events-endpoint", "tcp://127.0.0.1:%d" % ev_port,
     "--kv-events-replay-endpoint", "ipc://" + os.path.join(DIR, "replay"),
     "--kv-events-topic", "kv", "--metrics-listen", "127.0.0.1:%d" % mport],
    env=env)
if not ready:
    fail("the daemon did not start")

ctx = zmq.Context()
subs = {}
for topic in (b"kv", b"k", b"kvx"):
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, topic)
    s.connect("tcp://127.0.0.1:%d" % ev_port)
    subs[topic] = s
time.sleep(0.5)


class RawSub:
    """A raw ZMTP 3.0 peer (NULL mechanism, socket type SUB) that sends
    subscription messages as fast as the socket takes them: pyzmq's own
    SUB cannot hold an 8 MiB subscription without crashing.  It waits for
    the daemon's greeting and READY first: a message that arrives before
    libzmq has sent its own READY fails the handshake ("unexpected
    command"), and the connection is dropped before it is counted."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        greeting = (b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) +
                    b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31)
        self.s.sendall(greeting)
        body = b"\x05READY" + b"\x0bSocket-Type" + (3).to_bytes(4, "big") + b"SUB"
        self.s.sendall(b"\x04" + bytes([len(body)]) + body)
        self.s.settimeout(10)
        self._read(64)  # its greeting
        flag = self._read(1)[0]  # its READY: a short or a long command
        size = self._read(1 if flag == 4 else 8)
        self._read(int.from_bytes(size, "big"))
        self.s.settimeout(None)

    def _read(self, n):
        b = b""
        while len(b) < n:
            got = self.s.recv(n - len(b))
            if not got:
                raise OSError("the daemon closed the connection")
            b += got
        return b

    def subscribe(self, topic):
        body = b"\x01" + topic
        if len(body) < 256:
            frame = b"\x00" + bytes([len(body)]) + body
        else:
            frame = b"\x02" + len(body).to_bytes(8, "big") + body
        try:
            self.s.sendall(frame)
            return True
        except OSError:  # the daemon dropped the connection
            return False

    def close(self):
        self.s.close()


def fill(first, n):
    lines = ["fill " + " ".join(str(first + 100 * k + i + 1) for i in range(33))
             for k in range(n)]
    rc, _, err = drive(BUILD, sock, lines, timeout=60)
    if rc != 0:
        fail("kvs_drive: " + err)


def received(s, wait=2.0):
    n = 0
    end = time.time() + wait
    while time.time() < end:
        if s.poll(100):
            msg = s.recv_multipart()
            if len(msg) != 3:
                fail("a message of %d frames" % len(msg))
            n += 1
    return n


fill(0, 4)
got = {t: received(s) for t, s in subs.items()}
print("before the floods: batches received %s" % got, flush=True)
if got[b"kv"] == 0 or got[b"k"] != got[b"kv"] or got[b"kvx"] != 0:
    fail("subscribers before the floods: %s" % got)
rss0, heap0 = rss(d.pid), metric(mport, "kvshare_heap_bytes")


class HeapWatch(threading.Thread):
    """The largest kvshare_heap_bytes seen, scraped every 50 ms until
    stopped (RSS keeps its high-water mark; the heap must be watched).  A
    scrape needs the daemon's loop thread, which answers 503 after a
    second when it is busy (under ASan, with the flood): such scrapes are
    counted and the watch goes on; only the ones answered are samples."""

    def __init__(self):
        super().__init__(daemon=True)
        self.top, self.n, self.failed = heap0, 0, 0
        self.halt = threading.Event()
        self.start()

    def run(self):
        while not self.halt.wait(0.05):
            try:
                v = metric_of(mport, "kvshare_heap_bytes")
            except Exception:  # (503, a timeout: the loop was busy)
                v = None
            if v is None:
                self.failed += 1
            else:
                self.top, self.n = max(self.top, v), self.n + 1

    def stop(self):
        self.halt.set()
        self.join()
        return self.top


watch = HeapWatch()

# 1. 200,000 distinct subscriptions, then one of 8 MiB, from one peer that
# connects again whenever it is dropped
a = RawSub(ev_port)
sent = reconnects = 0
while sent < 200000:
    if a.subscribe(b"flood-%07d" % sent):
        sent += 1
        continue
    a.close()
    reconnects += 1
    for _ in range(100):  # (the endpoint is bound again in a moment)
        try:
            a = RawSub(ev_port)
            break
        except OSError:
            time.sleep(0.05)
a.subscribe(b"x" * (8 << 20))
# 2. one subscription of 4 MiB, from another
b = RawSub(ev_port)
b.subscribe(b"y" * (4 << 20))
# 3. replay requests of 100 KiB
c = ctx.socket(zmq.DEALER)
c.setsockopt(zmq.SNDHWM, 100000)
c.setsockopt(zmq.LINGER, 0)
c.connect("ipc://" + os.path.join(DIR, "replay"))
for i in range(10000):
    c.send(b"r" * (100 << 10), zmq.DONTWAIT)
time.sleep(4)
peak, heap_peak = rss(d.pid), metric(mport, "kvshare_heap_bytes")
a.close()
b.close()
c.close(linger=0)
time.sleep(1)
after, heap_after = rss(d.pid), metric(mport, "kvshare_heap_bytes")
heap_top = max(watch.stop(), heap_peak, heap_after)
if watch.n < 10:
    fail("the heap was read only %d times during the floods" % watch.n)
refused = metric(mport, "kvshare_kv_event_refused_subscriptions_total")
drops = metric(mport, "kvshare_kv_event_subscriber_drops_total")
print("floods: %d subscriptions sent over %d connections; heap %+.1f MiB "
      "at most (%d reads, %d unanswered), %+.1f MiB at the end, %+.1f MiB "
      "after; RSS %+.1f MiB, %+.1f MiB; %d subscriptions refused; the "
      "flooding connection dropped %d times" %
      (sent, reconnects + 1, (heap_top - heap0) / 2**20, watch.n, watch.failed,
       (heap_peak - heap0) / 2**20, (heap_after - heap0) / 2**20,
       (peak - rss0) / 2**20, (after - rss0) / 2**20, refused, drops),
      flush=True)
if drops < 1 or drops > refused // 1024:
    fail("%d drops for %d refused subscriptions" % (drops, refused))
if heap_top - heap0 > GROWTH:
    fail("the daemon's heap grew by %d bytes (bound %d)" %
         (heap_top - heap0, GROWTH))
if not ASAN and max(peak, after) - rss0 > GROWTH:
    fail("the daemon grew by %d bytes (bound %d)" % (max(peak, after) - rss0,
                                                     GROWTH))
if refused < 1000:
    fail("only %d subscriptions refused" % refused)
if d.poll() is not None:
    fail("the daemon exited: %d" % d.returncode)

# The good subscribers still get what follows.
fill(100000, 4)
got = {t: received(s) for t, s in subs.items()}
print("after the floods: batches received %s" % got, flush=True)
if got[b"kv"] == 0 or got[b"k"] != got[b"kv"] or got[b"kvx"] != 0:
    fail("subscribers after the floods: %s" % got)
for s in subs.values():
    s.close(linger=0)
ctx.term()
d.terminate()
if d.wait(30) != 0:
    fail("exit %d on SIGTERM" % d.returncode)
print("PASS")
