#!/usr/bin/python3
"""bench_metrics -- what a Prometheus scrape costs, against the same HTTP
server answering a constant page: GET /metrics (a snapshot taken on the
daemon's loop, rendered on the HTTP thread) vs GET / (no snapshot), one
keep-alive connection, interleaved rounds, while a client keeps the loop
busy with pings.  $KVS_BUILD names the build.
"""
import http.client
import os
import re
import statistics
import subprocess
import tempfile
import time

build = os.path.abspath(os.environ.get("KVS_BUILD", "build"))
tmp = tempfile.mkdtemp(prefix="kvs-benchm-")
sock = os.path.join(tmp, "s.sock")
d = subprocess.Popen([f"{build}/kvshared", "serve", "--socket", sock, "--pool-blocks", "4096",
                      "--host-tier-bytes", "64M", "--metrics-listen", "127.0.0.1:0"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
port = None
for line in d.stderr:
    m = re.search(r"metrics: http://127\.0\.0\.1:(\d+)/metrics", line)
    if m:
        port = int(m.group(1))
        break
d.stdout.readline()
busy = subprocess.Popen([f"{build}/kvshare", "--socket", sock, "ping", "--count", "10000000"],
                        stdout=subprocess.DEVNULL)
conn = http.client.HTTPConnection("127.0.0.1", port)
N = 300


def timed(path):
    t = time.perf_counter()
    size = 0
    for _ in range(N):
        conn.request("GET", path)
        r = conn.getresponse()
        size = len(r.read())
        assert r.status == 200, r.status
    return (time.perf_counter() - t) / N * 1e6, size


ratios = []
for rnd in range(5):
    base, _ = timed("/")
    scrape, size = timed("/metrics")
    ratios.append(scrape / base)
    print(f"round {rnd}: GET /metrics ({size} B) {scrape:.0f} us, GET / {base:.0f} us: "
          f"{ratios[-1]:.2f}x")
busy.kill()
busy.wait()
d.terminate()
d.wait()
os.rmdir(tmp)
print(f"median: a scrape costs {statistics.median(ratios):.2f}x a constant page from the "
      f"same server (the loop busy with pings)")
