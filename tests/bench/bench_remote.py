#!/usr/bin/python3
"""bench_remote -- how fast blocks come up from the remote tier, against
redis-benchmark's GET of values of the same size at the same pipeline
depth over the same Unix socket, in the same run.

One redis-server (Unix socket, no persistence).  Daemon A (the writer)
commits PROMPTS prompts of DEPTH full blocks each; every block is written
through to Redis.  Daemon B (the reader, its own pool of 2 * DEPTH blocks,
so nothing it brought up before is still resident) looks each prompt up
from a C client (tests/bench/bench_client_remote.c):
one pipelined round trip of DEPTH GETs, checksums, copies into its pool.
Its rate is promoted blocks per second over the lookups (one client, one
lookup at a time); the baseline is `redis-benchmark -c 1 -P DEPTH -t
set,get -r KEYS -d VALUE` over as many keys as the reader's blocks (its
GET line).  Rounds alternate the two.  Block sizes
64 and 256 KiB (fp16, 16-token blocks, 4 KV heads of 128, 2 or 8 layers).
$KVS_BUILD names the build; needs redis-server and redis-benchmark.
"""
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

build = os.path.abspath(os.environ.get("KVS_BUILD", "build"))
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "client", "python"))
os.environ.setdefault("KVS_LIBRARY", os.path.join(build, "libkvshare.so.0"))
import kvshare  # noqa: E402

if not shutil.which("redis-server") or not shutil.which("redis-benchmark"):
    print("SKIP: bench_remote needs redis-server and redis-benchmark (redis-server, redis-tools)")
    sys.exit(0)

DEPTH = 32
PROMPTS = 48
ROUNDS = 5
BS = 16
tmp = tempfile.mkdtemp(prefix="kvs-benchr-")
rsock = os.path.join(tmp, "redis.sock")
procs = []


def start(args, ready_word=None):
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    procs.append(p)
    if ready_word:
        for line in p.stdout:
            if line.startswith(ready_word):
                break
    return p


def daemon(name, layers, pool_blocks, extra):
    sock = os.path.join(tmp, name + ".sock")
    start([f"{build}/kvshared", "serve", "--socket", sock, "--backend", "host",
           "--num-layers", str(layers), "--num-kv-heads", "4", "--head-dim", "128",
           "--dtype", "fp16", "--block-size", str(BS), "--pool-blocks", str(pool_blocks),
           "--remote-tier", "unix://" + rsock, "--remote-tier-timeout-ms", "2000",
           "--remote-tier-inflight-bytes", "1G", "--tier-promote-max", str(DEPTH),
           "--model-id", f"bench-{layers}", "--log-level", "warn"] + extra, "ready")
    return sock


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait()


start(["redis-server", "--port", "0", "--unixsocket", rsock, "--save", "", "--appendonly",
       "no", "--maxmemory", "0", "--logfile", os.path.join(tmp, "redis.log")])
for _ in range(100):
    if os.path.exists(rsock):
        break
    time.sleep(0.05)


def prompt(k):
    return [k * 100000 + i for i in range(DEPTH * BS + 1)]


