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


def scrape_text():
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        check(r.status == 200, f"/metrics status {r.status}")
        ctype = r.headers.get("Content-Type", "")
        check(ctype.startswith("text/plain; version=0.0.4"), f"content type {ctype}")
        return r.read().decode()


def scrape():
    return {f.name: f for f in text_string_to_metric_families(scrape_text())}


def check_exposition():
    """One scrape through promtool, and the families any exporter of a
    process has (version, process_*) against what /proc says."""
    text = scrape_text()
    p = subprocess.run(["promtool", "check", "metrics"], input=text,
                       capture_output=True, text=True)
    check(p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(),
          f"promtool check metrics: {p.returncode} {p.stdout} {p.stderr}")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    ver = subprocess.run([f"{build}/kvshared", "--version"], capture_output=True,
                         text=True).stdout.split()[1]
    info = [s for s in fams["kvshare_info"].samples][0]
    check(info.labels.get("version") == ver, f"kvshare_info version {info.labels} vs {ver}")
    fds = len(os.listdir(f"/proc/{daemon_pid}/fd"))
    got = value(fams, "process_open_fds")
    check(abs(got - fds) <= 3, f"process_open_fds {got}, /proc says {fds}")
    rss = int([l for l in open(f"/proc/{daemon_pid}/status") if l.startswith("VmRSS")][0]
              .split()[1]) * 1024
    got = value(fams, "process_resident_memory_bytes")
    check(0.5 * rss <= got <= 2 * rss, f"process_resident_memory_bytes {got}, VmRSS {rss}")
    heap = value(fams, "kvshare_heap_bytes")
    check(64 << 10 <= heap <= value(fams, "process_virtual_memory_bytes"),
          f"kvshare_heap_bytes {heap}, virtual "
          f"{value(fams, 'process_virtual_memory_bytes')}")
    soft = [l for l in open(f"/proc/{daemon_pid}/limits") if l.startswith("Max open files")][0]
    check(value(fams, "process_max_fds") == int(soft.split()[3]), "process_max_fds")
    st = open(f"/proc/{daemon_pid}/stat").read().rsplit(")", 1)[1].split()
    cpu = (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
    got = value(fams, "process_cpu_seconds_total", suffix="")
    check(0 <= got <= cpu + 0.05, f"process_cpu_seconds_total {got}, /proc now {cpu}")
    check(abs(value(fams, "process_start_time_seconds") -
              value(fams, "kvshare_start_time_seconds")) < 5, "process_start_time_seconds")
    return fams


def check_hist(fams, name, labels, count):
    """A histogram's buckets climb to its count, which is `count` (an int,
    or a (low, high) range)."""
    fam = fams[name]
    check(fam.type == "histogram", f"{name} is a {fam.type}")
    b = [(float(s.labels["le"]), s.value) for s in fam.samples
         if s.name == name + "_bucket" and all(s.labels.get(k) == v for k, v in labels.items())]
    b.sort()
    check(b and all(b[i][1] <= b[i + 1][1] for i in range(len(b) - 1)), f"{name} buckets {b}")
    c = value(fams, name, labels, "_count")
    check(b[-1][0] == float("inf") and b[-1][1] == c, f"{name} +Inf bucket {b[-1]} vs count {c}")
    lo, hi = count if isinstance(count, tuple) else (count, count)
    check(lo <= c <= hi, f"{name}{labels} count {c}, want {lo}..{hi}")
    check((c == 0) == (value(fams, name, labels, "_sum") == 0), f"{name} sum")
    return c


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


def doc_fields():
    """The field lists of docs/operations.md ("Event fields"): {format:
    {name: [field, ...]}}, an optional field in brackets."""
    here = os.path.dirname(os.path.abspath(__file__))
    text = open(os.path.join(here, "..", "..", "docs", "operations.md")).read()
    block = text.split("<!-- event fields -->")[1]
    out = {"map": {}, "array": {}}
    for line in block.split("```")[1].strip().splitlines():
        fmt, name, *fields = line.split()
        out[fmt][name] = fields
    check(set(out["map"]) == set(out["array"]) ==
          {"EventBatch", "BlockStored", "BlockRemoved", "AllBlocksCleared"},
          f"docs/operations.md event fields: {out}")
    return out


FIELDS = doc_fields()
FORMAT = os.environ.get("KVS_EVENTS_FORMAT", "map")
DUMP = open(os.environ["KVS_EVENTS_DUMP"], "ab") if os.environ.get("KVS_EVENTS_DUMP") else None
POOL = "CPU"  # the host pool's medium
TIER_MEDIA = {"CPU_TIER", "DISK", "REMOTE"}


def decode_fields(fmt, name, obj):
    """obj (a map or an array) checked against the documented fields of
    name in format fmt: a dict by field name."""
    want = FIELDS[fmt][name]
    required = [f for f in want if not f.startswith("[")]
    if fmt == "map":
        check(isinstance(obj, dict), f"{name}: not a map: {obj!r}")
        optional = {f.strip("[]") for f in want} - set(required)
        check(set(required) <= set(obj) <= set(required) | optional,
              f"{name} keys {sorted(obj)}, documented {want}")
        return obj
    check(isinstance(obj, list) and len(obj) == len(required),
          f"{name}: {len(obj) if isinstance(obj, list) else obj!r} fields, "
          f"documented {required}")
    return dict(zip(required, obj))


def decode_batch(payload):
    """A KVEventBatch: (ts, [event dict, ...]), every field checked."""
    b = decode_fields(FORMAT, "EventBatch", msgpack.unpackb(payload, raw=False))
    events = []
    for ev in b["events"]:
        name = ev.get("type") if isinstance(ev, dict) else (ev[0] if ev else None)
        check(name in FIELDS[FORMAT] and name != "EventBatch", f"unknown event {ev!r}")
        d = decode_fields(FORMAT, name, ev)
        check(d["type"] == name, f"{d!r}")
        events.append(d)
    return b["ts"], events


def import_kvshare():
    """The repository's Python package (libkvshare from $KVS_LIBRARY)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "client", "python"))
    import kvshare
    return kvshare


def is_key(h):
    """A published block key: the daemon's 64-bit hash, or an engine's
    integer or bytes."""
    return (isinstance(h, int) and 0 <= h < 2**64) or \
        (isinstance(h, bytes) and 1 <= len(h) <= 32)


class Index:
    """The prefix index as the events describe it, and the copies below the
    pool by medium."""

    def __init__(self):
        self.blocks = {}  # key -> (parent, tokens), in the pool
        self.below = {m: set() for m in TIER_MEDIA}
        self.seq = -1     # the last batch applied
        self.first = None
        self.cleared = 0
        self.stored = self.removed = 0
        self.tier_stored = self.tier_removed = 0
        self.longest = 0  # most blocks in one event
        self.events = []  # every event applied, decoded

    def apply(self, seq, payload):
        if DUMP is not None:  # (for vllm_decode.py)
            DUMP.write(len(payload).to_bytes(4, "big") + payload)
            DUMP.flush()
        if self.first is None:  # the daemon's first batch: its start time
            self.first = seq    # in microseconds, so never 0
            check(abs(seq / 1e6 - time.time()) < 600, f"first seq {seq}")
        else:
            check(seq == self.seq + 1, f"batch {seq} after {self.seq}")
        self.seq = seq
        ts, events = decode_batch(payload)
        check(isinstance(ts, float) and abs(ts - time.time()) < 600, f"ts {ts}")
        check(len(events) > 0, "an empty batch")
        for ev in events:
            self.events.append(ev)
            kind = ev["type"]
            if kind == "AllBlocksCleared":
                self.blocks.clear()
                for m in self.below.values():
                    m.clear()
                self.cleared += 1
                continue
            hashes, medium = ev["block_hashes"], ev["medium"]
            check(isinstance(hashes, list) and hashes and all(is_key(h) for h in hashes),
                  f"hashes {ev!r}")
            self.longest = max(self.longest, len(hashes))
            if kind == "BlockStored":
                check(ev["block_size"] == BS and ev["lora_id"] is None, f"{ev!r}")
                check(ev["lora_name"] is None or isinstance(ev["lora_name"], str), f"{ev!r}")
                tokens, parent = ev["token_ids"], ev["parent_block_hash"]
                if "extra_keys" in ev:
                    check(len(ev["extra_keys"]) == len(hashes), f"extra keys {ev!r}")
                if medium in TIER_MEDIA:  # copies: no chain, no tokens
                    check(parent is None and tokens == [], f"{ev!r}")
                    for h in hashes:
                        check(h not in self.below[medium], f"stored twice in {medium}: {h!r}")
                        self.below[medium].add(h)
                        self.tier_stored += 1
                    continue
                check(medium == POOL, f"medium {ev!r}")
                check(len(tokens) == len(hashes) * BS, "tokens per block")
                for i, h in enumerate(hashes):
                    check(h not in self.blocks, f"stored twice: {h!r}")
                    self.blocks[h] = (parent, tuple(tokens[i * BS:(i + 1) * BS]))
                    parent = h
                    self.stored += 1
            else:
                if medium in TIER_MEDIA:
                    for h in hashes:
                        check(h in self.below[medium], f"removed from {medium}, never stored: {h!r}")
                        self.below[medium].discard(h)
                        self.tier_removed += 1
                    continue
                check(medium == POOL, f"medium {ev!r}")
                for h in hashes:
                    check(h in self.blocks, f"removed but never stored: {h!r}")
                    del self.blocks[h]
                    self.removed += 1

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
    check(live.stored + live.tier_stored ==
          value(fams, "kvshare_kv_event_blocks", {"event": "stored"}, "_total"),
          "stored blocks: events vs metrics")
    check(live.removed + live.tier_removed ==
          value(fams, "kvshare_kv_event_blocks", {"event": "removed"}, "_total"),
          "removed blocks: events vs metrics")
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
    # The copies below, as the events tell them, against the tier's books
    # (once no demotion is in flight: used slots include those).
    for _ in range(100):
        fams = scrape()
        catch_up(sub, live, int(value(fams, "kvshare_kv_event_batches", suffix="_total")))
        used = value(fams, "kvshare_tier_used_slots", {"tier": "host"})
        if len(live.below["CPU_TIER"]) == used:
            break
        time.sleep(0.05)
    check(len(live.below["CPU_TIER"]) == used and used > 0,
          f"events hold {len(live.below['CPU_TIER'])} host-tier copies, the tier {used}")
    fams = check_exposition()
    for d in ("promotion", "demotion"):
        n = value(fams, f"kvshare_tier_{d}s", {"tier": "host"}, "_total")
        check_hist(fams, f"kvshare_tier_{d}_duration_seconds", {"tier": "host"}, int(n))
    print(f"tier: {int(promoted)} blocks promoted, {live.stored} stored with tokens")
    stop_daemon(sub, live)
    print("observe_check tier: all checks passed")
    sys.exit(0)

if mode == "engine":
    # Commits carry an engine's own hashes (vLLM-style: SHA-256 of the
    # parent's hash and the block's tokens); every event about those blocks
    # must carry them, through evictions and the tiers, and chain by them.
    import hashlib
    kvshare = import_kvshare()

    def engine_hashes(prompt, as_int, lora):
        out, parent = [], b"root"
        for k in range(len(prompt) // BS):
            d = hashlib.sha256(parent + (lora or "").encode() + bytes(
                str(prompt[k * BS:(k + 1) * BS]), "ascii")).digest()
            out.append(int.from_bytes(d[-8:], "big") if as_int else d)
            parent = d
        return out

    rng = random.Random(7)
    sub = subscribe()
    live = Index()
    c = kvshare.Client(sock)
    systems = [[rng.randrange(1, 50000) for _ in range(BS * 3)] for _ in range(3)]
    want = {}  # published key -> (parent key, tokens): the engine's view
    rid = 0
    for i in range(30):
        rid += 1
        p = systems[i % 3] + [rng.randrange(1, 50000) for _ in range(BS * 2 + 3)]
        # One engine, one kind of hash; a LoRA adapter's KV differs, so its
        # requests are salted with it (the daemon's hashes differ too).
        as_int, lora = i % 3 == 0, ("adapter-%d" % (i % 3) if i % 3 else None)
        r = c.lookup(rid, p, salt=lora.encode() if lora else None)
        c.allocate(rid, len(p) - r.hit_tokens)
        hs = engine_hashes(p, as_int, lora)
        done = len(p) // BS - r.hit_tokens // BS
        extra = [msgpack.packb(["mm", i, k]) if k % 2 else None for k in range(done)]
        if i == 0:  # refusals first: a wrong count, extra keys that are not msgpack
            for bad, text in (((hs[:1], None), "engine hashes"),
                              ((hs[r.hit_tokens // BS:], [b"\xc1"] * done), "msgpack")):
                try:
                    c.commit(rid, r.hit_tokens, p[r.hit_tokens:], engine_hashes=bad[0],
                             extra_keys=bad[1])
                    fail(f"commit with bad keys accepted ({text})")
                except kvshare.KvsError as e:
                    check(e.name == "EINVAL" and text in e.message,
                          f"refusal: {e.name} {e.message!r}")
        args = dict(engine_hashes=hs[r.hit_tokens // BS:], lora_name=lora,
                    extra_keys=extra)
        if i % 2:  # one op, or a batch (then sent as a Batch of Envelopes)
            sealed = c.commit(rid, r.hit_tokens, p[r.hit_tokens:], **args)
        else:
            with c.batch() as b:
                op = b.commit(rid, r.hit_tokens, p[r.hit_tokens:], **args)
                b.ping(b"x")
            sealed = op.result
        check(sealed <= done, f"sealed {sealed} of {done}")
        parent = None
        for k, h in enumerate(hs):
            want.setdefault(h, (parent, tuple(p[k * BS:(k + 1) * BS]), lora))
            parent = h
        c.free(rid)
    fams = scrape()
    catch_up(sub, live, int(value(fams, "kvshare_kv_event_batches", suffix="_total")))
    pool_stored = [e for e in live.events if e["type"] == "BlockStored" and e["medium"] == POOL]
    n_engine = n_extra = 0
    for ev in pool_stored:
        parent = ev["parent_block_hash"]
        for j, h in enumerate(ev["block_hashes"]):
            check(h in want, f"a pool block under a key the engine never made: {h!r}")
            wp, wt, wl = want[h]
            check(wp == parent and wt == tuple(ev["token_ids"][j * BS:(j + 1) * BS]),
                  f"block {h!r}: parent/tokens differ from the engine's")
            check(ev["lora_name"] == wl, f"lora {ev['lora_name']} for {wl}")
            if "extra_keys" in ev and ev["extra_keys"][j] is not None:
                x = ev["extra_keys"][j]
                check(isinstance(x, list) and x[0] == "mm", f"extra keys {x!r}")
                n_extra += 1
            parent = h
            n_engine += 1
    below = [e for e in live.events if e.get("medium") in TIER_MEDIA]
    for ev in below:
        for h in ev["block_hashes"]:
            check(h in want, f"a tier event under the daemon's hash: {h!r}")
    removed = [h for e in live.events if e["type"] == "BlockRemoved" and e["medium"] == POOL
               for h in e["block_hashes"]]
    check(all(h in want for h in removed), "a removal under the daemon's hash")
    check(len(removed) > 0 and len(below) > 0 and n_extra > 0,
          f"{len(removed)} removed, {len(below)} tier events, {n_extra} extra keys: "
          "the test proves less")
    check(any(isinstance(h, bytes) for h in want) and any(isinstance(h, int) for h in want),
          "both kinds of hash")
    if os.environ.get("KVS_WANT_REMOTE", "0") != "0":
        # (remote writes are acknowledged a little later: wait for them)
        for _ in range(100):
            if live.below["REMOTE"]:
                break
            time.sleep(0.05)
            catch_up(sub, live, batches_published())
        check(live.below["REMOTE"] and all(h in want for h in live.below["REMOTE"]),
              f"{len(live.below['REMOTE'])} blocks written to the remote tier, "
              "under the engine's keys")
        # the index has read past the scrape above: scrape again and read
        # up to it, so that both count the same batches
        fams = scrape()
        catch_up(sub, live, int(value(fams, "kvshare_kv_event_batches", suffix="_total")))
    check_index(live, fams)
    # The tiers' latency histograms: one count per block moved, as the
    # tiers' own counters say; remote reads one per chain read.
    fams = check_exposition()
    for t in ("host", "disk"):
        dem = value(fams, "kvshare_tier_demotions", {"tier": t}, "_total")
        check(dem > 0, f"no demotion to {t}: the test proves less")
        check_hist(fams, "kvshare_tier_demotion_duration_seconds", {"tier": t}, int(dem))
        pro = value(fams, "kvshare_tier_promotions", {"tier": t}, "_total")
        check_hist(fams, "kvshare_tier_promotion_duration_seconds", {"tier": t}, int(pro))
        print(f"{t} tier: {int(dem)} demotions, {int(pro)} promotions timed")
    if os.environ.get("KVS_WANT_REMOTE", "0") != "0":
        puts = value(fams, "kvshare_tier_demotions", {"tier": "remote"}, "_total")
        check(puts > 0, "no remote write")
        check_hist(fams, "kvshare_remote_put_duration_seconds", {}, int(puts))
        reads = value(fams, "kvshare_remote_reads", suffix="_total")
        check_hist(fams, "kvshare_remote_get_duration_seconds", {}, (0, int(reads)))
    # Hits computed from the engine-keyed index equal the daemon's.
    # (pool blocks only: the index the pool's events describe)
    c.set_promote(False)
    probes = [systems[i % 3] + [1, 2] for i in range(3)]
    got = [c.lookup(1000 + i, q, salt=b"adapter-%d" % i if i else None).hit_tokens
           for i, q in enumerate(probes)]
    for i in range(3):
        c.free(1000 + i)
    check(got == [live.hit_tokens(q) for q in probes], f"hits {got}")
    c.close()
    print(f"engine: {n_engine} pool blocks, {len(removed)} removals, "
          f"{sum(len(e['block_hashes']) for e in below)} tier blocks under engine keys, "
          f"{n_extra} with extra keys")
    stop_daemon(sub, live)
    print("observe_check engine: all checks passed")
    sys.exit(0)

if mode == "mixed":
    # Half the commits carry engine keys, half do not, over shared prefixes
    # that move through the host and disk tiers: every medium's stores and
    # removals must still pair up (Index.apply), whichever name a block
    # first went out under.  And keys no subscriber could decode are
    # refused.
    kvshare = import_kvshare()

    rng = random.Random(9)
    sub = subscribe()
    live = Index()
    c = kvshare.Client(sock)
    c.set_promote(False)
    systems = [[rng.randrange(1, 50000) for _ in range(BS * 2)] for _ in range(4)]
    prompts = [rng.choice(systems) + [rng.randrange(1, 50000)
                                      for _ in range(BS * rng.randrange(1, 4))]
               for _ in range(40)]  # each seen again, keyed or not, after
    keyed = 0                       # its blocks went down a tier
    for rid in range(1, 301):
        p = rng.choice(prompts)
        r = c.lookup(rid, p)
        c.allocate(rid, len(p) - r.hit_tokens)
        done = len(p) // BS - r.hit_tokens // BS
        kw = {}
        if rng.random() < 0.5 and done:
            kw = dict(engine_hashes=[rng.randrange(1, 2**64) for _ in range(done)])
            keyed += 1
        c.commit(rid, r.hit_tokens, p[r.hit_tokens:], **kw)
        c.free(rid)
    for bad in (b"\xa2\xff\xfe", b"\x81\xc0\xc0", b"\xd4\x01\x00", b"\xdd\xff\xff\xff\xff"):
        p = [rng.randrange(1, 50000) for _ in range(BS + 1)]
        r = c.lookup(999, p)
        c.allocate(999, len(p) - r.hit_tokens)
        try:
            c.commit(999, 0, p, engine_hashes=[7], extra_keys=[bad])
            fail(f"extra keys {bad!r} accepted")
        except kvshare.KvsError as e:
            check(e.name == "EINVAL" and "every subscriber decodes" in e.message,
                  f"refusal of {bad!r}: {e.name} {e.message}")
        c.free(999)
    time.sleep(0.3)
    fams = scrape()
    catch_up(sub, live, int(value(fams, "kvshare_kv_event_batches", suffix="_total")))
    check_index(live, fams)
    unused = int(value(fams, "kvshare_kv_event_key_failures", suffix="_total"))
    check(live.tier_removed > 0 and keyed > 50 and unused > 0,
          f"{live.tier_removed} tier removals, {keyed} keyed commits, {unused} keys "
          "of blocks with copies below: the test proves less")
    c.close()
    print(f"mixed: {keyed} of 300 commits keyed; {live.tier_stored} tier stores, "
          f"{live.tier_removed} tier removals, all paired; "
          f"{unused} keys not used (copies below under the daemon's hash)")
    stop_daemon(sub, live)
    print("observe_check mixed: all checks passed")
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
check_exposition()
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
