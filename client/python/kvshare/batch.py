"""kvshare.Batch: the ops of one scheduler step in one round trip.

    with client.batch() as b:
        hit = b.lookup(7, prompt)
        a = b.allocate(7, 16)
        f = b.free(99)
    hit.result.hit_tokens       # after the with block: submitted
    f.ok, f.status, f.error     # each op has its own status

The daemon runs the ops in order; a failed op does not stop the ones after
it.  Leaving the with block normally submits (a transport failure, or the
batch refused whole, e.g. TOOBIG, raises KvsError); leaving it by an
exception sends nothing.  Results are copied out at submit, so an Op stays
readable for as long as it is referenced.  The C batch (kvs_batch) is freed
by close(), by the with block's end, or when the Batch is collected.
A Batch may be submitted again after more ops are added: each submit
starts afresh with the ops added since the last one.
"""
import ctypes
import weakref
from ctypes import byref, c_uint32, c_void_p

from . import _lib
from .client import (_alloc_result, _block_keys, _blocks, _commit_args,
                     _req, _salt, _u32, _u32_ptr, LookupResult, as_u32_array)
from .errors import error_for


class Op:
    """One op of a batch.  Before the submit only .index and .kind are
    set; after it: .status (0 or negative), .ok, .message (the daemon's, or
    the code's text), .error (a KvsError or None) and .result (raises the
    op's KvsError when it failed): a LookupResult (lookup), AllocResult
    (allocate, append), the sealed count (commit), None (others)."""

    __slots__ = ("index", "kind", "status", "message", "_result", "_done")

    def __init__(self, index, kind):
        self.index, self.kind = index, kind
        self.status, self.message, self._result, self._done = None, "", None, False

    @property
    def done(self):
        return self._done

    @property
    def ok(self):
        return self._done and self.status == 0

    @property
    def error(self):
        if not self._done:
            raise error_for(_lib.ESTATE, "the batch was not submitted",
                            f"{self.kind} #{self.index}")
        if self.status == 0:
            return None
        return error_for(self.status, self.message, f"{self.kind} #{self.index}")

    @property
    def result(self):
        err = self.error
        if err is not None:
            raise err
        return self._result

    def __repr__(self):
        state = ("pending" if not self._done else
                 "ok" if self.status == 0 else f"error {self.status}")
        return f"<Op #{self.index} {self.kind} {state}>"


def _free_batch(addr):
    _lib.lib().kvs_batch_free(c_void_p(addr))


