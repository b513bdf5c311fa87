"""One engine process: continuous batching with chunked prefill over a
kvshare pool, through kvshare.torch.

Each step the scheduler takes every request in decode (one row each) and
fills the rest of its token budget with prefill chunks of the others; the
rows of all of them go through the model together, one attention call per
layer over the pool (the prefill kernel: a chunk of one row is a decode,
so mixed steps need no second call; a step of decodes only runs the decode
kernel).  The cache calls of a step go in one Batch: the commits of what
the last step computed, the frees of finished requests, an Append for each
token sampled; a step that admits new requests does their Lookups first
and their Allocates with the rest.

Three cache modes, as a fleet behind a load balancer would run:
  none     every request computes its whole prompt (each Lookup is salted
           with the request's own id, so it finds nothing);
  private  the engine's own daemon: it reuses what this engine computed;
  shared   one daemon for all engines: a prefix any engine computed is
           reused by all.
The mode is the daemon the engine is given and whether it salts.
"""
import collections
import os
import queue
import random
import signal
import time

import torch

import kvshare
import kvshare.torch as kvt

from model import Llama, load_weights


class Request:
    __slots__ = ("id", "tokens", "prompt_len", "max_new", "done", "hit",
                 "t_send", "t_first", "logits", "backoff", "retry_at")

    def __init__(self, rid, prompt, max_new, t_send):
        self.id, self.tokens = rid, list(prompt)
        self.prompt_len, self.max_new = len(prompt), max_new
        self.done = 0          # positions whose K/V are in the pool
        self.hit = 0           # of which came from the cache
        self.t_send, self.t_first = t_send, None
        self.logits = None     # the logits that chose the last token
        self.backoff = 0.0     # seconds; grows with preemptions in a row
        self.retry_at = 0.0

    @property
    def generated(self):
        return self.tokens[self.prompt_len:]

    def finished(self):
        return len(self.tokens) - self.prompt_len >= self.max_new


