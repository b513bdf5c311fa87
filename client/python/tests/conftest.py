"""Fixtures: a real kvshared per test, started like tests/lib/daemon.sh does
(--ready-fd), and checked for leaks when the test is done.

Environment: KVS_BUILD (the build folder holding kvshared, kvshare and
libkvshare.so.0; default: build/ of the repository this file is in, so
that pytest runs from the repository's root, from client/python or from
anywhere else) — the test script sets it, and KVS_LIBRARY so that the
binding loads that build's library.  The kvshare package is the installed
one; when none is installed, the sources beside these tests.
"""
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
BUILD = os.path.abspath(os.environ.get("KVS_BUILD") or
                        os.path.join(ROOT, "build"))
if not os.path.exists(os.path.join(BUILD, "kvshared")):
    raise pytest.UsageError(
        f"no kvshared in {BUILD}: build the C project first (make at "
        f"{ROOT}), or set KVS_BUILD to a build folder")
os.environ.setdefault("KVS_LIBRARY", os.path.join(BUILD, "libkvshare.so.0"))

try:
    import kvshare  # noqa: E402  (after KVS_LIBRARY is set)
except ImportError:
    sys.path.insert(0, os.path.dirname(HERE))
    import kvshare  # noqa: E402

# A small layout: 2 layers, 2 heads of 8, blocks of 4 tokens.  SMALL puts
# it in host memory even when KVS_CUDA_DRIVER is set (backend auto would
# take the stand-in GPU then).
SMALL_LAYOUT = ["--num-layers", "2", "--num-kv-heads", "2", "--head-dim", "8",
                "--block-size", "4", "--pool-blocks", "64"]
SMALL = ["--backend", "host"] + SMALL_LAYOUT


def child_env(extra=None):
    """The environment for the daemons and the CLI: under the sanitizer
    build the test script preloads the ASan runtime into python with leak
    detection off; the C programs get back what they would have had."""
    env = dict(os.environ)
    for var in ("ASAN_OPTIONS", "LD_PRELOAD"):
        saved = env.pop("KVS_PY_CHILD_" + var, None)
        if saved is not None:
            if saved:
                env[var] = saved
            else:
                env.pop(var, None)
    env.update(extra or {})
    return env


class Daemon:
    def __init__(self, args, env=None):
        self.dir = tempfile.mkdtemp(prefix="kvs-py-")
        self.socket = os.path.join(self.dir, "kvshared.sock")
        self.log = os.path.join(self.dir, "log")
        self.args = args
        r, w = os.pipe()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [os.path.join(BUILD, "kvshared"), "serve", "--socket",
                 self.socket, "--ready-fd", str(w)] + list(args),
                stdout=log, stderr=subprocess.STDOUT, pass_fds=(w,),
                env=child_env(env))
        os.close(w)
        got, deadline = b"", time.monotonic() + 30
        try:
            while b"ready" not in got and time.monotonic() < deadline:
                rl, _, _ = select.select([r], [], [], 0.2)
                if rl:
                    chunk = os.read(r, 256)
                    if not chunk:
                        break
                    got += chunk
                elif self.proc.poll() is not None:
                    break
        finally:
            os.close(r)
        if b"ready" not in got:
            self.kill()
            raise RuntimeError(f"kvshared did not become ready:\n{self.logtext()}")

    def logtext(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def cli(self, *args):
        """The kvshare CLI (an independent reader of the daemon's state)."""
        out = subprocess.run([os.path.join(BUILD, "kvshare"), "--socket",
                              self.socket] + list(args), check=True,
                             capture_output=True, text=True,
                             env=child_env()).stdout
        return json.loads(out) if "--json" in args else out

    def check_clean(self):
        """Nothing leaked: the invariant holds, no block in use, no request,
        only the checking session connected (CLI, independent of the
        binding)."""
        s = None
        for _ in range(50):  # sessions close asynchronously in the daemon
            s = self.cli("stats", "--json", "--check")
            if s["sessions"] == 1 and s["used_blocks"] == 0 and \
                    s["num_requests"] == 0:
                break
            time.sleep(0.05)
        assert s["check"] == 0, s
        assert s["sessions"] == 1, s
        assert s["used_blocks"] == 0, s
        assert s["num_requests"] == 0, s
        return s

    def stop(self):
        """SIGTERM; the daemon must exit 0 and remove its socket."""
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=30)
        assert rc == 0, f"kvshared exited {rc} after SIGTERM:\n{self.logtext()}"
        assert not os.path.exists(self.socket), "socket left behind"

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def cleanup(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_daemon(args=SMALL, env=None):
    return Daemon(args, env)


@pytest.fixture
def daemon_factory(request):
    """start(args): a daemon; each is checked clean and stopped at the end
    (a test that leaves a client or a view alive fails here)."""
    started = []

    def start(args=SMALL, env=None):
        """env: variables to add to the daemon's environment."""
        d = start_daemon(args, env)
        started.append(d)
        return d

    yield start
    import gc
    gc.collect()
    try:
        for d in started:
            if d.proc.poll() is None:
                d.check_clean()
                d.stop()
    finally:
        for d in started:
            d.cleanup()


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory()


@pytest.fixture
def client(daemon):
    with kvshare.Client(daemon.socket, name="pytest") as c:
        yield c
