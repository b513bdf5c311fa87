"""The Client against a real kvshared: connecting, the Welcome's values,
operations, errors with their status codes and daemon messages, closing."""
import ctypes
import dataclasses
import errno
import gc
import os
import re

import numpy as np
import pytest

import kvshare
from conftest import BUILD


def test_loaded_library_is_the_builds():
    assert os.path.samefile(kvshare.library_path(),
                            os.path.join(BUILD, "libkvshare.so.0"))
    assert re.fullmatch(r"\d+\.\d+\.\d+", kvshare.library_version())
    if os.environ.get("KVS_PY_EXPECT_INSTALLED"):
        # The test script installed the package: this run must use that
        # copy, not the source tree.
        src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        assert not os.path.abspath(kvshare.__file__).startswith(src + os.sep), \
            kvshare.__file__


def test_status_names_match_the_header():
    # kvs_status.h, read independently of the binding's own table.
    hdr = os.path.join(os.path.dirname(__file__), "../../../proto/kvs_status.h")
    codes = re.findall(r"X\((\w+), (-?\d+), \"([^\"]*)\"\)", open(hdr).read())
    assert len(codes) > 20
    for name, val, msg in codes:
        assert getattr(kvshare, name) == int(val)
        assert kvshare.status_name(int(val)) == name
        assert kvshare.strerror(int(val)) == msg
    assert kvshare.status_name(-errno.ECONNREFUSED) == "ECONNREFUSED"
    assert kvshare.strerror(-errno.ENOENT) == os.strerror(errno.ENOENT)


def test_connect_and_welcome(daemon):
    lay = daemon.cli("layout", "--json")
    with kvshare.Client(daemon.socket, name="pytest") as c:
        for k in ("block_size", "num_layers", "num_kv_heads", "head_dim",
                  "num_blocks", "block_stride"):
            assert getattr(c.layout, k) == lay[k], k
        assert c.layout.dtype_name == lay["dtype"]
        assert c.backend == "host" and c.gpu_uuid == ""
        assert c.mapped and c.pool_size == c.layout.num_blocks * c.layout.block_stride
        assert c.session_id > 0 and c.max_frame > 0
        assert c.fileno() >= 0
        assert "session" in repr(c)
        st = daemon.cli("stats", "--json")
        assert st["sessions"] == 2  # this client and the CLI's
    assert c.closed
    c.close()  # idempotent
    with pytest.raises(kvshare.ConnectionClosedError) as ei:
        c.ping()
    assert ei.value.status == kvshare.ECLOSED


def test_connect_via_environment(daemon, monkeypatch):
    monkeypatch.setenv("KVS_SOCKET", daemon.socket)
    with kvshare.Client() as c:
        c.ping(b"hello")


def test_connect_refused(tmp_path):
    with pytest.raises(kvshare.ConnectError) as ei:
        kvshare.Client(str(tmp_path / "nope.sock"))
    e = ei.value
    assert e.status == -errno.ENOENT and e.name == "ENOENT"
    assert "nope.sock" in str(e)


def test_del_closes_the_session(daemon):
    c = kvshare.Client(daemon.socket)
    c.lookup(5, [1, 2, 3])
    assert daemon.cli("stats", "--json")["num_requests"] == 1
    del c
    gc.collect()
    daemon.check_clean()


def test_stats_match_the_cli(client, daemon):
    client.lookup(1, list(range(9)))
    a = client.allocate(1, 9)
    assert len(a.blocks) == 3 and a.first_index == 0 and a.cow is None
    assert client.commit(1, 0, n=9) == 2
    mine = client.stats(check=True)
    cli = daemon.cli("stats", "--json", "--check")
    for k, v in cli.items():
        if k in ("check_status", "session_id"):
            continue
        if k in ("frames_in", "sessions"):  # the CLI's own session differs
            continue
        assert getattr(mine, k) == v, k
    assert mine.check_ok and mine.used_blocks == 3 and mine.num_requests == 1
    assert mine.tiers == () and mine.swap.swapped_requests == 0
    d = mine.as_dict()
    assert d["used_blocks"] == 3 and d["swap"]["swap_outs"] == 0
    client.free(1)


