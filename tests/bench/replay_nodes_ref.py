#!/usr/bin/env python3
"""An independent model of `kvshare-replay --nodes N --remote-tier-tokens R
--policy lru`: N LRU pools and one shared LRU store of block keys, no core.
Prints JSON: alone (no store) and shared (with it), per node the requests,
refused, prompt tokens, hit tokens and remote hit tokens, and the store's
writes, inserts, drops, reads (hit_blocks) and size at the end, all of which
must equal the replayer's exactly (tests/integration/test_replay_nodes.sh).

The rules, as the core and tools/replay/replay.c follow them (one request at
a time, in timestamp order, stable on ties; --limit keeps the first lines of
the file, before the sort):
- A block of bs tokens is named by (the trace block id its last token lies
  in, its place in the prompt): what its chained hash stands for.
- A prompt of n tokens needs ceil(n / bs) blocks; more than the pool has:
  refused (all-miss, nothing changes).
- Lookup: the longest run of the first (n - 1) // bs keys held by the pool
  (never the block of the last token).  Then, with a store, the run goes on
  with the keys the store holds; those are read (each touched, in order)
  and promoted: remote hits.
- The blocks hit on the device are in use; the request takes
  ceil(n / bs) - hit fresh blocks: free ones first, then the least recently
  used cached ones (evicted).
- Every full block not hit is sealed and written through to the store in
  prompt order (held: touched; else inserted, the least recent dropped when
  full).
- On release the full blocks become cached, the first the most recent (the
  core releases tail-first); the partial last block is just free.

usage: replay_nodes_ref.py TRACE --nodes N --capacity-tokens C
         --remote-tier-tokens R|unlimited [--split rr|prefix|prefix:K]
         [--block-size 16] [--limit L]
"""
import argparse
import collections
import json

M64 = (1 << 64) - 1


def mix(x):  # splitmix64's finalizer, as tools/replay/replay_nodes.c
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & M64
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def route(recs, nodes, split):
    if split == "rr":
        return [i % nodes for i in range(len(recs))]
    depth = 1 if split == "prefix" else int(split.split(":")[1])
    return [mix(r["hash_ids"][min(depth, len(r["hash_ids"])) - 1]) % nodes
            for r in recs]


def run(recs, where, nodes, cap, store_cap, bs):
    pools = [collections.OrderedDict() for _ in range(nodes)]
    store = collections.OrderedDict() if store_cap else None
    per = [dict(requests=0, refused=0, query_tokens=0, hit_tokens=0,
                remote_hit_tokens=0) for _ in range(nodes)]
    ops = dict(writes=0, inserts=0, drops=0, hit_blocks=0)
    for r, k in zip(recs, where):
        pool, st = pools[k], per[k]
        n, ids = r["input_length"], r["hash_ids"]
        st["requests"] += 1
        st["query_tokens"] += n
        need_all = -(-n // bs)
        if need_all > cap:
            st["refused"] += 1
            continue
        keys = [(ids[(j * bs + bs - 1) // 512], j) for j in range(n // bs)]
        full = (n - 1) // bs
        h = 0
        while h < full and keys[h] in pool:
            h += 1
        m = 0
        if store is not None:
            while h + m < full and keys[h + m] in store:
                m += 1
            for j in range(h, h + m):
                store.move_to_end(keys[j])
            ops["hit_blocks"] += m
        for j in range(h):
            del pool[keys[j]]  # in use
        need = need_all - h
        while cap - len(pool) - h < need:
            pool.popitem(last=False)
        if store is not None:
            for j in range(h + m, n // bs):
                ops["writes"] += 1
                if keys[j] in store:
                    store.move_to_end(keys[j])
                else:
                    ops["inserts"] += 1
                    if len(store) >= store_cap:
                        store.popitem(last=False)
                        ops["drops"] += 1
                    store[keys[j]] = None
        for j in range(n // bs - 1, -1, -1):
            pool[keys[j]] = None
            pool.move_to_end(keys[j])
        st["hit_tokens"] += (h + m) * bs
        st["remote_hit_tokens"] += m * bs
    if store is not None:
        ops["used"] = len(store)
    return {"per_node": per, "store": ops if store is not None else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--capacity-tokens", type=float, required=True)
    ap.add_argument("--remote-tier-tokens", required=True)
    ap.add_argument("--split", default="rr")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0)
    a = ap.parse_args()
    recs = []
    with open(a.trace) as f:
        for line in f:
            if line.strip():
                recs.append(json.loads(line))
                if a.limit and len(recs) == a.limit:
                    break
    recs.sort(key=lambda r: r["timestamp"])
    bs = a.block_size
    cap = int(a.capacity_tokens) // bs
    if a.remote_tier_tokens == "unlimited":
        store_cap = 1 << 62
    else:
        store_cap = int(float(a.remote_tier_tokens)) // bs
    where = route(recs, a.nodes, a.split)
    out = {"alone": run(recs, where, a.nodes, cap, 0, bs)}
    out["shared"] = run(recs, where, a.nodes, cap, store_cap, bs) \
        if store_cap else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
