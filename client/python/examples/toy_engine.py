#!/usr/bin/env python3
"""A toy inference "engine" driving the kvshare cache from Python.

    python3 toy_engine.py [--socket PATH] [--decode N] [--json]

Two requests share a system prompt.  For each: look the prompt up (the
second finds the shared prefix cached), allocate slots for the rest,
"compute" K/V for those positions (a deterministic function of token id,
position, layer, head and dim standing in for a model), write them into
the blocks through numpy views of the host pool (no copy), commit, then
decode a few tokens (append one slot, compute, write, commit) and free.
The second request also checks that the K/V it was given for its cached
prefix equal what it would have computed.  Needs a daemon with a host pool
(kvshared serve --backend host).
"""
import argparse
import json
import sys

import numpy as np

import kvshare

VOCAB = 32000


def compute_kv(layout, tokens, positions):
    """K and V for tokens at positions: [n][layers][2][heads][head_dim],
    float32 (the model stand-in: any pure function of its inputs)."""
    L = layout
    t = np.asarray(tokens, np.float64)[:, None, None, None, None]
    p = np.asarray(positions, np.float64)[:, None, None, None, None]
    layer = np.arange(L.num_layers)[None, :, None, None, None]
    kv = np.arange(2)[None, None, :, None, None]
    h = np.arange(L.num_kv_heads)[None, None, None, :, None]
    d = np.arange(L.head_dim)[None, None, None, None, :]
    x = np.sin(t * 0.013 + p * 0.101 + layer * 0.7 + kv * 1.3 + h * 0.29 +
               d * 0.037)
    return x.astype(np.float32)


def to_pool_dtype(layout, x):
    if layout.dtype == kvshare.DTYPE_BF16:
        return kvshare.float32_to_bf16(x)
    return x.astype(layout.numpy_dtype)


def write_kv(client, table, start, tokens):
    """Write K/V of tokens at positions start.. into the request's blocks
    (table: its block table)."""
    L = client.layout
    bs = L.block_size
    positions = np.arange(start, start + len(tokens))
    kv = to_pool_dtype(L, compute_kv(L, tokens, positions))
    for i, pos in enumerate(positions):
        block = client.block_array(table[pos // bs])  # [layers][2][bs][h][d]
        block[:, :, pos % bs] = kv[i]


def check_cached(client, table, tokens):
    """The cached prefix's K/V equal what this request would compute."""
    L = client.layout
    bs = L.block_size
    want = to_pool_dtype(L, compute_kv(L, tokens, np.arange(len(tokens))))
    for pos in range(len(tokens)):
        got = client.block_array(table[pos // bs])[:, :, pos % bs]
        if got.tobytes() != want[pos].tobytes():
            raise SystemExit(f"cached K/V differ at position {pos}")
    return len(tokens) // bs


def next_token(client, table, pos):
    """Pick the next token from the K just written (deterministic)."""
    L = client.layout
    k = client.block_array(table[pos // L.block_size])[0, 0, pos % L.block_size]
    if L.dtype == kvshare.DTYPE_BF16:
        k = kvshare.bf16_to_float32(k)
    return int(abs(float(k.astype(np.float64).sum())) * 1000) % VOCAB


def run_request(client, req_id, prompt, decode):
    hit = client.lookup(req_id, prompt)
    table = list(hit.blocks)
    verified = check_cached(client, table, prompt[:hit.hit_tokens])
    rest = len(prompt) - hit.hit_tokens
    a = client.allocate(req_id, rest)
    table += a.blocks
    write_kv(client, table, hit.hit_tokens, prompt[hit.hit_tokens:])
    sealed = client.commit(req_id, hit.hit_tokens, n=rest)
    tokens = list(prompt)
    out = []
    for _ in range(decode):
        tok = next_token(client, table, len(tokens) - 1)
        a = client.append(req_id, 1)
        if a.cow is not None and not a.cow.done_by_daemon:
            client.copy_blocks([(a.cow.src, a.cow.dst)])
        if a.cow is not None:
            table[a.cow.index] = a.cow.dst
        table += a.blocks
        write_kv(client, table, len(tokens), [tok])
        sealed += client.commit(req_id, len(tokens), [tok])
        tokens.append(tok)
        out.append(tok)
    client.free(req_id)
    return {"id": req_id, "prompt": len(prompt), "hit": hit.hit_tokens,
            "computed": rest, "verified_blocks": verified, "sealed": sealed,
            "decoded": out}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", help="daemon socket ($KVS_SOCKET, default)")
    ap.add_argument("--decode", type=int, default=4)
    ap.add_argument("--json", action="store_true",
                    help="also print a JSON summary as the last line")
    args = ap.parse_args(argv)

    with kvshare.Client(args.socket, name="toy_engine") as c:
        L = c.layout
        bs = L.block_size
        system = [(7 * i + 3) % VOCAB for i in range(2 * bs + bs // 2)]
        prompts = [system + [101, 102, 103], system + [201, 202, 203, 204, 205]]
        print(f"pool: {L.num_blocks} blocks of {bs} tokens, {L.num_layers} "
              f"layers, {L.num_kv_heads}x{L.head_dim} {L.dtype_name} "
              f"({c.backend}); system prompt {len(system)} tokens")
        results = []
        for i, p in enumerate(prompts):
            r = run_request(c, i + 1, p, args.decode)
            results.append(r)
            print(f"request {r['id']}: prompt {r['prompt']} tokens, hit "
                  f"{r['hit']}, computed {r['computed']}, decoded "
                  f"{r['decoded']}")
        st = c.stats(check=True)
        print(f"daemon: {st.hit_tokens} hit tokens, {st.sealed_blocks} sealed "
              f"blocks, {st.used_blocks} in use, check "
              f"{'ok' if st.check_ok else st.check_message}")
        if args.json:
            print(json.dumps({"block_size": bs, "system": len(system),
                              "requests": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
