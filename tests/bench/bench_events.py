#!/usr/bin/python3
"""bench_events -- the KV event stream's size in each encoding: the same
workload (200 prompts of 8 blocks and one token, on a 256-block pool, so
that most of them are evicted again) on a daemon publishing maps (current
vLLM) and one publishing arrays (older vLLM); a subscriber counts the
payload bytes and the blocks they describe.  Deterministic (seeded), so
the figures repeat exactly.  $KVS_BUILD names the build.
"""
import os
import random
import shutil
import subprocess
import tempfile
import time

import msgpack
import zmq

build = os.path.abspath(os.environ.get("KVS_BUILD", "build"))
tmp = tempfile.mkdtemp(prefix="kvs-benche-")
res = {}
try:
    for fmt in ("map", "array"):
        sock, ep = f"{tmp}/{fmt}.sock", f"ipc://{tmp}/{fmt}.ev"
        d = subprocess.Popen([f"{build}/kvshared", "serve", "--socket", sock,
                              "--pool-blocks", "256", "--num-layers", "1", "--head-dim", "8",
                              "--kv-events-endpoint", ep, "--kv-events-format", fmt,
                              "--exit-with-parent", "yes"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        d.stdout.readline()  # "ready SOCKET"
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(ep)
        time.sleep(0.3)
        rng = random.Random(3)
        lines = ["fill " + " ".join(str(rng.randrange(1, 50000)) for _ in range(16 * 8 + 1))
                 for _ in range(200)]
        subprocess.run([f"{build}/tests/integration/kvs_drive", sock],
                       input="\n".join(lines) + "\nquit\n", text=True,
                       capture_output=True, check=True)
        nbytes = nblocks = nevents = 0
        while sub.poll(500):
            _, _, payload = sub.recv_multipart()
            b = msgpack.unpackb(payload, raw=False)
            for e in (b["events"] if isinstance(b, dict) else b[1]):
                h = e.get("block_hashes") if isinstance(e, dict) else (e[1] if len(e) > 1 else None)
                if h:
                    nblocks += len(h)
                    nevents += 1
            nbytes += len(payload)
        sub.close(linger=0)
        d.terminate()
        d.wait()
        res[fmt] = (nbytes, nblocks, nevents)
        print(f"{fmt:5}: {nbytes} payload bytes, {nblocks} blocks in {nevents} events: "
              f"{nbytes / nblocks:.1f} bytes per block")
    print(f"map / array bytes: {res['map'][0] / res['array'][0]:.3f}x "
          f"(+{(res['map'][0] - res['array'][0]) / res['map'][2]:.0f} bytes per event)")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
