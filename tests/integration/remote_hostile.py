"""remote_hostile — kvshared's remote tier against a Redis that misbehaves
(fake_redis.py), run by test_remote_hostile.sh.

Daemon A computes prompts and writes their blocks to the fake; daemon B
looks them up through it.  Then, one misbehaviour at a time, the fake
answers B's next GET badly: a reply nobody asked for, a 2^31-element array,
a 1.5 GB bulk streamed, a 10^11-byte bulk header and silence, a value cut
off mid-way and silence, an HTTP error.  After each: B is alive and answers
a Ping at once (its loop never stalls), the connection was dropped and
counted (kvshare_remote_dropped_total one more), and B reconnects and
serves the prompts again, every block a hit.  B's RSS stays within its
in-flight bound plus a constant.  At the end: one "dropped" line in B's log
(logged once), both pools whole (kvshare stats --check), exit 0 on SIGTERM.

Usage: remote_hostile.py BUILD DIR
"""
import os
import select
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_redis import FakeRedis  # noqa: E402
from kvs_testlib import free_port, metric as metric_of, rss, start_daemon  # noqa: E402

BUILD, DIR = sys.argv[1], sys.argv[2]
BS = 16          # tokens a block
BLOCKS = 4       # blocks a prompt
INFLIGHT = 4 << 20
SLACK = 16 << 20  # RSS noise allowed above the bound (allocator, ASan)


def fail(msg):
    print("FAIL: " + msg, flush=True)
    for name in ("a", "b"):
        p = os.path.join(DIR, name + ".log")
        if os.path.exists(p):
            print("---- daemon %s log" % name)
            print(open(p).read()[-6000:])
    sys.exit(1)


def start(name, *opts):
    p, sock, log, ready = start_daemon(
        BUILD, DIR, name,
        ["--pool-blocks", "256", "--num-layers", "1", "--head-dim", "16",
         "--remote-tier", "unix://" + os.path.join(DIR, "redis.sock"),
         "--remote-tier-inflight-bytes", str(INFLIGHT)] + list(opts))
    if not ready:
        fail("daemon %s did not start" % name)
    return p, sock


class Drive:
    """kvs_drive on a socket: one command, one answer line."""

    def __init__(self, sock):
        self.p = subprocess.Popen(
            [os.path.join(BUILD, "tests/integration/kvs_drive"), sock],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def cmd(self, line, wait=30):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        deadline = time.time() + wait
        while time.time() < deadline:
            r, _, _ = select.select([self.p.stdout], [], [], 0.2)
            if r:
                out = self.p.stdout.readline()
                if not out:
                    fail("kvs_drive ended at '%s'" % line[:40])
                return out.split()
        fail("no answer to '%s' in %d s: the daemon's loop is stuck"
             % (line[:40], wait))

    def close(self):
        self.p.stdin.write("quit\n")
        self.p.stdin.close()
        if self.p.wait(10) != 0:
            fail("kvs_drive exit %d" % self.p.returncode)


def prompt(k):
    return " ".join(str(1000 * k + i + 1) for i in range(BS * BLOCKS))


def metric(port, name):
    v = metric_of(port, name)
    if v is None:
        fail("no %s in /metrics" % name)
    return v


fake = FakeRedis(os.path.join(DIR, "redis.sock"))
a, asock = start("a")
port = free_port()
b, bsock = start("b", "--metrics-listen", "127.0.0.1:%d" % port,
                 "--remote-tier-timeout-ms", "1000")
da, db = Drive(asock), Drive(bsock)

NPROMPTS = 16
for k in range(NPROMPTS):
    out = da.cmd("fill " + prompt(k))
    if out != ["fill", "0", str(BLOCKS)]:
        fail("A fill %d: %s" % (k, out))
deadline = time.time() + 20
while fake.sets < NPROMPTS * BLOCKS and time.time() < deadline:
    time.sleep(0.05)
if fake.sets != NPROMPTS * BLOCKS:
    fail("the fake holds %d values, not %d" % (fake.sets, NPROMPTS * BLOCKS))

full = str(BS * (BLOCKS - 1))  # (a lookup leaves the last token to compute)
out = db.cmd("probe " + prompt(0))
if out != ["probe", full]:
    fail("B before any misbehaviour: %s (the fake serves A's blocks)" % out)
print("B hits A's prompt through the fake: %s tokens" % out[1])
rss0 = rss(b.pid)
dropped = metric(port, "kvshare_remote_dropped_total")
if dropped != 0:
    fail("dropped %d before any misbehaviour" % dropped)

# Each mode on a prompt B has not seen (so its GETs go to the fake).
modes = ["unsolicited", "huge_array", "garbage", "stall_bulk", "huge_bulk",
         "stall_value"]
k = 1
for mode in modes:
    fake.set_mode(mode, once=True)
    t0 = time.time()
    out = db.cmd("probe " + prompt(k))
    if out[0] != "probe" or int(out[1]) > BS * BLOCKS:
        fail("%s: probe answered %s" % (mode, out))
    if db.cmd("pings 1") != ["pings", "1"]:
        fail("%s: no pong" % mode)
    if b.poll() is not None:
        fail("%s: daemon B exited with %d" % (mode, b.returncode))
    deadline = time.time() + 20
    while (metric(port, "kvshare_remote_dropped_total") != dropped + 1 and
           time.time() < deadline):
        time.sleep(0.1)
    now = metric(port, "kvshare_remote_dropped_total")
    if now != dropped + 1:
        fail("%s: kvshare_remote_dropped_total %d, wanted %d"
             % (mode, now, dropped + 1))
    dropped = now
    t_drop = time.time() - t0
    # Reconnected (with back-off): a prompt B has not seen hits in full.
    k += 1
    deadline = time.time() + 30
    while True:
        out = db.cmd("probe " + prompt(k))
        if out == ["probe", full] or time.time() > deadline:
            break
        time.sleep(0.2)
    if out != ["probe", full]:
        fail("%s: B does not hit through the fake again: %s" % (mode, out))
    grown = rss(b.pid) - rss0
    print("%-12s probe %s tokens, dropped after %.1f s, reconnected; "
          "B's RSS %+.1f MiB" % (mode, out[1], t_drop, grown / 2**20),
          flush=True)
    if grown > INFLIGHT + SLACK:
        fail("%s: B's RSS grew by %d bytes, over the in-flight bound %d + %d"
             % (mode, grown, INFLIGHT, SLACK))
    k += 1

log = open(os.path.join(DIR, "b.log")).read()
n = log.count("dropped:")
if n != 1:
    fail("%d 'dropped' lines in B's log, wanted 1 (logged once)" % n)
for d, name, sock in ((da, "A", asock), (db, "B", bsock)):
    d.close()
    r = subprocess.run([os.path.join(BUILD, "kvshare"), "--socket", sock,
                        "stats", "--check"], capture_output=True, text=True)
    if r.returncode != 0:
        fail("%s: kvshare stats --check: %s %s" % (name, r.stdout, r.stderr))
for p, name in ((a, "A"), (b, "B")):
    p.terminate()
    if p.wait(30) != 0:
        fail("daemon %s exit %d on SIGTERM" % (name, p.returncode))
fake.stop()
print("PASS: %d misbehaviours dropped, counted, logged once; B reconnected "
      "after each" % len(modes))
