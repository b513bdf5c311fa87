#!/usr/bin/python3
"""observe_check.py -- run by test_observe.sh against a live kvshared.

A router's view of the daemon, checked against the daemon itself:
  * KV events (pyzmq + msgpack, vLLM's KVEventBatch layout): a subscriber
    rebuilds the prefix index from BlockStored / BlockRemoved, filling the
    gaps of its late start with a replay; the rebuilt index must give, for
    every prompt, exactly the hit a real Lookup gets (kvs_drive probe), and
    hold as many hashes as the daemon's kvshare_indexed_blocks;
  * a late subscriber that replays from 0 rebuilds the same index;
  * /metrics parsed with prometheus_client's text parser: the families and
    their types, the pool's states against `kvshare stats --json`, the
    request-latency counts against the requests this script sent, the
    batch-size histogram against the one batch it sent;
  * malformed replay requests get the end marker, and the daemon goes on;
  * at SIGTERM, subscribers get AllBlocksCleared.

Two more modes, each against a daemon of its own:
  * long: block_size 1 and 5000-token prompts: one commit stores, and one
    allocation evicts, more blocks than one event holds (runs are cut);
  * tier: verify_tokens off and a host tier: blocks brought up from the
    tier are reported with their token ids like sealed ones.

usage: observe_check.py MODE BUILD SOCKET PUB_EP REPLAY_EP METRICS_URL
                        DAEMON_PID BLOCK_SIZE   (MODE: standard, long, tier)
"""
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request

import msgpack
import zmq
from prometheus_client.parser import text_string_to_metric_families

mode, build, sock, pub_ep, replay_ep, metrics_url, daemon_pid, BS = sys.argv[1:9]
daemon_pid, BS = int(daemon_pid), int(BS)
END = (2**64 - 1).to_bytes(8, "big")
ctx = zmq.Context()


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def scrape():
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        check(r.status == 200, f"/metrics status {r.status}")
        ctype = r.headers.get("Content-Type", "")
        check(ctype.startswith("text/plain; version=0.0.4"), f"content type {ctype}")
        text = r.read().decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return fams


def value(fams, name, labels=None, suffix=""):
    """The sample NAME+suffix whose labels include LABELS."""
    for fam in fams.values():
        for s in fam.samples:
            if s.name == name + suffix and all(
                    s.labels.get(k) == v for k, v in (labels or {}).items()):
                return s.value
    fail(f"no sample {name}{suffix} {labels}")