class Engine:
    def __init__(self, client, model, mode="shared", chunk_tokens=256,
                 max_running=64, kill_at_step=None, report=None,
                 before_kill=None):
        if mode not in ("none", "private", "shared"):
            raise ValueError(f"mode {mode!r}: none, private or shared")
        if chunk_tokens < 1 or max_running < 1:
            raise ValueError(f"chunk_tokens {chunk_tokens}, max_running "
                             f"{max_running}: both must be at least 1 (a "
                             f"step with no budget never ends a request)")
        self.c, self.m, self.mode = client, model, mode
        self.kv = kvt.PagedKV(client)
        # Index checks before each kernel: cheap on a host pool; on a GPU
        # they would cost a device sync per call.
        self.kv.validate = self.kv.backend == "cpu"
        L = client.layout
        cfg = model.cfg
        if (L.num_layers, L.num_kv_heads, L.head_dim) != \
                (cfg.layers, cfg.kv_heads, cfg.head_dim):
            raise ValueError(
                f"the pool's layout ({L.num_layers} layers, {L.num_kv_heads} "
                f"kv heads of {L.head_dim}) is not the model's "
                f"({cfg.layers}, {cfg.kv_heads}, {cfg.head_dim})")
        self.bs = L.block_size
        self.chunk_tokens, self.max_running = chunk_tokens, max_running
        self.kill_at_step = kill_at_step
        self.before_kill = before_kill or (lambda: None)
        self.report = report or (lambda *msg: None)
        self.waiting = collections.deque()
        self.running = []
        self.step_no = 0
        self.st = kvt.Step(client)   # tracks every request's block table
        self.tiers = bool(client.tier_stats()[0])
        self.ops = []                # the next round trip's (request, op)
        self.counters = collections.Counter()

    # -- the cache calls ------------------------------------------------
    def _op(self, kind, r, *args, **kw):
        self.ops.append((r, getattr(self.st, kind)(r.id, *args, **kw)))

    def _submit(self):
        """One round trip with the ops gathered so far.  A request whose
        Allocate or Append found no space is preempted: freed, and queued
        again to compute what is not cached any more (its committed blocks
        stay in the index for its next Lookup)."""
        ops, self.ops = self.ops, []
        if not ops:
            return
        try:
            self.st.submit()
        except kvshare.KvsError:
            if not all(op.done for _, op in ops):
                raise                       # the round trip itself failed
        for r, op in ops:
            if op.ok:
                continue
            if op.status != kvshare.ENOSPC or op.kind not in ("allocate",
                                                              "append"):
                raise op.error
            need = -(-(len(r.tokens) + 1) // self.bs)
            if need > self.c.layout.num_blocks:
                raise RuntimeError(
                    f"request {r.id} ({len(r.tokens)} tokens, {need} blocks) "
                    f"cannot fit in a pool of {self.c.layout.num_blocks} "
                    f"blocks: {op.message}")
            self._preempt(r)

    def _preempt(self, r):
        """Frees r and queues it again after a random back-off that doubles
        with each preemption in a row: engines sharing a full pool each
        hold part of it, and if all of them retried at once none would get
        enough (a live-lock); waiting, one lets the others finish."""
        self.running = [x for x in self.running if x is not r]
        r.done = r.hit = 0
        r.backoff = min(0.2, r.backoff * 2 if r.backoff else 0.005)
        r.retry_at = time.monotonic() + r.backoff * (0.5 + random.random())
        self._op("free", r)
        self.waiting.appendleft(r)
        self.counters["preemptions"] += 1

    def _salt(self, r):
        return f"nocache-{r.id}" if self.mode == "none" else None

    def _admit(self):
        admit, now = [], time.monotonic()
        while self.waiting and len(self.running) + len(admit) < \
                self.max_running and self.waiting[0].retry_at <= now:
            admit.append(self.waiting.popleft())
        if not admit:
            if not self.running and self.waiting:   # all backing off
                time.sleep(max(0.0, self.waiting[0].retry_at - now))
            return
        # One round trip: the last step's commits and frees, then the
        # Lookups (after those commits, so they find what was just done).
        # A lookup in a Batch does not wait for blocks coming up from a
        # tier below the pool: with tiers, each is a call of its own.
        if self.tiers:
            self._submit()
            looks = [self.c.lookup(r.id, r.tokens, salt=self._salt(r))
                     for r in admit]
            for r, res in zip(admit, looks):
                self.st.adopt(r.id, res)
        else:
            for r in admit:
                self._op("lookup", r, r.tokens, salt=self._salt(r))
            ops = [op for _, op in self.ops[-len(admit):]]
            self._submit()
            looks = [op.result for op in ops]
        for r, res in zip(admit, looks):
            r.hit = r.done = res.hit_tokens
            self._op("allocate", r, len(r.tokens) - r.done)
            self.counters["prefix_hit_tokens"] += r.hit
            self.counters["prompt_tokens"] += len(r.tokens)
        self.running.extend(admit)

    # -- one step -------------------------------------------------------
    def _plan(self):
        """Rows of this step: (request, first position, count): every
        request in decode gets one, prefill chunks fill the rest of the
        token budget."""
        rows, budget = [], self.chunk_tokens
        for r in self.running:              # decodes first
            if len(r.tokens) - r.done == 1 and budget > 0:
                rows.append((r, r.done, 1))
                budget -= 1
        for r in self.running:              # then prefill chunks
            left = len(r.tokens) - r.done
            if left > 1 and budget > 0:
                n = min(left, budget)
                rows.append((r, r.done, n))
                budget -= n
        return rows

    def step(self):
        """Runs one step; returns False when there was nothing to do."""
        self._admit()
        self._submit()                      # allocations and appends
        if not self.running:
            return False
        rows = self._plan()
        self.step_no += 1
        logits = self.forward(rows)
        finished = []
        for (r, start, n), lg in zip(rows, logits):
            self._op("commit", r, start, r.tokens[start:start + n])
            r.done = start + n
            self.counters["computed_tokens"] += n
            if start < r.prompt_len:
                self.counters["prefill_tokens"] += min(n, r.prompt_len - start)
            if r.done < len(r.tokens):
                continue                    # a prefill chunk short of the end
            tok = int(torch.argmax(lg))
            r.logits = lg
            r.tokens.append(tok)
            r.backoff = 0.0
            if r.t_first is None:
                r.t_first = time.monotonic()
                self.report("first", r.id, r.t_first)
            if r.finished():
                finished.append(r)
                self._op("free", r)
            else:
                self._op("append", r, 1)    # the slot of the token chosen
        if finished:
            # What they computed must be in the index before anyone hears
            # they are done: the next turn may go to another engine.
            done = {id(r) for r in finished}
            self.running = [r for r in self.running if id(r) not in done]
            self._submit()
            for r in finished:
                self.counters["requests"] += 1
                self.report("done", r.id, r.generated, r.logits.tolist(),
                            r.hit, r.prompt_len, time.monotonic())
        return True

    def flush(self):
        self._submit()

    def forward(self, rows):
        """The model over this step's rows; the logits of each request's
        last row [vocab] (used where the row is the request's last known
        token)."""
        m, kv = self.m, self.kv
        dev = m.device
        toks, pos, slots = [], [], []
        tables = [self.st.table(r.id) for r, _, _ in rows]
        for (r, start, n), table in zip(rows, tables):
            toks.extend(r.tokens[start:start + n])
            pos.extend(range(start, start + n))
            slots.append(kvt.slot_mapping(table, self.bs, start, n,
                                          device=dev))
        q_start = [0]
        for _, _, n in rows:
            q_start.append(q_start[-1] + n)
        seq_lens = torch.tensor([s + n for _, s, n in rows], dtype=torch.int32,
                                device=dev)
        tables = kvt.block_tables(tables, device=dev)
        qs = torch.tensor(q_start, dtype=torch.int32, device=dev)
        slots = torch.cat(slots)
        positions = torch.tensor(pos, device=dev)
        decode = all(n == 1 for _, _, n in rows)
        longest = max(s + n for _, s, n in rows)
        x = m.embed(torch.tensor(toks, dtype=torch.long, device=dev))
        for layer in range(m.cfg.layers):
            q, k, v = m.qkv(layer, x, positions)
            kv.write(layer, k, v, slots)
            if self.kill_at_step == self.step_no:
                # Killed mid-step: K/V written, nothing committed.
                # What this process already reported is delivered first:
                # a SIGKILL while a queue's feeder thread is writing could
                # leave the driver half a message (a crash would; the test
                # is about the cache, not about the queue).
                self.before_kill()
                os.kill(os.getpid(), signal.SIGKILL)
            if decode:
                a = kv.decode(layer, q, seq_lens, tables, max_seq_len=longest)
            else:
                a = kv.prefill(layer, q, qs, seq_lens, tables,
                               max_seq_len=longest)
            x = m.after_attention(layer, x, a)
        last = torch.tensor(q_start[1:], device=dev) - 1
        return m.logits(x[last])


def engine_main(opts, inbox, outbox):
    """The body of an engine process.  opts: dict (socket, mode, model
    config and seed or weights path, chunk_tokens, kill_at_step, eid);
    inbox: ("req", id, prompt, max_new, t_send) or ("stop",); outbox gets
    ("first", eid, id, t), ("done", eid, id, generated, logits, hit,
    prompt_len, t) and, at the end, ("stats", eid, counters)."""
    torch.set_num_threads(opts.get("threads", 1))
    eid = opts["eid"]
    from model import Config
    cfg = Config(**opts["model"])
    w = load_weights(cfg, opts.get("weights"), opts["seed"])
    client = kvshare.Client(opts["socket"], name=f"engine-{eid}")
    # The model runs where the pool is: the GPU of a cuda pool, else the CPU.
    with kvt.PagedKV(client) as kv:
        device = kv.device
    model = Llama(cfg, w, device=device,
                  dtype=getattr(torch, opts.get("compute", "float32")))

    def report(kind, *rest):
        outbox.put((kind, eid) + rest)

    eng = Engine(client, model, opts["mode"], opts.get("chunk_tokens", 256),
                 kill_at_step=opts.get("kill_at_step"), report=report,
                 before_kill=lambda: (outbox.close(), outbox.join_thread()))
    outbox.put(("ready", eid))
    stopping = False
    while True:
        busy = bool(eng.running or eng.waiting)
        try:
            msg = inbox.get(block=not busy and not stopping,
                            timeout=None) if not busy else inbox.get_nowait()
        except queue.Empty:
            msg = None
        if msg is not None:
            if msg[0] == "stop":
                stopping = True
            else:
                _, rid, prompt, max_new, t_send = msg
                eng.waiting.append(Request(rid, prompt, max_new, t_send))
            continue
        if not eng.step() and stopping:
            break
    eng.flush()
    client.close()
    outbox.put(("stats", eid, dict(eng.counters)))
