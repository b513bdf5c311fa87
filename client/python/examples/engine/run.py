#!/usr/bin/env python3
"""A multi-turn chat workload on N engine processes, in three cache modes,
every answer checked against the model run from scratch.

    python3 run.py [--engines 4] [--model tiny|small|1b] [--weights F]
                   [--modes none,private,shared] [--faults] [--json]

A load balancer without KV awareness sends each turn of a conversation to
the next engine in turn: conversation c's turn t goes to engine (c + t) mod
N, never the one that answered the turn before.  Turn t of a conversation is the shared system
prompt, the conversation so far (its users' messages and the model's
replies) and a new user message; the engine answers with --reply tokens
(greedy).  The modes (engine.py): none (no prefix cache), private (a
daemon per engine, each with 1/N of the pool: the same memory in all),
shared (one kvshare daemon for all engines).

Printed per mode: time to first token (median, p99) measured from the
moment the balancer sent the request, prompt tokens computed (prefill),
tokens/s, decode tokens/s (per request after its first token, the median
over requests), and the ratios of the modes in the same run.

Checks (exit 1 when any fails): for every request, each generated token
is the from-scratch model's greedy choice at that position (or within
--tie of its best: a near tie), and the logits that chose the last token
equal the from-scratch logits within --tol (relative to their largest);
the shared mode must have served prefixes computed by another engine;
each daemon's invariant holds and no block stays in use.  --faults adds a
fourth run on the shared daemon with a pool too small for the workload
and a host tier under it (evictions, tier round trips), one engine killed
with SIGKILL in the middle of a step (its requests sent to the others),
and the same checks.
"""
import argparse
import collections
import json
import multiprocessing as mp
import os
import queue
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))
sys.path.insert(0, HERE)
os.environ.setdefault("KVS_LIBRARY", os.path.join(
    os.environ.get("KVS_BUILD", os.path.join(ROOT, "build")),
    "libkvshare.so.0"))
try:
    import kvshare  # an installed binding, else the one in this repository
except ImportError:
    sys.path.insert(1, os.path.join(ROOT, "client", "python"))
    import kvshare
import torch  # noqa: E402

import model as M  # noqa: E402
from engine import engine_main  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# ---- daemons ---------------------------------------------------------------

