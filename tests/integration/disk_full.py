"""disk_full — the disk tier on a full file system and on a slow disk, run by
test_disk_full.sh.

1. A 1 MiB tmpfs holds the tier file (sparse: its writes fail with ENOSPC
   once the file system is full).  Workers compute prompts until demotions
   fail; then nobody does anything for 3 s.  The failing writes back off:
   kvshare_tier_backoffs_total grows and io_errors grows by a few batches,
   not by hundreds a second (the pause doubles from 10 ms to 5 s).  The
   error is logged once, in words ("failed", then the reason).  Lookups
   still hit what the pool holds, the pool check passes, SIGTERM exits 0.
2. A disk whose writes never finish in time (--tier-fault write-slow):
   20 prompts of 3 blocks computed, all looked up twice (hitting blocks
   being written), 20 of 12 blocks computed: every Allocate is granted
   (kvs_drive stops at the first refusal), the pool check passes.
3. A disk whose every write takes 3 s (--tier-fault write-slow:3000):
   SIGTERM while writes are in flight exits 0 once the shutdown timeout
   has passed, saying that tier I/O was left behind (not "0 copies
   still in flight" and status 1).

Usage: disk_full.py BUILD DIR   (exit 77: cannot mount a tmpfs)
"""
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvs_testlib import drive as run_drive, free_port, metric as metric_of, \
    start_daemon  # noqa: E402

BUILD, DIR = sys.argv[1], sys.argv[2]
BS = 16


def fail(msg, log=None):
    print("FAIL: " + msg, flush=True)
    if log and os.path.exists(log):
        print(open(log).read()[-5000:])
    sys.exit(1)


def start(name, *opts):
    p, sock, log, ready = start_daemon(
        BUILD, DIR, name, ["--pool-blocks", "64", "--num-layers", "1",
                           "--head-dim", "16"] + list(opts))
    if not ready:
        fail("daemon %s did not start" % name, log)
    return p, sock, log


def drive(sock, lines, log=None):
    rc, out, err = run_drive(BUILD, sock, lines)
    if rc != 0:
        fail("kvs_drive: %s" % err, log)
    return out


def metric(port, name, tier="disk"):
    v = metric_of(port, name, '{tier="%s"}' % tier)
    if v is None:
        fail("no %s{tier=\"%s\"} in /metrics" % (name, tier))
    return v


def prompt(k, blocks=1):
    return " ".join(str(100000 * k + i + 1) for i in range(BS * blocks + 1))


# ---- 1. a full file system ---------------------------------------------------
mnt = os.path.join(DIR, "mnt")
os.mkdir(mnt)
if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", mnt],
                  capture_output=True).returncode != 0:
    print("SKIP: cannot mount a 1 MiB tmpfs (needs root)")
    sys.exit(77)
try:
    port = free_port()
    p, sock, log = start("full", "--disk-tier", os.path.join(mnt, "tier"),
                         "--disk-tier-bytes", "32M",
                         "--metrics-listen", "127.0.0.1:%d" % port)
    k = 0
    deadline = time.time() + 60
    while metric(port, "kvshare_tier_io_errors_total") == 0:
        if time.time() > deadline:
            fail("no write failed on a full 1 MiB file system", log)
        out = drive(sock, ["fill " + prompt(k + i) for i in range(32)])
        k += 32
    time.sleep(0.5)  # (the batch in flight)
    e0 = metric(port, "kvshare_tier_io_errors_total")
    b0 = metric(port, "kvshare_tier_backoffs_total")
    time.sleep(3)
    e1 = metric(port, "kvshare_tier_io_errors_total")
    b1 = metric(port, "kvshare_tier_backoffs_total")
    print("full file system: %d prompts; in 3 s idle, io_errors %d -> %d, "
          "backoffs %d -> %d" % (k, e0, e1, b0, b1), flush=True)
    if b1 <= b0 and e1 > e0:
        fail("writes failed again without a back-off", log)
    if b1 == 0:
        fail("no back-off counted", log)
    # (a doubling pause from 10 ms fits about 9 tries in 3 s, each a batch
    # of at most the window's 16 blocks)
    if e1 - e0 > 200:
        fail("%d failed writes in 3 s idle: a retry storm" % (e1 - e0), log)
    text = open(log).read()
    lines = [l for l in text.splitlines() if "disk tier: write of slot" in l]
    # (the write that meets the full file system comes back short, the
    # next ones fail with ENOSPC: the first is logged)
    if len(lines) != 1 or not re.search(
            r"write of slot \d+ (failed \(.*No space left on device|came "
            r"back short: \d+ of \d+ bytes)", lines[0]):
        fail("the write error's log line: %r" % lines, log)
    print(lines[0][lines[0].index("disk tier"):])
    # What the pool holds still hits.
    out = drive(sock, ["probe " + prompt(k - 1)])
    if out != [["probe", str(BS)]]:
        fail("a prompt the pool holds: %s" % out, log)
    r = subprocess.run([os.path.join(BUILD, "kvshare"), "--socket", sock,
                        "stats", "--check"], capture_output=True, text=True)
    if r.returncode != 0:
        fail("stats --check: %s %s" % (r.stdout, r.stderr), log)
    p.terminate()
    if p.wait(30) != 0:
        fail("exit %d on SIGTERM" % p.returncode, log)
finally:
    subprocess.run(["umount", "-l", mnt])

# ---- 2. a slow disk and lookups: Allocate is never refused for nothing ------
# (the run: prompts computed, all looked up twice, more computed,
# 12 blocks each, while no write down ever finishes; the lookups hit the
# blocks being written)
p, sock, log = start("window", "--disk-tier", os.path.join(DIR, "wtier"),
                     "--disk-tier-bytes", "8M",
                     "--tier-fault", "write-slow:60000")
out = drive(sock, ["fill " + prompt(2000 + i, 3) for i in range(20)], log)
for _ in range(2):
    out = drive(sock, ["probe " + prompt(2000 + i, 3) for i in range(20)], log)
hits = sum(1 for o in out if o[0] == "probe" and int(o[1]) > 0)
out = drive(sock, ["fill " + prompt(3000 + i, 12) for i in range(20)], log)
refused = open(log).read().count("ENOSPC")
r = subprocess.run([os.path.join(BUILD, "kvshare"), "--socket", sock,
                    "stats", "--check"], capture_output=True, text=True)
print("slow disk, lookups between: %d of 20 looked up hit; 20 more of 12 "
      "blocks computed, every Allocate granted" % hits)
if r.returncode != 0 or refused:
    fail("stats --check: %s %s" % (r.stdout, r.stderr), log)
p.kill()
p.wait()

# ---- 3. a slow disk, and SIGTERM -----------------------------------------------
p, sock, log = start("slow", "--disk-tier", os.path.join(DIR, "tier"),
                     "--disk-tier-bytes", "8M",
                     "--tier-fault", "write-slow:3000",
                     "--shutdown-timeout-ms", "300")
drive(sock, ["fill " + prompt(1000 + i) for i in range(64)])
time.sleep(0.3)  # (the first demotions reach the disk)
t0 = time.time()
p.terminate()
rc = p.wait(30)
took = time.time() - t0
text = open(log).read()
print("slow disk: SIGTERM -> exit %d after %.1f s" % (rc, took))
if rc != 0:
    fail("exit %d on SIGTERM during slow writes" % rc, log)
if "tier I/O still in flight" not in text:
    fail("the log does not say tier I/O was left behind", log)
if "copies still in flight" in text:
    fail("the log blames copies", log)
print("PASS")
