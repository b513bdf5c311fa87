"""examples/toy_engine.py runs against a daemon, and its second request
hits the shared system prompt's full blocks."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kvshare

from conftest import SMALL_LAYOUT

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples",
                       "toy_engine.py")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_toy_engine(daemon_factory, dtype):
    d = daemon_factory(["--backend", "host", "--dtype", dtype] + SMALL_LAYOUT)
    # The example imports the same kvshare as this test (installed, or the
    # source tree in a development run).
    env = dict(os.environ, PYTHONPATH=os.path.dirname(
        os.path.dirname(os.path.abspath(kvshare.__file__))))
    p = subprocess.run([sys.executable, EXAMPLE, "--socket", d.socket,
                        "--decode", "5", "--json"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    print(p.stdout)
    s = json.loads(p.stdout.strip().splitlines()[-1])
    bs, system = s["block_size"], s["system"]
    r1, r2 = s["requests"]
    assert r1["hit"] == 0 and r1["computed"] == r1["prompt"]
    # The second prompt shares the system prompt: its full blocks hit.
    assert r2["hit"] == system // bs * bs > 0
    assert r2["computed"] == r2["prompt"] - r2["hit"]
    assert r2["verified_blocks"] == system // bs
    # Sealed: every full block written by each request (prompt + decode).
    for r in (r1, r2):
        total = r["prompt"] + len(r["decoded"])
        assert r["sealed"] == total // bs - r["hit"] // bs
        assert len(r["decoded"]) == 5 and all(0 <= t < 32000 for t in r["decoded"])
    assert "check ok" in p.stdout
    st = d.cli("stats", "--json")
    assert st["hit_tokens"] == r2["hit"]
