"""kvs_testlib — what the Python integration tests share: a free TCP port,
a kvshared started and waited for, kvs_drive scripts, one metric of
/metrics, a process's RSS."""
import os
import re
import socket
import subprocess
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rss(pid):
    """Resident bytes of process pid."""
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    return 0


def metric(port, name, labels=""):
    """The value of family name{labels} on 127.0.0.1:port, or None."""
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                  timeout=10).read().decode()
    m = re.search(r"^%s%s (\d+)$" % (re.escape(name), re.escape(labels)),
                  body, re.M)
    return int(m.group(1)) if m else None


def start_daemon(build, dir, name, opts, env=None):
    """kvshared serving DIR/NAME.sock with opts, its output in DIR/NAME.log,
    ready (--ready-fd) or exited: (process, socket, log, ready)."""
    sock = os.path.join(dir, name + ".sock")
    log = os.path.join(dir, name + ".log")
    r, w = os.pipe()
    p = subprocess.Popen(
        [os.path.join(build, "kvshared"), "serve", "--socket", sock,
         "--ready-fd", str(w), "--exit-with-parent", "yes"] + list(opts),
        stdout=open(log, "w"), stderr=subprocess.STDOUT, pass_fds=(w,),
        env=env)
    os.close(w)
    with os.fdopen(r) as f:
        ready = "ready" in f.read()
    return p, sock, log, ready


def drive(build, sock, lines, timeout=120):
    """Runs kvs_drive on sock with lines: (exit status, its answers split,
    its stderr)."""
    r = subprocess.run([os.path.join(build, "tests/integration/kvs_drive"),
                        sock], input="\n".join(lines + ["quit"]) + "\n",
                       capture_output=True, text=True, timeout=timeout)
    return r.returncode, [l.split() for l in r.stdout.splitlines()], r.stderr