def cli_stats():
    out = subprocess.run([f"{build}/kvshare", "--socket", sock, "stats", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def drive(lines, env=None):
    """Runs kvs_drive over the script; returns its output lines."""
    p = subprocess.run([f"{build}/tests/integration/kvs_drive", sock],
                       input="\n".join(lines) + "\nquit\n", capture_output=True,
                       text=True, timeout=120, env=env)
    check(p.returncode == 0, f"kvs_drive exit {p.returncode}: {p.stderr}")
    return p.stdout.split("\n")[:-1]


class Index:
    """The prefix index as the events describe it."""

    def __init__(self):
        self.blocks = {}  # hash -> (parent, tokens)
        self.seq = -1     # the last batch applied
        self.first = None
        self.cleared = 0
        self.stored = self.removed = 0
        self.longest = 0  # most blocks in one event

    def apply(self, seq, payload):
        if self.first is None:  # the daemon's first batch: its start time
            self.first = seq    # in microseconds, so never 0
            check(abs(seq / 1e6 - time.time()) < 600, f"first seq {seq}")
        else:
            check(seq == self.seq + 1, f"batch {seq} after {self.seq}")
        self.seq = seq
        batch = msgpack.unpackb(payload, raw=False)
        check(isinstance(batch, list) and len(batch) == 2, f"batch {batch!r}")
        ts, events = batch
        check(isinstance(ts, float) and abs(ts - time.time()) < 600, f"ts {ts}")
        check(len(events) > 0, "an empty batch")
        for ev in events:
            kind = ev[0]
            if kind == "BlockStored":
                check(len(ev) == 7, f"BlockStored fields: {ev!r}")
                _, hashes, parent, tokens, bs, lora, medium = ev
                check(bs == BS and lora is None and medium == "CPU", f"{ev!r}")
                check(len(tokens) == len(hashes) * BS, "tokens per block")
                self.longest = max(self.longest, len(hashes))
                for i, h in enumerate(hashes):
                    check(isinstance(h, int) and 0 <= h < 2**64, f"hash {h!r}")
                    check(h not in self.blocks, f"stored twice: {h:x}")
                    self.blocks[h] = (parent, tuple(tokens[i * BS:(i + 1) * BS]))
                    parent = h
                    self.stored += 1
            elif kind == "BlockRemoved":
                check(len(ev) == 3 and ev[2] == "CPU", f"{ev!r}")
                self.longest = max(self.longest, len(ev[1]))
                for h in ev[1]:
                    check(h in self.blocks, f"removed but never stored: {h:x}")
                    del self.blocks[h]
                    self.removed += 1
            elif kind == "AllBlocksCleared":
                check(len(ev) == 1, f"{ev!r}")
                self.blocks.clear()
                self.cleared += 1
            else:
                fail(f"unknown event {ev!r}")

    def hit_tokens(self, prompt):
        """What a Lookup of prompt should hit: whole blocks, chained from the
        root, never the prompt's last token."""
        by_key = {(p, t): h for h, (p, t) in self.blocks.items()}
        parent, hit = None, 0
        for k in range((len(prompt) - 1) // BS):
            h = by_key.get((parent, tuple(prompt[k * BS:(k + 1) * BS])))
            if h is None:
                break
            parent, hit = h, hit + BS
        return hit


def replay(start, frames_out=None, delim=True):
    """Asks the replay socket for batches from start: [(seq, payload)]."""
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(replay_ep)
    d.send_multipart(frames_out or ([b""] if delim else []) + [start.to_bytes(8, "big")])
    got = []
    while True:
        check(d.poll(10000), "replay: no answer in 10 s")
        fr = d.recv_multipart()
        if delim:
            check(fr[0] == b"", f"replay frames {fr[:2]!r}")
            fr = fr[1:]
        check(len(fr) == 2, f"replay: {len(fr)} frames")
        if fr[0] == END:
            check(fr[1] == b"", "end marker payload")
            break
        got.append((int.from_bytes(fr[0], "big"), fr[1]))
    d.close()
    return got


def catch_up(sub, idx, count):
    """Reads the live stream until idx holds the daemon's first `count`
    batches, replaying gaps."""
    deadline = time.time() + 30
    while idx.first is None or idx.seq - idx.first + 1 < count:
        check(time.time() < deadline, f"events stop at {idx.seq}, want {count} batches")
        if not sub.poll(200):
            continue
        topic, seq8, payload = sub.recv_multipart()
        check(topic == b"", f"topic {topic!r}")
        seq = int.from_bytes(seq8, "big")
        if seq <= idx.seq:
            continue  # had it from a replay
        if seq > idx.seq + 1:  # missed some (joined late): replay them
            for rseq, rp in replay(max(idx.seq + 1, 0)):
                if idx.seq < rseq < seq:
                    idx.apply(rseq, rp)
        idx.apply(seq, payload)


def subscribe():
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(pub_ep)
    time.sleep(0.3)
    return sub


def batches_published():
    return int(value(scrape(), "kvshare_kv_event_batches", suffix="_total"))


def check_index(live, fams):
    """The event-built index against the daemon's counters."""
    indexed = int(value(fams, "kvshare_indexed_blocks"))
    evictions = int(value(fams, "kvshare_evictions", suffix="_total"))
    check(len(live.blocks) == indexed,
          f"events rebuild {len(live.blocks)} hashes, the daemon indexes {indexed}")
    st = cli_stats()  # (nothing runs between the scrape and this)
    check(st["indexed_blocks"] == indexed and st["evictions"] == evictions,
          f"stats says {st['indexed_blocks']} indexed, {st['evictions']} evictions")
    check(live.removed == evictions, f"{live.removed} removed, {evictions} evictions")
    check(live.stored == value(fams, "kvshare_kv_event_blocks", {"event": "stored"}, "_total"),
          "stored blocks: events vs metrics")
    return evictions


def stop_daemon(sub, live):
    """SIGTERM: subscribers learn that the cache is gone."""
    n = batches_published()
    catch_up(sub, live, n)
    os.kill(daemon_pid, signal.SIGTERM)
    catch_up(sub, live, n + 1)
    check(live.cleared == 2 and not live.blocks, "no AllBlocksCleared at shutdown")


if mode == "long":
    # One commit of a 5000-token prompt stores 4999 one-token blocks; the
    # next prompt's allocation evicts most of them at once.
    sub = subscribe()
    live = Index()
    a = list(range(1, 5001))
    b = list(range(100001, 105001))
    drive(["fill " + " ".join(map(str, a)), "fill " + " ".join(map(str, b))])
    fams = scrape()
    catch_up(sub, live, int(value(fams, "kvshare_kv_event_batches", suffix="_total")))
    evictions = check_index(live, fams)
    check(evictions > 4096 and live.longest == 4096,
          f"{evictions} evictions, longest event {live.longest}: runs not cut")
    probes = [a, b, a[:3000], b[:4500] + [7]]
    want = [live.hit_tokens(p) for p in probes]
    got = [int(l.split()[1]) for l in drive(["probe " + " ".join(map(str, p)) for p in probes])]
    check(got == want and want[1] == 4999, f"lookups {got} vs events {want}")
    print(f"long: {live.stored} stored, {live.removed} removed, longest event {live.longest}")
    stop_daemon(sub, live)
    print("observe_check long: all checks passed")
    sys.exit(0)

if mode == "tier":
    # Without verify_tokens, blocks brought up from the host tier still
    # carry their token ids (Index.apply checks every BlockStored).
    rng = random.Random(5)
    sub = subscribe()
    live = Index()
    prompts = [[rng.randrange(1, 50000) for _ in range(BS * 4 + 1)] for _ in range(40)]
    for p in prompts:  # one at a time: background demotion keeps up
        drive(["fill " + " ".join(map(str, p))])
        time.sleep(0.02)
    drive(["probe " + " ".join(map(str, p)) for p in prompts])
    fams = scrape()
    catch_up(sub, live, int(value(fams, "kvshare_kv_event_batches", suffix="_total")))
    check_index(live, fams)
    promoted = value(fams, "kvshare_tier_promotions", {"tier": "host"}, "_total")
    check(promoted > 0, "nothing promoted: the test proves less")
    print(f"tier: {int(promoted)} blocks promoted, {live.stored} stored with tokens")
    stop_daemon(sub, live)
    print("observe_check tier: all checks passed")
    sys.exit(0)

check(mode == "standard", f"unknown mode {mode}")

# ---- a workload with shared prefixes and evictions ---------------------------
rng = random.Random(11)
systems = [[rng.randrange(1, 50000) for _ in range(BS * rng.randrange(2, 6))]
           for _ in range(6)]
prompts = []
for i in range(60):
    s = systems[rng.randrange(len(systems))]
    prompts.append(s + [rng.randrange(1, 50000) for _ in range(rng.randrange(5, 70))])

sub = subscribe()
live = Index()
out = drive(["fill " + " ".join(map(str, p)) for p in prompts] + ["pings 300"])
check(len(out) == len(prompts) + 1, f"kvs_drive said {out}")
fams = scrape()
catch_up(sub, live, int(value(fams, "kvshare_kv_event_batches", suffix="_total")))
check(live.cleared == 1, f"AllBlocksCleared {live.cleared} times (want the start's)")
evictions = check_index(live, fams)
check(evictions > 0, "the workload evicted nothing: the test proves less")

# Every prompt's hit, from the rebuilt index, against the daemon's Lookup
# (with prompts never seen, and prefixes of seen ones).
probes = prompts + [[rng.randrange(1, 50000) for _ in range(40)] for _ in range(5)] + \
    [p[:rng.randrange(1, len(p))] for p in prompts[:20]]
want = [live.hit_tokens(p) for p in probes]
got = [int(l.split()[1]) for l in drive(["probe " + " ".join(map(str, p)) for p in probes])]
check(got == want, f"lookups vs the event-built index:\n got {got}\nwant {want}")
check(any(w > 0 for w in want) and any(w == 0 for w in want),
      f"hits all alike ({want}): the comparison proves less")
print(f"events: {live.seq - live.first + 1} batches, {live.stored} stored, {live.removed} removed, "
      f"{len(live.blocks)} indexed; {sum(1 for w in want if w)} of {len(want)} probes hit")

# A late subscriber: replay from 0 gives the same index.
late = Index()
for seq, payload in replay(0):
    late.apply(seq, payload)
check(late.first == live.first and late.seq == live.seq and late.blocks == live.blocks,
      "replay from 0 differs")
check(replay(live.seq + 1) == [], "replay past the end is not empty")
tail = replay(live.seq)
check([s for s, _ in tail] == [live.seq], f"replay of the last batch: {tail!r}")

# Malformed replay requests: the end marker alone; the daemon goes on.
for bad in ([b"", b"short"], [b"", b"x" * 9], [b"", b"", b"12345678"]):
    check(replay(0, frames_out=bad) == [], f"malformed {bad!r} got batches")
check(len(replay(0, delim=False)) == live.seq - live.first + 1, "replay without the delimiter")

# ---- /metrics against stats and against what this script sent ------------
fams = scrape()
st = cli_stats()
types = {
    "kvshare_pool_blocks": "gauge", "kvshare_lookups": "counter",
    "kvshare_hit_tokens": "counter", "kvshare_evictions": "counter",
    "kvshare_sessions": "gauge", "kvshare_requests": "gauge",
    "kvshare_protocol_errors": "counter", "kvshare_queued_bytes": "gauge",
    "kvshare_request_duration_seconds": "histogram", "kvshare_batch_ops": "histogram",
    "kvshare_frames": "counter", "kvshare_compact_frames": "counter",
    "kvshare_info": "gauge",
}
for name, t in types.items():
    check(name in fams and fams[name].type == t, f"family {name} ({t}) missing or mistyped")
for state in ("free", "cached", "used"):
    check(value(fams, "kvshare_pool_blocks", {"state": state}) == st[f"{state}_blocks"],
          f"pool {state}: metrics vs stats")
check(sum(value(fams, "kvshare_pool_blocks", {"state": s})
          for s in ("free", "cached", "used")) == st["num_blocks"], "pool states sum")
for m, k in (("kvshare_lookups", "lookups"), ("kvshare_hit_tokens", "hit_tokens"),
             ("kvshare_evictions", "evictions"), ("kvshare_lookup_tokens", "query_tokens"),
             ("kvshare_sealed_blocks", "sealed_blocks")):
    check(value(fams, m, suffix="_total") == st[k], f"{m} vs stats {k}")
n = len(prompts)
# The calls of this script's client go compact (the CLI's Stats do not).
cf = value(fams, "kvshare_compact_frames", suffix="_total")
check(4 * n <= cf <= value(fams, "kvshare_frames", suffix="_total"),
      f"compact frames {cf}: the client's {4 * n} calls at least, all frames at most")
# fill: lookup, allocate, commit, free; probe: lookup, free.  (The `stats`
# just run is one more stats request.)
np_ = len(probes)
for op, count in (("lookup", n + np_), ("allocate", n), ("commit", n), ("free", n + np_),
                  ("batch", 1)):
    c = value(fams, "kvshare_request_duration_seconds", {"op": op}, "_count")
    check(c == count, f"latency count of {op}: {c}, sent {count}")
    inf = value(fams, "kvshare_request_duration_seconds", {"op": op, "le": "+Inf"}, "_bucket")
    check(inf == c, f"{op}: +Inf bucket {inf} != count {c}")
    check(value(fams, "kvshare_request_duration_seconds", {"op": op}, "_sum") > 0, f"{op} sum")
check(value(fams, "kvshare_batch_ops", suffix="_count") == 1, "batch count")
check(value(fams, "kvshare_batch_ops", suffix="_sum") == 300, "batch sum")
check(value(fams, "kvshare_batch_ops", {"le": "256"}, "_bucket") == 0 and
      value(fams, "kvshare_batch_ops", {"le": "512"}, "_bucket") == 1, "batch buckets")
check(value(fams, "kvshare_kv_event_replays", suffix="_total") >= 5, "replays counted")

# A session through a request ring: its four requests (lookup, allocate,
# commit, free) counted as ring requests, and at least one wake-up (the
# daemon sleeps between sessions; its first post wakes it).
r0 = value(fams, "kvshare_ring_requests", suffix="_total")
w0 = value(fams, "kvshare_ring_wakeups", suffix="_total")
drive(["fill " + " ".join(str(9000000 + i) for i in range(40))],
      env=dict(os.environ, KVS_RING="1"))
f = scrape()
check(value(f, "kvshare_ring_requests", suffix="_total") - r0 == 4,
      "ring requests counted")
check(value(f, "kvshare_ring_wakeups", suffix="_total") - w0 >= 1, "ring wake-ups counted")
check(value(f, "kvshare_ring_socket_replies", suffix="_total") == 0, "no ring reply too big")

# Concurrent scrapes while a workload runs: every scrape is one moment.
churn = subprocess.Popen([f"{build}/tests/integration/kvs_drive", sock],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
churn.stdin.write("\n".join("fill " + " ".join(map(str, p)) for p in reversed(prompts)) + "\nquit\n")
churn.stdin.close()
for _ in range(20):
    f = scrape()
    total = sum(value(f, "kvshare_pool_blocks", {"state": s}) for s in ("free", "cached", "used"))
    check(total == st["num_blocks"], f"a scrape mid-workload: states sum to {total}")
check(churn.wait(60) == 0, "the churn driver failed")

stop_daemon(sub, live)
print("observe_check: all checks passed")
