#!/usr/bin/env python3
"""The baseline of the replayer's speed: a plain Python LRU prefix cache over
a Mooncake-format trace, at 16-token blocks named by (trace block id, place),
unlimited capacity, one request at a time in timestamp order; prints the
token hit rate (which must equal kvshare-replay's).

With options it is also the reference of `kvshare-replay --tenants N`
(tests/unit/test_replay_tenants.sh):
- --tenants N: a cache per tenant.  A user is the records with the same
  hash id at the key depth (--tenant-key K; auto: 1, or one more than the
  blocks every record shares), its tenant mix(that id) % N (splitmix64's
  finalizer); a record with fewer blocks is keyed by its last id.
- Unlimited (the default): a block is a hit when the same tenant has seen
  it before, along the prompt until the first miss, never the block of the
  last token.
- --capacity-tokens C: each tenant an LRU pool of (C // bs) // N blocks,
  as the core's lru policy runs one (the rules of replay_nodes_ref.py): a
  prompt needs ceil(n / bs) blocks (more than the pool: refused, all-miss);
  the blocks hit are in use while the rest are taken, free ones first,
  then the least recently used cached ones; on release the full blocks
  are cached, the first the most recent.
--json prints the totals and each tenant's counts.

usage: lru_sim.py TRACE [--tenants N] [--tenant-key auto|K]
         [--capacity-tokens C] [--block-size 16] [--limit L] [--json]
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


def tenants_of(recs, n, key):
    if n == 1:
        return [0] * len(recs)
    if key == "auto":
        first, common = recs[0]["hash_ids"], len(recs[0]["hash_ids"])
        for r in recs[1:]:
            ids, k = r["hash_ids"], 0
            while k < min(common, len(ids)) and ids[k] == first[k]:
                k += 1
            common = k
        depth = common + 1
    else:
        depth = int(key)
    return [mix(r["hash_ids"][min(depth, len(r["hash_ids"])) - 1]) % n
            for r in recs]


def lru_pool(pool, cap, n, keys, bs):
    """One request on an LRU pool of cap blocks: its hit blocks, or None
    when refused."""
    need_all = -(-n // bs)
    if need_all > cap:
        return None
    full = (n - 1) // bs
    h = 0
    while h < full and keys[h] in pool:
        h += 1
    for j in range(h):
        del pool[keys[j]]  # in use
    while cap - len(pool) - h < need_all - h:
        pool.popitem(last=False)
    for j in range(len(keys) - 1, -1, -1):
        pool[keys[j]] = None
        pool.move_to_end(keys[j])
    return h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--tenants", type=int, default=1)
    ap.add_argument("--tenant-key", default="auto")
    ap.add_argument("--capacity-tokens", type=float, default=0)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    recs = []
    with open(a.trace) as f:
        for line in f:
            if line.strip():
                recs.append(json.loads(line))
                if a.limit and len(recs) == a.limit:
                    break
    recs.sort(key=lambda r: r["timestamp"])
    bs, nt = a.block_size, a.tenants
    where = tenants_of(recs, nt, a.tenant_key)
    cap = int(a.capacity_tokens) // bs // nt
    caches = [collections.OrderedDict() for _ in range(nt)]
    per = [dict(requests=0, refused=0, query_tokens=0, hit_tokens=0)
           for _ in range(nt)]
    for r, t in zip(recs, where):
        cache, st = caches[t], per[t]
        n, ids = r["input_length"], r["hash_ids"]
        keys = [(ids[(j * bs + bs - 1) // 512], j) for j in range(n // bs)]
        st["requests"] += 1
        st["query_tokens"] += n
        if cap:
            h = lru_pool(cache, cap, n, keys, bs)
            if h is None:
                st["refused"] += 1
                continue
        else:
            h = 0
            while h < (n - 1) // bs and keys[h] in cache:
                h += 1
            for k in keys:
                cache[k] = None
                cache.move_to_end(k)
        st["hit_tokens"] += h * bs
    hit = sum(st["hit_tokens"] for st in per)
    query = sum(st["query_tokens"] for st in per)
    if a.json:
        print(json.dumps({"query_tokens": query, "hit_tokens": hit,
                          "token_hit_rate": hit / query,
                          "tenant_blocks": cap or None, "tenants": per}))
    else:
        print("%.4f" % (hit / query))


if __name__ == "__main__":
    main()
