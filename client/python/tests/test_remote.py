"""The remote tier under cuda pools, through the stand-in CUDA driver: two
daemons (two nodes) share one redis-server; a block a worker of one writes
into its "device" pool goes out through the daemon's pinned staging
buffers (device -> host copy on the daemon's stream, then SET), and comes
back into the other daemon's pool the same way (GET, staging, host ->
device); a worker of the second reads it with libkvshare's device copies,
byte for byte.  (test_remote.c covers the host pool, faults, AUTH and the
cluster.)"""
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np
import pytest

import kvshare
import kvshare.cuda
from conftest import SMALL_LAYOUT

STANDIN = os.environ.get("KVS_CUDA_DRIVER", "")
pytestmark = [
    pytest.mark.skipif(
        "standin" not in os.path.basename(STANDIN) or not os.path.exists(STANDIN),
        reason="KVS_CUDA_DRIVER does not name the stand-in driver "
               "(tests/integration/test_python.sh sets it)"),
    pytest.mark.skipif(shutil.which("redis-server") is None,
                       reason="no redis-server (Debian package redis-server)"),
]


@pytest.fixture
def redis_socket():
    d = tempfile.mkdtemp(prefix="kvs-py-redis-")
    sock = os.path.join(d, "redis.sock")
    p = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock,
                          "--save", "", "--appendonly", "no", "--logfile",
                          os.path.join(d, "log")])
    deadline = time.time() + 10
    while not os.path.exists(sock):
        assert p.poll() is None and time.time() < deadline, "redis-server did not start"
        time.sleep(0.02)
    yield sock
    p.kill()
    p.wait()
    shutil.rmtree(d, ignore_errors=True)


def remote_tier(c):
    tiers, _ = c.tier_stats()
    assert tiers[-1].name == "remote"
    return tiers[-1]


def test_cuda_pools_share_through_redis(daemon_factory, redis_socket):
    args = SMALL_LAYOUT + ["--backend", "cuda", "--dtype", "fp16",
                           "--remote-tier", "unix://" + redis_socket]
    env = {"KVS_CUDA_DRIVER": STANDIN}
    a = daemon_factory(args, env=env)
    b = daemon_factory(args, env=env)
    with kvshare.Client(a.socket) as w, kvshare.Client(b.socket) as r:
        assert w.backend == "cuda" and r.backend == "cuda"
        L = w.layout
        nfull = 3
        toks = list(range(5000, 5000 + nfull * L.block_size + 1))
        w.lookup(1, toks)
        al = w.allocate(1, len(toks))
        want = []
        for i, blk in enumerate(al.blocks[:nfull]):
            v = ((np.arange(np.prod(L.block_shape)) * (i + 3)) % 251).astype(np.float16)
            kvshare.cuda.memcpy_htod(w.block_tensor(blk).__cuda_array_interface__["data"][0], v)
            want.append(v)
        w.commit(1, 0, n=len(toks))
        deadline = time.time() + 10
        while remote_tier(w).demotions < nfull:
            assert time.time() < deadline, remote_tier(w)
            time.sleep(0.02)
        assert remote_tier(w).drops == 0
        h = r.lookup(2, toks)
        assert h.hit_tokens == nfull * L.block_size
        for blk, v in zip(h.blocks, want):
            got = np.empty(L.block_shape, np.float16)
            kvshare.cuda.memcpy_dtoh(got, r.block_tensor(blk).__cuda_array_interface__["data"][0])
            assert got.tobytes() == v.tobytes()
        st = remote_tier(r)
        assert st.promotions == nfull and st.hit_blocks == nfull
        assert st.checksum_failures == 0 and st.demotions == 0
        w.free(1)
        r.free(2)