class Daemon:
    def __init__(self, build, tmp, name, args):
        self.socket = os.path.join(tmp, f"{name}.sock")
        self.log = os.path.join(tmp, f"{name}.log")
        r, w = os.pipe()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [os.path.join(build, "kvshared"), "serve", "--socket",
                 self.socket, "--ready-fd", str(w)] + args,
                stdout=log, stderr=subprocess.STDOUT, pass_fds=(w,))
        os.close(w)
        got, deadline = b"", time.monotonic() + 60
        while b"ready" not in got and time.monotonic() < deadline:
            rl, _, _ = select.select([r], [], [], 0.2)
            if rl:
                chunk = os.read(r, 256)
                if not chunk:
                    break
                got += chunk
            elif self.proc.poll() is not None:
                break
        os.close(r)
        if b"ready" not in got:
            self.proc.kill()
            raise RuntimeError(f"kvshared did not start:\n{self.logtext()}")

    def logtext(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def stats(self):
        with kvshare.Client(self.socket, name="engine-check") as c:
            for _ in range(100):   # sessions close asynchronously
                s = c.stats(check=True)
                if s.sessions == 1 and s.used_blocks == 0:
                    break
                time.sleep(0.05)
            return s, c.tier_stats()[0]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -1


# ---- the workload ----------------------------------------------------------

class Conversation:
    def __init__(self, cid, system, rng, a):
        self.cid, self.turn = cid, 0
        self.history = list(system)
        self.users = [[rng.randrange(a.vocab) for _ in range(a.user)]
                      for _ in range(a.turns)]
        self.served = {}   # engine -> positions it computed (K/V)

    def prompt(self):
        return self.history + self.users[self.turn]


def fmt_ms(s):
    return f"{s * 1e3:.1f} ms"


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def expect(outbox, engines, pending, kind, eids, what, timeout=120):
    """Reads outbox until a `kind` message came from each engine of eids;
    returns {eid: message}.  Every other message is kept in `pending` (a
    deque the caller reads before outbox): the other engines go on
    answering meanwhile.  An engine of eids that exits first, or the
    timeout, raises RuntimeError saying which."""
    got, eids = {}, set(eids)
    deadline = time.monotonic() + timeout
    dead_seen = False
    while eids - set(got):
        try:
            msg = outbox.get(timeout=0.5)
        except queue.Empty:
            dead = sorted(e for e in eids - set(got)
                          if not engines[e][0].is_alive())
            if dead and dead_seen:      # its last words had time to arrive
                e = dead[0]
                raise RuntimeError(f"engine {e} exited "
                                   f"{engines[e][0].exitcode} before {what} "
                                   f"(its error is above)")
            dead_seen = bool(dead)
            if time.monotonic() > deadline:
                raise RuntimeError(f"engines {sorted(eids - set(got))}: no "
                                   f"{what} in {timeout} s")
            continue
        if msg[0] == kind and msg[1] in eids:
            got[msg[1]] = msg
        else:
            pending.append(msg)
    return got


def stop_all(engines, daemons):
    """Error path: kill what is still running."""
    for p, _ in engines.values():
        if p.is_alive():
            p.kill()
        p.join(timeout=10)
    for d in daemons:
        d.kill()


def run_mode(a, mode, cfg, tmp, faults=False):
    """One run of the workload; returns its figures and the finished
    requests."""
    base = ["--num-layers", str(cfg.layers), "--num-kv-heads",
            str(cfg.kv_heads), "--head-dim", str(cfg.head_dim),
            "--block-size", str(a.block_size), "--dtype", a.dtype,
            "--backend", a.backend]
    pool = a.pool_blocks
    if faults:
        pool = a.fault_pool_blocks
        base += ["--host-tier-bytes", str(a.fault_tier_bytes)]
    daemons, engines = [], {}
    try:
        if mode == "private":
            for e in range(a.engines):
                daemons.append(Daemon(a.build, tmp, f"{mode}-{e}", base + [
                    "--pool-blocks", str(pool // a.engines)]))
        else:
            daemons.append(Daemon(a.build, tmp, mode, base + [
                "--pool-blocks", str(pool)]))
        return _run(a, mode, faults, cfg, daemons, engines)
    except BaseException:
        stop_all(engines, daemons)
        raise


def _run(a, mode, faults, cfg, daemons, engines):
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    pending = collections.deque()   # messages read while waiting for others

    def start_engine(e, kill_at_step=None):
        opts = {"eid": e, "mode": mode, "model": cfg.as_dict(),
                "seed": a.seed, "weights": a.weights,
                "socket": daemons[e % len(daemons)].socket,
                "chunk_tokens": a.chunk, "kill_at_step": kill_at_step,
                "threads": a.threads, "compute": a.compute}
        inbox = ctx.Queue()
        p = ctx.Process(target=engine_main, args=(opts, inbox, outbox),
                        daemon=True)
        p.start()
        engines[e] = (p, inbox)

    victim = 1 % a.engines if faults else None
    for e in range(a.engines):
        start_engine(e, a.kill_at_step if e == victim else None)
    expect(outbox, engines, pending, "ready", range(a.engines),
           "it was ready")

    rng = random.Random(a.seed)
    system = [rng.randrange(a.vocab) for _ in range(a.system)]
    convs = [Conversation(i, system, rng, a) for i in range(a.conversations)]
    next_id = 1
    inflight = {}          # request id -> (conversation, engine, prompt, t_send)
    results, killed, resent = [], 0, 0

    def send(cv, e=None):
        nonlocal next_id
        if e is None:       # the next engine after the last turn's
            e = (cv.cid + cv.turn) % a.engines
        rid, next_id = next_id, next_id + 1
        prompt = cv.prompt()
        t = time.monotonic()
        inflight[rid] = (cv, e, prompt, t)
        engines[e][1].put(("req", rid, prompt, a.reply, t))

    # At most `active` conversations wait for an answer at a time; the
    # others queue, and one whose turn is answered goes to the back.
    active = a.fault_concurrency if faults else a.conversations
    ready = collections.deque(convs)
    t_start = time.monotonic()
    while ready and len(inflight) < active:
        send(ready.popleft())
    firsts, stats = {}, {}
    while inflight or ready:
        try:
            msg = pending.popleft() if pending else outbox.get(timeout=1.0)
        except queue.Empty:
            msg = None
        if msg is None:
            for e, (p, inbox) in list(engines.items()):
                if p.is_alive():
                    continue
                if p.exitcode != -signal.SIGKILL or not faults:
                    raise RuntimeError(f"engine {e} exited {p.exitcode} "
                                       f"(its error is above)")
                # Killed mid-step: the daemon freed its session; what it
                # had in flight goes to the other engines, and a new
                # engine takes its place.
                killed += 1
                lost = [rid for rid, v in inflight.items() if v[1] == e]
                start_engine(e)
                expect(outbox, engines, pending, "ready", [e],
                       "it was ready")
                for rid in lost:
                    cv = inflight.pop(rid)[0]
                    resent += 1
                    send(cv, (e + 1) % a.engines)
            continue
        kind = msg[0]
        if kind == "first":
            firsts[msg[2]] = msg[3]
        elif kind == "done":
            _, e, rid, gen, logits, hit, plen, t_done = msg
            cv, e_sent, prompt, t_send = inflight.pop(rid)
            # A hit past the system prompt and past all this engine ever
            # computed of the conversation came from another engine.
            own = cv.served.get(e, 0)
            results.append({
                "id": rid, "conv": cv.cid, "turn": cv.turn, "engine": e,
                "from_other": hit > max(a.system, own), "prompt": prompt,
                "prompt_len": plen,
                "generated": gen, "logits": logits, "hit": hit,
                "ttft": firsts[rid] - t_send,
                "decode_rate": ((len(gen) - 1) / (t_done - firsts[rid])
                                if len(gen) > 1 and t_done > firsts[rid]
                                else None)})
            cv.history = prompt + gen
            cv.served[e] = len(cv.history) - 1
            cv.turn += 1
            if cv.turn < a.turns:
                ready.append(cv)
            if ready:
                send(ready.popleft())
    wall = time.monotonic() - t_start
    for e, (p, inbox) in engines.items():
        inbox.put(("stop",))
    stats = {e: m[2] for e, m in expect(
        outbox, engines, pending, "stats", engines, "its stats").items()}
    for p, _ in engines.values():
        p.join(timeout=60)
    daemon_state = [d.stats() for d in daemons]
    rcs = [d.stop() for d in daemons]
    total = {}
    for s in stats.values():
        for k, v in s.items():
            total[k] = total.get(k, 0) + v
    ttft = [r["ttft"] for r in results]
    fig = {
        "mode": mode + (" + faults" if faults else ""),
        "requests": len(results),
        "ttft_median_s": statistics.median(ttft),
        "ttft_p99_s": p99(ttft),
        "prompt_tokens": sum(len(r["prompt"]) for r in results),
        "prefill_tokens": total.get("prefill_tokens", 0),
        "hit_tokens": sum(r["hit"] for r in results),
        "generated_tokens": sum(len(r["generated"]) for r in results),
        "wall_s": wall,
        "tokens_per_s": sum(len(r["generated"]) for r in results) / wall,
        # what a user sees after the first token: tokens per second of
        # each request's decode, the median over requests
        "decode_tokens_per_s": statistics.median(
            [r["decode_rate"] for r in results if r["decode_rate"]] or [0.0]),
        "from_other_engine": sum(1 for r in results if r["from_other"]),
        "killed_engines": killed, "resent_requests": resent,
        "daemon_exit": rcs,
        "pool_check": all(s.check_ok for s, _ in daemon_state),
        "blocks_in_use": sum(s.used_blocks for s, _ in daemon_state),
        "evictions": sum(s.evictions for s, _ in daemon_state),
        "tier_promotions": sum(t.promotions for _, ts in daemon_state
                               for t in ts),
        "tier_demotions": sum(t.demotions for _, ts in daemon_state
                              for t in ts),
    }
    return fig, results


# ---- checks ----------------------------------------------------------------

def reference_model(cfg, w, a):
    """The from-scratch model: float32, on the GPU when there is one (a
    1B model's references are slow on a CPU)."""
    return M.Llama(cfg, w, device="cuda" if a.backend == "cuda" else "cpu")


def check_requests(model, results, a):
    """Every request against the model from scratch; returns the failures
    (strings), the number of near ties and the largest logit error."""
    fails, ties, worst = [], 0, 0.0
    kv_dtype = DTYPES[a.dtype]
    for r in results:
        plen = r.get("prompt_len", len(r["prompt"]))
        if len(r["generated"]) != a.reply or plen != len(r["prompt"]):
            fails.append(f"request {r['id']}: {len(r['generated'])} tokens "
                         f"generated after a prompt of {plen}, but it asked "
                         f"for {a.reply} after {len(r['prompt'])}")
            continue
        seq = r["prompt"] + r["generated"][:-1]
        with torch.no_grad():
            ref = model.forward_full(seq, kv_dtype=kv_dtype)[
                len(r["prompt"]) - 1:]
        for i, tok in enumerate(r["generated"]):
            best = int(torch.argmax(ref[i]))
            if tok != best:
                gap = float(ref[i][best] - ref[i][tok])
                if gap > a.tie * max(1.0, float(ref[i].abs().max())):
                    fails.append(f"request {r['id']} (conversation "
                                 f"{r['conv']} turn {r['turn']}, engine "
                                 f"{r['engine']}): token {i} is {tok}, from "
                                 f"scratch {best} (logit gap {gap:.3g})")
                    break
                ties += 1
        got = torch.tensor(r["logits"], device=ref.device)
        err = float((got - ref[-1]).abs().max() /
                    max(1.0, float(ref[-1].abs().max())))
        worst = max(worst, err)
        if not err <= a.tol:
            fails.append(f"request {r['id']}: final logits differ from the "
                         f"from-scratch ones by {err:.3g} (tolerance "
                         f"{a.tol:g})")
    return fails, ties, worst


def check_transformers(hf, results, a):
    """The engine's answers against transformers' Llama with the same
    weights: each generated token its greedy choice (or a near tie), the
    final logits within --tol.  Returns failures and the largest error."""
    fails, worst = [], 0.0
    dev = next(hf.parameters()).device
    for r in results:
        seq = r["prompt"] + r["generated"][:-1]
        with torch.no_grad():
            ref = hf(torch.tensor([seq], device=dev)).logits[0][
                len(r["prompt"]) - 1:].float()
        for i, tok in enumerate(r["generated"]):
            best = int(torch.argmax(ref[i]))
            gap = float(ref[i][best] - ref[i][tok])
            if gap > a.tie * max(1.0, float(ref[i].abs().max())):
                fails.append(f"request {r['id']}: token {i} is {tok}, "
                             f"transformers' Llama says {best}")
                break
        got = torch.tensor(r["logits"], device=dev)
        err = float((got - ref[-1]).abs().max() /
                    max(1.0, float(ref[-1].abs().max())))
        worst = max(worst, err)
        if not err <= a.tol:
            fails.append(f"request {r['id']}: final logits differ from "
                         f"transformers' by {err:.3g}")
    return fails, worst


def check_run(fig, fails, mode):
    if fig["daemon_exit"] != [0] * len(fig["daemon_exit"]):
        fails.append(f"{mode}: a daemon exited {fig['daemon_exit']}")
    if not fig["pool_check"]:
        fails.append(f"{mode}: the pool invariant check failed")
    if fig["blocks_in_use"]:
        fails.append(f"{mode}: {fig['blocks_in_use']} blocks still in use")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.environ.get(
        "KVS_BUILD", os.path.join(ROOT, "build")))
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--model", default="tiny", choices=sorted(M.CONFIGS))
    ap.add_argument("--weights", help="a safetensors file (else seeded)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="none,private,shared")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system", type=int, default=256,
                    help="tokens of the shared system prompt")
    ap.add_argument("--user", type=int, default=96,
                    help="tokens of each user message")
    ap.add_argument("--reply", type=int, default=32,
                    help="tokens the engine generates per turn")
    ap.add_argument("--chunk", type=int, default=256,
                    help="token budget of a step (chunked prefill)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--backend", default="host")
    ap.add_argument("--pool-blocks", type=int, default=4096)
    ap.add_argument("--faults", action="store_true")
    ap.add_argument("--fault-pool-blocks", type=int, default=0,
                    help="pool of the faults run (0: half the workload)")
    ap.add_argument("--fault-concurrency", type=int, default=0,
                    help="conversations in flight in the faults run (0: "
                    "a quarter of them)")
    ap.add_argument("--fault-tier-bytes", default="256M")
    ap.add_argument("--kill-at-step", type=int, default=6)
    ap.add_argument("--compute", default="float32",
                    choices=["float32", "float16", "bfloat16"],
                    help="the engines' compute dtype (the check runs float32)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tol", type=float, default=None)
    ap.add_argument("--tie", type=float, default=None)
    ap.add_argument("--transformers", default="auto",
                    choices=["auto", "yes", "no"],
                    help="check the shared run's answers against "
                    "transformers' Llama too (auto: when it is installed)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    for name in ("engines", "conversations", "turns", "reply", "chunk",
                 "block_size", "pool_blocks", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    cfg = M.CONFIGS[a.model]
    a.vocab = cfg.vocab
    if a.tol is None:
        a.tol = 1e-3 if a.dtype == "fp32" else 2e-2
    if a.tie is None:
        a.tie = a.tol
    if not a.fault_concurrency:
        a.fault_concurrency = max(1, a.conversations // 4)
    if not a.fault_pool_blocks:
        # Room for the conversations in flight and a quarter more: less
        # than the whole workload's blocks, so that cached ones are evicted
        # to the host tier and come back.
        per = -(-(a.system + a.turns * (a.user + a.reply)) // a.block_size)
        a.fault_pool_blocks = per * a.fault_concurrency * 5 // 4 + 8
    return a


def main(argv=None):
    a = parse_args(argv)
    cfg = M.CONFIGS[a.model]
    torch.set_num_threads(a.threads)
    w = M.load_weights(cfg, a.weights, a.seed)
    model = reference_model(cfg, w, a)
    hf = None
    if a.transformers != "no":
        hf = M.transformers_llama(cfg, w, model.device)
        if hf is None and a.transformers == "yes":
            print("kvshare engine: --transformers yes, but transformers is "
                  "not installed", file=sys.stderr)
            return 2
    a.hf_note = ("transformers' Llama: not installed, not checked"
                 if hf is None else None)
    tmp = tempfile.mkdtemp(prefix="kvs-engine-")
    figs, fails, ties, worst = [], [], 0, 0.0
    try:
        runs = [(m, False) for m in a.modes.split(",") if m]
        if a.faults:
            runs.append(("shared", True))
        for mode, faults in runs:
            fig, results = run_mode(a, mode, cfg, tmp, faults)
            f, t, w = check_requests(model, results, a)
            fig["checked"], fig["near_ties"], fig["max_logit_err"] = \
                len(results), t, w
            if hf is not None and mode == "shared" and not faults:
                hf_fails, hf_err = check_transformers(hf, results, a)
                f += hf_fails
                a.hf_note = (f"transformers' Llama, same weights: "
                             f"{len(results)} shared-run requests checked, "
                             f"largest logit error {hf_err:.2g}")
                fig["transformers_max_logit_err"] = hf_err
            check_run(fig, f, fig["mode"])
            if mode == "shared" and not faults and a.engines > 1 and \
                    not fig["from_other_engine"]:
                f.append("shared: no request reused a prefix another "
                         "engine computed")
            if faults and not (fig["evictions"] and fig["killed_engines"]
                               and fig["tier_promotions"]):
                f.append(f"faults: {fig['evictions']} evictions, "
                         f"{fig['tier_promotions']} blocks promoted, "
                         f"{fig['killed_engines']} engines killed (the run "
                         f"must have all three)")
            fails += [f"{fig['mode']}: {x}" for x in f]
            ties += t
            worst = max(worst, w)
            figs.append(fig)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(a, cfg, figs, fails)
    return 1 if fails else 0


def report(a, cfg, figs, fails):
    by = {f["mode"]: f for f in figs}
    ratios = {}
    if "none" in by and "shared" in by:
        ratios["ttft_none_over_shared"] = (by["none"]["ttft_median_s"] /
                                           by["shared"]["ttft_median_s"])
    if "private" in by and "shared" in by:
        ratios["ttft_private_over_shared"] = (
            by["private"]["ttft_median_s"] / by["shared"]["ttft_median_s"])
        if by["private"]["decode_tokens_per_s"]:
            ratios["decode_shared_over_private"] = (
                by["shared"]["decode_tokens_per_s"] /
                by["private"]["decode_tokens_per_s"])
    if a.json:
        print(json.dumps({"config": cfg.as_dict(), "runs": figs,
                          "ratios": ratios, "failures": fails}, indent=1))
        return
    print(f"kvshare engine: {a.engines} engines, model {a.model} "
          f"({cfg.layers} layers, {cfg.heads}/{cfg.kv_heads} heads of "
          f"{cfg.head_dim}, dim {cfg.dim}, vocab {cfg.vocab}), {a.dtype} "
          f"cache, {a.conversations} conversations x {a.turns} turns "
          f"(system {a.system}, user {a.user}, reply {a.reply} tokens)")
    print(f"{'mode':<16}{'TTFT median':>12}{'TTFT p99':>11}{'prefilled':>11}"
          f"{'hit':>8}{'tok/s':>8}{'decode tok/s':>14}{'from other':>12}")
    for f in figs:
        print(f"{f['mode']:<16}{fmt_ms(f['ttft_median_s']):>12}"
              f"{fmt_ms(f['ttft_p99_s']):>11}{f['prefill_tokens']:>11}"
              f"{f['hit_tokens']:>8}{f['tokens_per_s']:>8.1f}"
              f"{f['decode_tokens_per_s']:>14.1f}{f['from_other_engine']:>12}")
    for f in figs:
        extra = ""
        if f["evictions"] or f["killed_engines"]:
            extra = (f", {f['evictions']} evictions, {f['tier_demotions']} "
                     f"demoted / {f['tier_promotions']} promoted through the "
                     f"host tier, {f['killed_engines']} engine killed, "
                     f"{f['resent_requests']} requests sent again")
        print(f"  {f['mode']}: {f['checked']} requests checked against the "
              f"model from scratch (largest logit error {f['max_logit_err']:.2g}"
              f", {f['near_ties']} near ties){extra}")
    if a.hf_note:
        print("  " + a.hf_note)
    names = {"ttft_none_over_shared": "median TTFT, no cache / shared",
             "ttft_private_over_shared": "median TTFT, private / shared",
             "decode_shared_over_private": "decode tokens/s, shared / private"}
    for k, v in ratios.items():
        print(f"{names[k]}: {v:.2f}x")
    for f in fails:
        print("FAIL:", f)
    print("kvshare engine: " + ("all checks passed" if not fails else
                                f"{len(fails)} checks failed"))


if __name__ == "__main__":
    sys.exit(main())