def test_no_tenants(client, daemon):
    """A daemon without tenants: the session has no tenant, and no tenant
    line comes back (stats, tenant_stats, a no_map client, the CLI)."""
    assert client.tenant == ""
    st = client.stats()
    assert st.tenant == "" and st.tenants == ()
    assert client.tenant_stats() == ()
    d = st.as_dict()
    assert d["tenant"] == "" and d["tenants"] == ()
    with kvshare.Client(daemon.socket, name="pytest-observer",
                        no_map=True) as c:
        assert not c.mapped and c.tenant == ""
        assert c.stats().tenants == ()
    cli = daemon.cli("stats", "--json")
    assert "tenant" not in cli and "tenants" not in cli, cli
    # kvs_tenant_stats: a 32-byte name, six uint32, six uint64.
    assert ctypes.sizeof(kvshare._lib.kvs_tenant_stats) == 32 + 6 * 4 + 6 * 8
    t = kvshare.TenantStats("a", 16, 10, 2, 4, 1, 1, 3, 40, 30, 0, 0, 65536)
    assert t.hit_rate == 0.75
    assert dataclasses.replace(t, query_tokens=0).hit_rate is None


def naive_hit(cached_prompts, prompt, bs):
    """Whole blocks of the longest prefix some committed prompt shares with
    this one, never the last token."""
    best = 0
    for p in cached_prompts:
        n = 0
        while n < min(len(p), len(prompt)) and p[n] == prompt[n]:
            n += 1
        best = max(best, n // bs * bs)  # only full (sealed) blocks
    return min(best, (len(prompt) - 1) // bs * bs)


def test_hits_match_a_naive_prefix_computation(client):
    rng = np.random.default_rng(7)
    bs = client.layout.block_size
    bases = [list(rng.integers(0, 50, 30)) for _ in range(3)]
    committed = []
    req = 100
    for i in range(24):
        base = bases[rng.integers(0, 3)]
        cut = int(rng.integers(1, 30))
        prompt = base[:cut] + list(rng.integers(0, 50, int(rng.integers(0, 8))))
        if not prompt:
            continue
        arg = np.array(prompt, dtype=np.int64) if i % 2 else prompt
        hit = client.lookup(req, arg)
        assert hit.hit_tokens == naive_hit(committed, prompt, bs), (i, prompt)
        assert len(hit.blocks) == hit.hit_tokens // bs
        rest = len(prompt) - hit.hit_tokens
        a = client.allocate(req, rest)
        assert a.first_index == len(hit.blocks)
        client.commit(req, hit.hit_tokens, n=rest)
        committed.append(prompt)
        client.free(req)
        req += 1


def test_tokens_numpy_and_lists_agree(client):
    toks = [3, 1, 4, 1, 5, 9, 2, 6, 5]
    client.lookup(1, toks)
    client.allocate(1, 9)
    client.commit(1, 0, toks)
    client.free(1)
    for i, form in enumerate([np.array(toks, np.uint32),
                              np.array(toks, np.int16), tuple(toks),
                              iter(toks)]):
        h = client.lookup(10 + i, form)
        assert h.hit_tokens == 8
        client.free(10 + i)
    with pytest.raises(kvshare.KvsError) as ei:
        client.lookup(20, range(0))  # the daemon wants 1 .. 2^32-1 tokens
    assert ei.value.status == kvshare.EINVAL and ei.value.message


def test_bad_arguments_raise_before_sending(client):
    with pytest.raises(ValueError):
        client.lookup(1, [1, -2, 3])
    with pytest.raises(ValueError):
        client.lookup(1, [1, 2 ** 32])
    with pytest.raises(ValueError):
        client.lookup(1, np.array([1, 2 ** 40]))
    with pytest.raises(TypeError):
        client.lookup(1, [1.5, 2])
    with pytest.raises(TypeError):
        client.lookup(1, np.array([1.0, 2.0]))
    with pytest.raises(TypeError):
        client.lookup(1, "abc")
    with pytest.raises(ValueError):
        client.free(-1)
    with pytest.raises(TypeError):
        client.free("7")
    with pytest.raises(TypeError):
        client.commit(1, 0)
    with pytest.raises(ValueError):
        client.commit(1, 0, [1, 2], n=3)
    # None of them reached the daemon
    assert client.stats().lookups == 0 and client.stats().num_requests == 0


def test_errors_carry_status_and_daemon_message(client):
    cases = []
    with pytest.raises(kvshare.UnknownRequestError) as ei:
        client.free(424242)
    cases.append((ei.value, kvshare.ENOENT))
    with pytest.raises(kvshare.UnknownRequestError) as ei:
        client.allocate(424242, 4)
    cases.append((ei.value, kvshare.ENOENT))
    client.lookup(1, [1, 2, 3, 4, 5])
    client.allocate(1, 5)
    with pytest.raises(kvshare.MismatchError) as ei:
        client.commit(1, 0, [9, 9, 9, 9, 9])
    cases.append((ei.value, kvshare.EMISMATCH))
    with pytest.raises(kvshare.KvsError) as ei:
        client.commit(1, 3, n=5)  # past the slots allocated
    cases.append((ei.value, None))
    with pytest.raises(kvshare.StateError) as ei:
        client.fork(1, 2)  # slots not written
    cases.append((ei.value, kvshare.ESTATE))
    client.commit(1, 0, n=5)
    client.fork(1, 2)
    with pytest.raises(kvshare.RequestExistsError) as ei:
        client.fork(1, 2)
    cases.append((ei.value, kvshare.EEXIST))
    with pytest.raises(kvshare.NoSpaceError) as ei:
        client.append(1, 250)
    cases.append((ei.value, kvshare.ENOSPC))
    for e, want in cases:
        if want is not None:
            assert e.status == want, e
        assert e.status < 0 and e.name.startswith("E")
        assert e.strerror == kvshare.strerror(e.status)
        assert e.message, e  # the daemon said why
        assert e.name in str(e) and e.message in str(e)
    # The session goes on after every error.
    client.ping()
    client.free(1)
    client.free(2)
    with pytest.raises(kvshare.UnknownRequestError):
        client.free(1)


def test_fork_cow_and_copy_blocks(client):
    bs = client.layout.block_size
    toks = list(range(1, bs + 3))  # one full block and a partial one
    client.lookup(1, toks)
    a = client.allocate(1, len(toks))
    for i, b in enumerate(a.blocks):
        client.block_array(b)[:] = i + 1
    client.commit(1, 0, n=len(toks))
    client.fork(1, 2)
    r = client.append(2, 1)
    assert r.cow is not None and not r.cow.done_by_daemon
    assert r.cow.src == a.blocks[1] and r.cow.dst not in a.blocks
    assert r.cow.index == 1
    client.copy_blocks([(r.cow.src, r.cow.dst)])
    assert np.array_equal(client.block_array(r.cow.dst),
                          client.block_array(r.cow.src))
    # The daemon copies when asked.
    client.fork(1, 3)
    client.set_daemon_copy(True)
    r3 = client.append(3, 1)
    assert r3.cow is not None and r3.cow.done_by_daemon
    assert (client.block_array(r3.cow.dst) == 2).all()
    for q in (1, 2, 3):
        client.free(q)


def test_preempt_keeps_the_request(client):
    toks = list(range(20, 31))
    client.lookup(1, toks)
    client.allocate(1, len(toks))
    client.commit(1, 0, n=len(toks))
    used = client.stats().used_blocks
    client.preempt(1)
    assert client.stats().used_blocks == 0 and client.stats().num_requests == 1
    h = client.lookup(1, toks)  # refill from the cache
    assert h.hit_tokens == 8 and client.stats().used_blocks == 2 < used
    client.free(1)


def test_ping_payloads(client):
    for n in (0, 1, 1000, 100000):
        client.ping(os.urandom(n))
