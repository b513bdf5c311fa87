"""Batches: one round trip, per-op statuses and results, nothing sent when
the with block raises, results equal to the same ops run one by one."""
import numpy as np
import pytest

import kvshare


def test_batch_step_and_per_op_errors(client, daemon):
    bs = client.layout.block_size
    toks = list(range(1000, 1000 + 2 * bs + 1))
    frames = client.stats().frames_in
    with client.batch() as b:
        lk = b.lookup(1, toks)
        al = b.allocate(1, len(toks))
        cm = b.commit(1, 0, n=len(toks))
        bad = b.free(999)          # fails alone
        lk2 = b.lookup(2, np.array(toks, np.uint32))
        pg = b.ping(b"x" * 100)
        assert len(b) == 6 and not lk.done
        with pytest.raises(kvshare.StateError):
            lk.result  # not submitted yet
    # One frame for the whole batch: the daemon counted, since the first
    # stats frame, its tier, swap and tenant frames (3), the batch and this
    # stats.
    assert client.stats().frames_in == frames + 3 + 1 + 1
    assert [o.index for o in (lk, al, cm, bad, lk2, pg)] == list(range(6))
    assert lk.ok and lk.result.hit_tokens == 0
    assert al.ok and len(al.result.blocks) == 3 and al.result.first_index == 0
    assert cm.ok and cm.result == 2
    assert not bad.ok and bad.status == kvshare.ENOENT
    assert isinstance(bad.error, kvshare.UnknownRequestError)
    assert "999" in bad.message
    with pytest.raises(kvshare.UnknownRequestError) as ei:
        bad.result
    assert ei.value.status == kvshare.ENOENT
    assert lk2.ok and lk2.result.hit_tokens == 2 * bs
    assert lk2.result.blocks == al.result.blocks[:2]
    assert pg.ok and pg.result is None
    assert b.errors == (bad,)
    with pytest.raises(kvshare.StateError):
        b.free(1)  # closed at the end of the with block
    client.free(1)
    client.free(2)


def test_exception_inside_the_block_sends_nothing(client):
    before = client.stats()
    with pytest.raises(RuntimeError):
        with client.batch() as b:
            b.lookup(1, [1, 2, 3])
            raise RuntimeError("engine bug")
    after = client.stats()
    assert after.lookups == before.lookups and after.num_requests == 0


def test_batch_reuse_and_agreement_with_direct_calls(client, daemon):
    toks = list(range(7, 7 + 13))
    # Direct reference on a second session.
    with kvshare.Client(daemon.socket) as ref:
        ref.lookup(1, toks)
        ra = ref.allocate(1, 13)
        ref.commit(1, 0, n=13)
        rh = ref.lookup(2, toks)
        ref.free(1)
        ref.free(2)
    b = client.batch()
    h = b.lookup(5, toks)
    b.submit()
    a = b.allocate(5, 13 - h.result.hit_tokens)  # starts the next batch
    assert len(b) == 1
    b.submit()
    assert a.ok and h.result.hit_tokens == rh.hit_tokens == 12
    assert h.result.blocks == rh.blocks == ra.blocks[:3]
    b.free(5)
    ops = b.submit()
    assert ops[0].ok
    b.close()
    b.close()
    assert a.result.first_index == 3  # results outlive the C batch


def test_batch_submit_on_a_closed_client(daemon):
    c = kvshare.Client(daemon.socket)
    b = c.batch()
    b.ping()
    c.close()
    with pytest.raises(kvshare.ConnectionClosedError):
        b.submit()
    b.close()


def test_an_explicit_submit_inside_with_sends_one_frame(client, daemon):
    def frames():
        return daemon.cli("stats", "--json")["frames_in"]

    f0 = frames()
    f1 = frames()  # f1 - f0: what one look costs (the CLI's own frames)
    with client.batch() as b:
        h = b.lookup(9, list(range(100, 140)))
        ops = b.submit()
    f2 = frames()
    # The with's exit did not send a second (empty) batch, nor drop the ops.
    assert len(b.ops) == 1 and ops[0] is h and h.ok
    assert (f2 - f1) - (f1 - f0) == 1, (f0, f1, f2)
    client.free(9)


def test_timeout_out_of_range_is_refused(daemon):
    with pytest.raises(ValueError):
        kvshare.Client(daemon.socket, timeout_ms=2**31)
