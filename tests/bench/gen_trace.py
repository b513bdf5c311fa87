#!/usr/bin/env python3
"""A request trace in the Mooncake format with a shape of its own, to check
eviction policies away from the two real traces: many users, each with a
few conversations that grow turn by turn; system prompts and shared
documents drawn from Zipf distributions; now and then a long one-off
document (a scan).  Deterministic for a given --seed.

usage: gen_trace.py [--requests N] [--seed S] > trace.jsonl
"""
import argparse
import json
import random


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    next_id = [0]
    chained = {}

    def chain(raw):
        # Mooncake ids are chained: an id names its whole prefix, so the
        # same content after another prefix gets another id.
        out, parent = [], -1
        for x in raw:
            key = (parent, x)
            if key not in chained:
                chained[key] = len(chained)
            parent = chained[key]
            out.append(parent)
        return out

    def fresh(k):
        ids = list(range(next_id[0], next_id[0] + k))
        next_id[0] += k
        return ids

    systems = [fresh(rng.randint(1, 4)) for _ in range(32)]   # system prompts
    docs = [fresh(rng.randint(4, 40)) for _ in range(400)]    # shared documents
    sys_w = [1.0 / (i + 1) ** 1.1 for i in range(len(systems))]
    doc_w = [1.0 / (i + 1) ** 0.9 for i in range(len(docs))]
    live = []  # open conversations: their ids so far
    t = 0
    for _ in range(a.requests):
        t += rng.randint(0, 60)
        r = rng.random()
        if r < 0.05:  # a long one-off document: a scan
            ids = fresh(rng.randint(40, 120))
        elif r < 0.55 and live:  # the next turn of an open conversation
            i = rng.randrange(len(live))
            ids = live[i] + fresh(rng.randint(1, 6))
            if len(ids) > 200 or rng.random() < 0.25:
                live.pop(i)  # the conversation ends
            else:
                live[i] = ids
        else:  # a new conversation: a system prompt, maybe a document
            ids = list(rng.choices(systems, weights=sys_w)[0])
            if rng.random() < 0.5:
                ids += rng.choices(docs, weights=doc_w)[0]
            ids += fresh(rng.randint(1, 8))
            live.append(ids)
            if len(live) > 3000:  # users who never come back
                live.pop(rng.randrange(len(live)))
        n = 512 * (len(ids) - 1) + rng.randint(1, 512)
        print(json.dumps({"timestamp": t, "input_length": n,
                          "output_length": rng.randint(1, 800),
                          "hash_ids": chain(ids)}))


if __name__ == "__main__":
    main()