class Batch:
    def __init__(self, client):
        self._client = client
        self._L = _lib.lib()
        out = c_void_p()
        rc = self._L.kvs_batch_new(byref(out))
        if rc:
            raise error_for(rc, "", "batch_new")
        self._b = out.value
        self._fin = weakref.finalize(self, _free_batch, out.value)
        self._ops = []
        self._submitted = False

    # -- lifetime -------------------------------------------------------------
    def close(self):
        """Free the C batch (idempotent); the Op results stay readable."""
        self._fin()
        self._b = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.submit()
        finally:
            self.close()

    def __len__(self):
        return len(self._ops)

    @property
    def ops(self):
        """The ops of the current (or last submitted) batch, in order."""
        return tuple(self._ops)

    @property
    def errors(self):
        """The failed ops of the last submit."""
        return tuple(o for o in self._ops if o.done and o.status != 0)

    def _add(self, kind, rc):
        if rc < 0:
            raise error_for(rc, "", f"batch {kind}")
        op = Op(rc, kind)
        self._ops.append(op)
        return op

    def _bp(self):
        if self._b is None:
            raise error_for(_lib.ESTATE, "the batch is closed")
        if self._submitted:
            # Adding to a submitted batch starts the next one (kvs_batch
            # drops the old ops; results were copied out at submit).
            self._L.kvs_batch_reset(self._b)
            self._ops = []
            self._submitted = False
        return self._b

    # -- ops ----------------------------------------------------------------------
    def lookup(self, req_id, tokens, salt=None):
        b = self._bp()
        toks = as_u32_array(tokens)
        s, slen = _salt(salt)
        return self._add("lookup", self._L.kvs_batch_lookup(
            b, _req(req_id), _u32_ptr(toks), toks.size, s, slen))

    def allocate(self, req_id, num_tokens):
        b = self._bp()
        return self._add("allocate", self._L.kvs_batch_allocate(
            b, _req(req_id), _u32(num_tokens, "num_tokens")))

    def append(self, req_id, num_tokens=1):
        b = self._bp()
        return self._add("append", self._L.kvs_batch_append(
            b, _req(req_id), _u32(num_tokens, "num_tokens")))

    def commit(self, req_id, start, tokens=None, *, n=None, blocks=None,
               engine_hashes=None, lora_name=None, extra_keys=None):
        b = self._bp()
        toks, n, blk = _commit_args(tokens, n, blocks)
        keys = _block_keys(engine_hashes, lora_name, extra_keys)
        return self._add("commit", self._L.kvs_batch_commit_keys(
            b, _req(req_id), _u32(start, "start"),
            _u32_ptr(toks) if toks is not None else None, n,
            _u32_ptr(blk) if blk is not None else None,
            blk.size if blk is not None else 0,
            byref(keys[0]) if keys else None))

    def fork(self, req_id, child_id):
        b = self._bp()
        return self._add("fork", self._L.kvs_batch_fork(
            b, _req(req_id), _req(child_id, "child_id")))

    def free(self, req_id):
        b = self._bp()
        return self._add("free", self._L.kvs_batch_free_req(b, _req(req_id)))

    def preempt(self, req_id):
        b = self._bp()
        return self._add("preempt", self._L.kvs_batch_preempt(b, _req(req_id)))

    def ping(self, payload=b""):
        b = self._bp()
        payload = bytes(payload)
        return self._add("ping", self._L.kvs_batch_ping(
            b, payload or None, len(payload)))

    # -- submit ---------------------------------------------------------------------
    def submit(self):
        """Send every op added since the last submit in one frame and read
        each op's status and result.  Returns the ops.  Raises KvsError
        when the round trip itself failed (nothing is known about the ops
        then; the connection may be broken).  With nothing added since the
        last submit it returns that submit's ops without a round trip."""
        if self._b is None:
            raise error_for(_lib.ESTATE, "the batch is closed")
        if self._submitted:
            return tuple(self._ops)
        b = self._b
        c = self._client
        rc = self._L.kvs_batch_submit(c._p(), b)
        c._check(rc, "batch submit")
        L = self._L
        try:
            for op in self._ops:
                i = op.index
                st = L.kvs_batch_status(b, i)
                op.status = st
                op.message = _lib.text(L.kvs_batch_message(b, i)) if st else ""
                if st == 0:
                    op._result = self._read(b, op)
                op._done = True
        finally:
            # (the C batch is submitted whatever happens here: the next op
            # added starts the next batch on both sides)
            self._submitted = True
        return tuple(self._ops)

    def _read(self, b, op):
        L, i = self._L, op.index
        if op.kind == "lookup":
            r = _lib.kvs_lookup_result()
            rc = L.kvs_batch_lookup_result(b, i, byref(r))
            res = LookupResult(r.hit_tokens, _blocks(r.blocks, r.num_blocks))
        elif op.kind in ("allocate", "append"):
            r = _lib.kvs_alloc_result()
            rc = L.kvs_batch_alloc_result(b, i, byref(r))
            res = _alloc_result(r)
        elif op.kind == "commit":
            s = c_uint32(0)
            rc = L.kvs_batch_commit_result(b, i, byref(s))
            res = s.value
        else:
            return None
        if rc:
            raise error_for(rc, "", f"batch {op.kind} #{i} result")
        return res