def reader_rate(sock):
    """Blocks per second a C client (bench_client_remote) gets brought up."""
    out = subprocess.run([f"{build}/tests/bench/bench_client_remote", sock, str(PROMPTS),
                          str(DEPTH), str(BS)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("bench_client_remote: " + out.stderr)
    with kvshare.Client(sock) as c:
        tiers, _ = c.tier_stats()
    return float(out.stdout), tiers


def redis_rate(value):
    # As many keys as the reader's blocks, at random (-r): SETs fill about
    # 98% of them first, then GETs read them (a working set as large as
    # the reader's, not one value hot in the cache).
    keys = PROMPTS * DEPTH
    out = subprocess.run(["redis-benchmark", "-s", rsock, "-c", "1", "-P", str(DEPTH),
                          "-n", str(keys * 4), "-r", str(keys), "-d", str(value),
                          "-t", "set,get", "--csv"],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        f = [x.strip('"') for x in line.split(",")]
        if f[0] == "GET":
            return float(f[1])
    raise SystemExit("no GET line from redis-benchmark:\n" + out)


try:
    print(f"{'block':>8} {'round':>5} {'remote promote blk/s':>22} {'redis GET/s':>12} {'ratio':>6}")
    for layers in (2, 8):
        a = daemon("a%d" % layers, layers, PROMPTS * (DEPTH + 1) + 8, [])
        b = daemon("b%d" % layers, layers, 2 * DEPTH + 8, ["--remote-tier-write", "no"])
        with kvshare.Client(a) as c:
            stride = c.layout.block_bytes
            for k in range(PROMPTS):
                c.lookup(k + 1, prompt(k))
                c.allocate(k + 1, DEPTH * BS + 1)
                c.commit(k + 1, 0, n=DEPTH * BS + 1)
            deadline = time.time() + 60
            while True:
                tiers, _ = c.tier_stats()
                if tiers[0].demotions >= PROMPTS * DEPTH or time.time() > deadline:
                    break
                time.sleep(0.05)
            assert tiers[0].demotions == PROMPTS * DEPTH, tiers
            for k in range(PROMPTS):
                c.free(k + 1)
        value = 80 + 4 * BS + stride
        ratios = []
        reader_rate(b)  # warm-up: the pool's and the heap's first touch
        redis_rate(value)
        for rnd in range(ROUNDS):
            ours, tiers = reader_rate(b)
            theirs = redis_rate(value)
            ratios.append(ours / theirs)
            print(f"{stride >> 10:>5}KiB {rnd:>5} {ours:>22.0f} {theirs:>12.0f} {ratios[-1]:>6.2f}")
        assert tiers[0].checksum_failures == 0
        print(f"{stride >> 10:>5}KiB median ratio {statistics.median(ratios):.2f} "
              f"(values of {value} bytes, pipeline depth {DEPTH}, one connection)")
        for p in procs[-2:]:
            stop(p)
        del procs[-2:]
    # What write-through costs a worker's prefill: cycles of lookup (a new
    # prompt), allocate, commit and free of DEPTH blocks on a daemon with
    # the remote tier against one without, alternating.
    print(f"\n{'block':>8} {'round':>5} {'cycle, remote on (ms)':>22} {'off (ms)':>9} {'ratio':>6}")
    won = daemon("won", 2, 4 * (DEPTH + 1), [])
    woff = start([f"{build}/kvshared", "serve", "--socket", os.path.join(tmp, "woff.sock"),
                  "--backend", "host", "--num-layers", "2", "--num-kv-heads", "4",
                  "--head-dim", "128", "--dtype", "fp16", "--block-size", str(BS),
                  "--pool-blocks", str(4 * (DEPTH + 1)), "--log-level", "warn"], "ready")
    socks = {"on": won, "off": os.path.join(tmp, "woff.sock")}
    base = [1 << 20]
    cyc = []

    def cycles(sock, promote=True, n=200):
        with kvshare.Client(sock) as c:
            c.set_promote(promote)
            t = time.perf_counter()
            for _ in range(n):
                base[0] += 1
                toks = [base[0] * 1000 + i for i in range(DEPTH * BS + 1)]
                c.lookup(1, toks, salt=b"w")
                c.allocate(1, len(toks))
                c.commit(1, 0, n=len(toks))
                c.free(1)
            return (time.perf_counter() - t) / n * 1e3

    cyc_w = []
    for rnd in range(ROUNDS):
        on, off = cycles(socks["on"]), cycles(socks["off"])
        onw = cycles(socks["on"], promote=False)
        cyc.append(on / off)
        cyc_w.append(onw / off)
        print(f"{'64KiB':>8} {rnd:>5} {on:>22.3f} {off:>9.3f} {on / off:>6.2f}   "
              f"no_promote: {onw:.3f} ms, {onw / off:.2f}")
    with kvshare.Client(socks["on"]) as c:
        tiers, _ = c.tier_stats()
    print(f"   64KiB median ratio {statistics.median(cyc):.2f} (a prefill cycle of {DEPTH} "
          f"blocks: the Lookup asks Redis, a miss; the blocks are written through), "
          f"{statistics.median(cyc_w):.2f} with no_promote (writes only); "
          f"{tiers[-1].demotions} blocks written, {tiers[-1].drops} skipped")
finally:
    for p in procs:
        p.kill()
        p.wait()
    shutil.rmtree(tmp, ignore_errors=True)
