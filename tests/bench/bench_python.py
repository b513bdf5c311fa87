#!/usr/bin/python3
"""bench_python -- the Python binding's cost per call against the C client's,
interleaved in one run against one daemon: a Ping round trip from Python
against the same from `kvshare ping` (C, libkvshare); and a Lookup + Free of
a 1024-token numpy prompt from Python against two Python Pings (what the
binding adds for the token array and the results).

Prints each round and the median ratio.  $KVS_BUILD names the build.
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

build = os.path.abspath(os.environ.get("KVS_BUILD", "build"))
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "client", "python"))
os.environ["KVS_LIBRARY"] = os.path.join(build, "libkvshare.so.0")
try:
    import numpy as np
    import kvshare
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

N = 3000
tmp = tempfile.mkdtemp(prefix="kvs-benchpy-")
sock = os.path.join(tmp, "s.sock")
d = subprocess.Popen([f"{build}/kvshared", "serve", "--socket", sock, "--pool-blocks",
                      "4096", "--log-level", "warn"], stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL, text=True)
d.stdout.readline()  # "ready SOCKET"
prompt = np.arange(1, 1025, dtype=np.uint32)
ping_r, look_r = [], []
with kvshare.Client(sock) as c:
    for rnd in range(5):
        t = time.perf_counter()
        for _ in range(N):
            c.ping()
        py_ping = (time.perf_counter() - t) / N * 1e6
        out = subprocess.run([f"{build}/kvshare", "--socket", sock, "ping", "--count", str(N)],
                             capture_output=True, text=True, check=True).stdout
        c_ping = float(re.search(r"avg ([0-9.]+) us", out).group(1))
        t = time.perf_counter()
        for i in range(N // 3):
            c.lookup(1000 + i, prompt)
            c.free(1000 + i)
        py_look = (time.perf_counter() - t) / (N // 3) * 1e6
        ping_r.append(py_ping / c_ping)
        look_r.append(py_look / (2 * py_ping))
        print(f"round {rnd}: ping python {py_ping:.1f} us / C {c_ping:.1f} us = {ping_r[-1]:.2f}x;"
              f" lookup+free of 1024 tokens {py_look:.1f} us = {look_r[-1]:.2f}x two pings")
d.terminate()
d.wait()
os.remove(sock) if os.path.exists(sock) else None
os.rmdir(tmp)
print(f"median: a Python ping is {statistics.median(ping_r):.2f}x the C client's; "
      f"a Python lookup+free of 1024 tokens is {statistics.median(look_r):.2f}x two Python pings")
