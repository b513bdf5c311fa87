#!/bin/bash
# test_deploy — deploy/ against the built daemon:
#   1. the systemd units: systemd-analyze verify (ExecStart pointed at the
#      built kvshared), the hardening's exposure score, the sysusers file in
#      a scratch root, `make install` puts the units where the docs say
#      and kvshare-replay beside kvshared (`kvshared replay` runs it);
#   2. socket activation: kvshared under systemd-socket-activate serves the
#      passed socket, says READY=1/STOPPING=1 on NOTIFY_SOCKET and leaves
#      the socket in place; a restarted daemon serves the same socket; a
#      passed fd that is no listening Unix stream socket, or two of them,
#      stops it with a clear message;
#   3. the Kubernetes manifests: yamllint, their structure (kinds, the
#      shared hostPath socket folder, one socket per GPU, the GPU request
#      on the daemon and the worker, ports, probes, ids), the daemon's flags
#      and config (kvshared --print-config), Pod Security "baseline" (a
#      checker written from the Pod Security Standards: only the documented
#      hostPath breaks it, under the namespaces' exemption labels), the
#      Kubernetes API's field names where python3-kubernetes is installed;
#   4. deploy/Dockerfile without docker: COPY sources, the build stage's
#      install tree, the runtime packages against the binaries' libraries,
#      Debian's packages only (no pip, curl or wget).
# A part whose tool is missing is skipped with "SKIP part: ..." and the test
# then exits 77 (after every other part ran and passed).
set -u
build=${KVS_BUILD:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-/usr/bin/python3}
dir=
pids=()
skipped=()
# Wait until a connection to the socket at $1 is accepted: systemd-socket-
# activate makes the socket file when it binds, a moment before it listens,
# and a connection in between is refused.  The activator execs the daemon
# on the first accepted one, which here closes at once.
await_listen() {
  "$py" - "$1" <<'EOF'
import socket, sys, time
for _ in range(50):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
    finally:
        s.close()
sys.exit(1)
EOF
}
fail() {
  echo "FAIL: $*" >&2
  [ -n "$dir" ] || exit 1
  for f in "$dir"/*.log; do
    [ -f "$f" ] && sed "s#^#  $(basename "$f")| #" "$f" >&2
  done
  exit 1
}
skip_part() { echo "SKIP part: $*"; skipped+=("$*"); }
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  [ -n "$dir" ] && rm -rf "$dir"
}
trap cleanup EXIT

[ -d "$build" ] || { echo "SKIP: no build folder $build"; exit 77; }
build=$(cd "$build" && pwd)
cli=$build/kvshare
daemon=$build/kvshared
[ -x "$daemon" ] || { echo "SKIP: $daemon not built"; exit 77; }
[ -x "$cli" ] || fail "$cli not built"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-deploy-XXXXXX")
dep=$root/deploy
small=(--pool-blocks 64 --num-layers 1 --num-kv-heads 1 --head-dim 8)

# ---- 1. systemd units ------------------------------------------------------
echo "== units"
unit_val() { # FILE KEY: every value of KEY= in FILE, one a line
  sed -n "s/^$2=//p" "$1"
}
svc=$dep/kvshared.service
sock_unit=$dep/kvshared.socket
[ "$(unit_val "$sock_unit" ListenStream)" = /run/kvshare/kvshared.sock ] ||
  fail "kvshared.socket: ListenStream"
[ "$(unit_val "$sock_unit" SocketMode)" = 0660 ] || fail "kvshared.socket: SocketMode"
[ "$(unit_val "$sock_unit" Accept)" != yes ] || fail "kvshared.socket: Accept=yes"
[ "$(unit_val "$svc" Type)" = notify ] || fail "kvshared.service: Type"
[ "$(unit_val "$svc" Requires)" = kvshared.socket ] || fail "kvshared.service: Requires"
unit_val "$svc" After | grep -qw kvshared.socket || fail "kvshared.service: After"
for fam in AF_UNIX AF_INET AF_INET6; do
  unit_val "$svc" RestrictAddressFamilies | grep -qw "$fam" ||
    fail "kvshared.service: RestrictAddressFamilies lacks $fam"
done
for key in ProtectSystem=strict PrivateTmp=yes NoNewPrivileges=yes ProtectHome=yes \
           DevicePolicy=closed; do
  grep -qx "$key" "$svc" || fail "kvshared.service: no $key"
done
unit_val "$svc" DeviceAllow | grep -q nvidia || fail "kvshared.service: no DeviceAllow for the GPU"
# RuntimeDirectory= would be removed when the service stops, and the socket
# unit's socket in it.
grep -q '^RuntimeDirectory=' "$svc" && fail "kvshared.service: RuntimeDirectory= removes the socket on stop"
unit_val "$svc" ExecStart | grep -q -- '--socket' &&
  fail "kvshared.service: --socket in ExecStart (the socket unit names it)"
user=$(unit_val "$svc" User) group=$(unit_val "$svc" Group)
[ "$(unit_val "$sock_unit" SocketGroup)" = "$group" ] || fail "SocketGroup is not the service's Group"
[ "$(unit_val "$sock_unit" SocketUser)" = "$user" ] || fail "SocketUser is not the service's User"

if ! command -v systemd-analyze >/dev/null; then
  skip_part "systemd-analyze is not installed: units not verified"
else
  mkdir "$dir/units" "$dir/bad"
  cp "$sock_unit" "$dir/units/"
  sed "s|^ExecStart=/usr/local/bin/kvshared |ExecStart=$daemon |" "$svc" >"$dir/units/kvshared.service"
  grep -q "^ExecStart=$daemon " "$dir/units/kvshared.service" ||
    fail "ExecStart of kvshared.service is not /usr/local/bin/kvshared ..."
  # Can verify run here at all?  A unit that is certainly right:
  printf '[Service]\nExecStart=/bin/true\n' >"$dir/bad/probe.service"
  if ! out=$(cd "$dir/bad" && systemd-analyze verify ./probe.service 2>&1) || [ -n "$out" ]; then
    skip_part "systemd-analyze verify cannot run here: $(head -1 <<<"$out")"
  else
    # verify exits 0 on an unknown key or a bad value, but says so: both
    # the status and the silence count.  First, that it does say so.
    sed 's/^Type=notify/Tpye=notify/' "$dir/units/kvshared.service" >"$dir/bad/kvshared.service"
    cp "$sock_unit" "$dir/bad/"
    out=$(cd "$dir/bad" && systemd-analyze verify ./kvshared.socket ./kvshared.service 2>&1)
    grep -q "Tpye" <<<"$out" || fail "systemd-analyze verify did not notice a bad key: $out"
    out=$(cd "$dir/units" && systemd-analyze verify ./kvshared.socket ./kvshared.service 2>&1) ||
      fail "systemd-analyze verify: $out"
    [ -z "$out" ] || fail "systemd-analyze verify: $out"
    echo "systemd-analyze verify: ok"
    # The hardening's exposure (0 best, 10 worst); 1.7 when written.
    if out=$(cd "$dir/units" && systemd-analyze security --offline=yes --threshold=25 \
               ./kvshared.service 2>&1); then
      grep 'Overall exposure' <<<"$out"
    elif grep -q 'Overall exposure' <<<"$out"; then
      fail "kvshared.service: exposure over 2.5: $(grep 'Overall exposure' <<<"$out")"
    else
      skip_part "systemd-analyze security --offline cannot run here: $(tail -1 <<<"$out")"
    fi
  fi
fi

if ! command -v systemd-sysusers >/dev/null; then
  skip_part "systemd-sysusers is not installed: kvshare.sysusers not tried"
else
  mkdir -p "$dir/root/etc"
  systemd-sysusers --root="$dir/root" - <"$dep/kvshare.sysusers" >"$dir/sysusers.log" 2>&1 ||
    fail "systemd-sysusers on kvshare.sysusers"
  grep -q "^$user:x:[0-9]*:[0-9]*:.*:/usr/sbin/nologin$" "$dir/root/etc/passwd" ||
    fail "kvshare.sysusers makes no user $user: $(cat "$dir/root/etc/passwd")"
  grep -q "^$group:x:" "$dir/root/etc/group" || fail "kvshare.sysusers makes no group $group"
  echo "sysusers: user $user, group $group"
fi

# `make install` (the install recipe only: -o all keeps the build as it is)
# puts the units next to the example config, ExecStart under PREFIX.
make -s -C "$root" BUILD="$build" DESTDIR="$dir/inst" PREFIX=/usr/local -o all install \
  >"$dir/install.log" 2>&1 || fail "make install"
share=$dir/inst/usr/local/share/kvshare
for f in kvshared.service kvshared.socket kvshare.sysusers kvshared.conf; do
  [ -f "$share/$f" ] || fail "make install: no share/kvshare/$f"
done
grep -q '^ExecStart=/usr/local/bin/kvshared ' "$share/kvshared.service" ||
  fail "make install: ExecStart"
# The programs, the replayer beside the daemon: `kvshared replay` runs it.
for f in kvshared kvshare kvshare-replay; do
  [ -x "$dir/inst/usr/local/bin/$f" ] || fail "make install: no bin/$f"
done
"$dir/inst/usr/local/bin/kvshared" replay --help 2>&1 | grep -q '^usage: kvshare-replay ' ||
  fail "the installed kvshared replay does not run the installed kvshare-replay"
rm -f "$dir/install.log" "$dir/sysusers.log"

# ---- 2. socket activation --------------------------------------------------
echo "== socket activation"
# Listens on a datagram socket as systemd's NOTIFY_SOCKET does; writes what
# it receives to a file, one message a line.
"$py" - "$dir/notify.sock" "$dir/notify.out" <<'EOF' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(60)
with open(sys.argv[2], "w") as out:
    while True:
        try:
            m = s.recv(4096).decode()
        except socket.timeout:
            break
        out.write(m.replace("\n", " ") + "\n")
        out.flush()
        if "STOPPING=1" in m:
            break
EOF
pids+=($!)
if ! command -v systemd-socket-activate >/dev/null; then
  skip_part "systemd-socket-activate is not installed"
else
  sock=$dir/act/kvshared.sock
  mkdir "$dir/act"
  for _ in $(seq 50); do [ -S "$dir/notify.sock" ] && break; sleep 0.1; done
  # The activator binds and listens, waits for the first connection, then
  # execs the daemon with the socket as fd 3 (same pid).
  systemd-socket-activate -l "$sock" -E NOTIFY_SOCKET="$dir/notify.sock" \
    -E ASAN_OPTIONS -E UBSAN_OPTIONS -E LSAN_OPTIONS \
    "$daemon" "${small[@]}" >"$dir/act.log" 2>&1 &
  apid=$!
  pids+=("$apid")
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  [ -S "$sock" ] || fail "systemd-socket-activate made no socket"
  ino=$(stat -c %i "$sock")
  await_listen "$sock" || fail "the activator never listened"
  out=$("$cli" --socket "$sock" stats --check) || fail "stats through the passed socket: exit $?"
  grep -Eq '^num_blocks +64$' <<<"$out" || fail "stats: $out"
  grep -q "socket activation: serving $sock (fd 3" "$dir/act.log" || fail "no 'socket activation' line"
  grep -q "^ready $sock$" "$dir/act.log" || fail "no ready line naming the passed socket"
  grep -q "not the configured socket" "$dir/act.log" && fail "a --socket warning without --socket"
  [ "$(stat -c %i "$sock")" = "$ino" ] || fail "the socket was replaced"
  [ "$(ls "$dir/act")" = kvshared.sock ] || fail "files made next to the socket: $(ls "$dir/act")"
  kill -TERM "$apid"
  wait "$apid"; rc=$?
  [ $rc = 0 ] || fail "kvshared exited $rc after SIGTERM"
  [ -S "$sock" ] || fail "kvshared removed the socket it was passed"
  [ "$(stat -c %i "$sock")" = "$ino" ] || fail "the socket was replaced"
  for _ in $(seq 50); do grep -q STOPPING=1 "$dir/notify.out" && break; sleep 0.1; done
  cat "$dir/notify.out"
  grep -q "^READY=1 STATUS=listening on $sock" "$dir/notify.out" || fail "no READY=1 on NOTIFY_SOCKET"
  grep -q "^STOPPING=1" "$dir/notify.out" || fail "no STOPPING=1 on NOTIFY_SOCKET"
  rm -f "$sock"

  # An explicit --socket elsewhere: a warning, the passed socket served,
  # nothing made at the other path.
  systemd-socket-activate -l "$sock" -E ASAN_OPTIONS -E UBSAN_OPTIONS -E LSAN_OPTIONS \
    "$daemon" "${small[@]}" --socket "$dir/other/k.sock" >"$dir/act.log" 2>&1 &
  apid=$!
  pids+=("$apid")
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  await_listen "$sock" || fail "the activator never listened (--socket elsewhere)"
  "$cli" --socket "$sock" ping >/dev/null || fail "ping with --socket elsewhere: exit $?"
  grep -q "warn: socket activation: serving the socket systemd passed, $sock, not the configured socket $dir/other/k.sock" \
    "$dir/act.log" || fail "no warning about --socket"
  [ -e "$dir/other" ] && fail "kvshared made the --socket path under activation"
  kill -TERM "$apid"
  wait "$apid"; rc=$?
  [ $rc = 0 ] || fail "kvshared (--socket elsewhere) exited $rc after SIGTERM"
  rm -f "$sock"

  # Two sockets: refused.
  systemd-socket-activate -l "$sock" -l "$dir/act/two.sock" \
    -E ASAN_OPTIONS -E UBSAN_OPTIONS -E LSAN_OPTIONS \
    "$daemon" "${small[@]}" >"$dir/act.log" 2>&1 &
  apid=$!
  pids+=("$apid")
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  # (the daemon this execs must then refuse)
  await_listen "$sock" || fail "two sockets: the activator never listened"
  "$cli" --socket "$sock" ping >/dev/null 2>&1 && fail "a daemon passed two sockets served"
  wait "$apid"; rc=$?
  [ $rc = 1 ] || fail "two sockets: exit $rc, wanted 1"
  grep -q "socket activation: 2 descriptors passed" "$dir/act.log" || fail "two sockets: no clear error"
  rm -f "$dir/act.log"
fi

# What systemd does without a helper: hold the socket, start the daemon
# with it (LISTEN_PID = the daemon's pid, so through `sh -c exec`), stop it,
# start another on the same socket.  And the descriptors it must refuse.
"$py" - "$daemon" "$cli" "$dir" "${small[@]}" <<'EOF' || fail "activation by hand (above)"
import fcntl, os, socket, subprocess, sys, time
daemon, cli, d, small = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
path = os.path.join(d, "hand.sock")
never = os.path.join(d, "never", "k.sock")
procs = []

def start(fds, nfds, extra=()):
    """kvshared with fds dup'ed to 3, 4, ... and LISTEN_FDS=nfds."""
    for i, fd in enumerate(fds):
        os.set_inheritable(fd, True)
    # In the child, after fork: the passed ones become fd 3, 4, ... (through
    # fds above them, so that no dup2 overwrites one not yet moved).
    def child():
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
        for i, fd in enumerate(high):
            os.dup2(fd, 3 + i)
    cmd = ['sh', '-c', 'LISTEN_PID=$$ LISTEN_FDS=%s exec "$@"' % nfds, 'sh',
           daemon, *small, '--socket', never, *extra]
    p = subprocess.Popen(cmd, preexec_fn=child, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         pass_fds=tuple(range(3, 3 + len(fds))) if fds else ())
    procs.append(p)
    return p

def stats_ok(sock):
    r = subprocess.run([cli, '--socket', sock, 'stats', '--check'],
                       capture_output=True, text=True, timeout=30)
    return r.returncode == 0 and 'num_blocks' in r.stdout

def refused(fds, nfds, want, what):
    p = start(fds, nfds)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 1, (what, p.returncode, out)
    assert want in out, (what, want, out)
    assert not os.path.exists(never), (what, 'made the --socket path')
    print('%s: refused: %s' % (what, out.strip().splitlines()[-1]))

try:
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(path)
    ls.listen(64)
    ino = os.stat(path).st_ino
    waiting = None
    for run in (1, 2):
        p = start([ls.fileno()], 1)
        if waiting:
            r = waiting.wait(timeout=30)
            assert r == 0, 'the client that came between two daemons: exit %d' % r
        assert stats_ok(path), 'run %d: stats' % run
        p.terminate()
        out, _ = p.communicate(timeout=30)
        assert p.returncode == 0, (run, p.returncode, out)
        assert 'socket activation: serving %s' % path in out, out
        assert os.stat(path).st_ino == ino, 'run %d: the socket was replaced' % run
        print('run %d: served %s, exit 0, socket kept' % (run, path))
        # No daemon now: a client waits in the backlog for the next one.
        waiting = subprocess.Popen([cli, '--socket', path, 'stats'],
                                   stdout=subprocess.DEVNULL)
        procs.append(waiting)
        time.sleep(0.3)
        assert waiting.poll() is None, 'a client was refused between two daemons'
    waiting.kill()
    waiting.wait()

    with open('/dev/null') as f:
        refused([f.fileno()], 1, 'fd 3 is not a Unix socket', 'a file')
    refused([], 1, 'socket activation: bad LISTEN_FDS', 'a closed fd')
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t.bind(('127.0.0.1', 0))
    t.listen(1)
    refused([t.fileno()], 1, 'fd 3 is not a Unix socket', 'a TCP socket')
    g = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    g.bind(os.path.join(d, 'dgram.sock'))
    refused([g.fileno()], 1, 'fd 3 is not a stream socket', 'a datagram socket')
    a, b = socket.socketpair()
    refused([a.fileno()], 1, 'fd 3 is not listening', 'a connection')
    ab = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ab.bind('\0kvs-test-deploy-%d' % os.getpid())
    ab.listen(1)
    refused([ab.fileno()], 1, 'unnamed or abstract socket', 'an abstract socket')
    l2 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    l2.bind(os.path.join(d, 'second.sock'))
    l2.listen(1)
    refused([ls.fileno(), l2.fileno()], 2, '2 descriptors passed', 'two sockets')
    refused([], 'x', 'socket activation: bad LISTEN_FDS', 'LISTEN_FDS=x')
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
EOF

# ---- 3. Kubernetes manifests -----------------------------------------------
echo "== kubernetes"
k8s=$dep/k8s
if command -v yamllint >/dev/null; then
  yamllint --strict "$k8s" || fail "yamllint"
  echo "yamllint: ok"
else
  skip_part "yamllint is not installed"
fi
if ! "$py" -c 'import yaml' 2>/dev/null; then
  skip_part "python3-yaml is not installed: manifests not checked"
else
  "$py" - "$k8s" "$daemon" "$dir" <<'EOF' || fail "the manifests (above)"
import os, subprocess, sys, yaml
k8s, daemon, d = sys.argv[1:4]
docs = {}
for f in sorted(os.listdir(k8s)):
    with open(os.path.join(k8s, f)) as fh:
        for doc in yaml.safe_load_all(fh):
            if doc:
                docs.setdefault(doc['kind'], []).append(doc)
kinds = sorted(docs)
assert set(kinds) == {'ConfigMap', 'DaemonSet', 'Namespace', 'Pod',
                      'ServiceAccount', 'Service'}, kinds
assert all(len(v) == 1 for k, v in docs.items() if k != 'Namespace'), docs.keys()
(sa,), (cm,), (ds,), (svc,), (pod,) = (
    docs['ServiceAccount'], docs['ConfigMap'],
    docs['DaemonSet'], docs['Service'], docs['Pod'])
nss = {n['metadata']['name']: n for n in docs['Namespace']}
assert len(nss) == 2, nss.keys()
name = ds['metadata']['namespace']
ns, wns = nss[name], nss[pod['metadata']['namespace']]
assert ns is not wns
for o in (sa, cm, ds, svc):
    assert o['metadata']['namespace'] == name, o['metadata']
assert ds['apiVersion'] == 'apps/v1'

spec = ds['spec']
labels = spec['template']['metadata']['labels']
assert all(labels.get(k) == v for k, v in spec['selector']['matchLabels'].items())
assert all(labels.get(k) == v for k, v in svc['spec']['selector'].items())
pspec = spec['template']['spec']
assert pspec['serviceAccountName'] == sa['metadata']['name']
(c,) = pspec['containers']

def flag(args, name):
    i = args.index(name)
    return args[i + 1]

# One socket per GPU: the daemon names its socket in --socket-dir by its
# GPU; --socket would give every daemon of the node the same path.
args = c['args']
assert '--socket' not in args, args
sockdir = flag(args, '--socket-dir')

# The socket's folder: a hostPath, mounted there, in the daemon and the worker.
def host_mount(ps, cont, want_dir):
    vols = {v['name']: v for v in ps['volumes']}
    for m in cont['volumeMounts']:
        v = vols[m['name']]
        if 'hostPath' in v and m['mountPath'] == want_dir:
            return v['hostPath']['path'], m
    raise AssertionError('no hostPath mounted at %s' % want_dir)

hp, _ = host_mount(pspec, c, sockdir)
for ic in pspec.get('initContainers', []):
    host_mount(pspec, ic, sockdir)
wspec = pod['spec']
(w,) = wspec['containers']
env = {e['name']: e.get('value') for e in w.get('env', [])}
# The worker is given the folder: libkvshare picks its GPU's socket.
assert env['KVS_SOCKET'] == sockdir, (env, sockdir)
whp, wm = host_mount(wspec, w, sockdir)
assert whp == hp, (whp, hp)
denv = {e['name']: e.get('value') for e in c.get('env', [])}
assert denv.get('KVS_SOCKET') == sockdir, denv

# Ids: the daemon's group owns the socket; the worker's primary group is
# that group, and allow_gids admits it.
dsec, wsec = pspec['securityContext'], wspec['securityContext']
assert dsec['runAsNonRoot'] and dsec['runAsUser'] != 0
assert wsec['runAsGroup'] == dsec['runAsGroup'], (wsec, dsec)
init_cmd = ' '.join(pspec['initContainers'][0]['command'])
assert '%d:%d' % (dsec['runAsUser'], dsec['runAsGroup']) in init_cmd, init_cmd

# The GPU: the daemon requests one through the device plugin, as the
# workers do, and sees that one only (no NVIDIA_VISIBLE_DEVICES of its own:
# the device plugin sets it).
assert int(w['resources']['limits']['nvidia.com/gpu']) == 1
assert int(c['resources']['limits']['nvidia.com/gpu']) == 1, c['resources']
assert 'NVIDIA_VISIBLE_DEVICES' not in denv, denv
assert pspec.get('runtimeClassName') == 'nvidia'

# The daemon accepts the flags and the ConfigMap's config.
(conf_name,) = [k for k in cm['data']]
mounts = {m['name']: m['mountPath'] for m in c['volumeMounts']}
vols = {v['name']: v for v in pspec['volumes']}
(cm_vol,) = [n for n, v in vols.items()
             if v.get('configMap', {}).get('name') == cm['metadata']['name']]
assert flag(args, '--config') == os.path.join(mounts[cm_vol], conf_name)
conf = os.path.join(d, conf_name)
with open(conf, 'w') as fh:
    fh.write(cm['data'][conf_name])
a = list(args)
a[a.index('--config') + 1] = conf
r = subprocess.run([daemon, *a, '--print-config'], capture_output=True,
                   text=True)
assert r.returncode == 0, ('kvshared refuses the manifest\'s args', r.stderr)
vals = dict(l.split(' = ', 1) for l in r.stdout.splitlines() if ' = ' in l)
assert vals['socket_dir'] == sockdir and not vals['socket'].strip(), vals
assert str(wsec['runAsGroup']) in vals['allow_gids'].split(','), vals['allow_gids']
metrics = vals['metrics_listen']
port = int(metrics.rsplit(':', 1)[1])

# Ports: --metrics-listen, the container port, the annotations, the Service.
(cp,) = [p for p in c['ports'] if p['name'] == 'metrics']
assert cp['containerPort'] == port, (cp, port)
ann = spec['template']['metadata']['annotations']
assert ann['prometheus.io/scrape'] == 'true' and int(ann['prometheus.io/port']) == port
assert ann['prometheus.io/path'] == '/metrics'
(sp,) = svc['spec']['ports']
assert sp['port'] == port and sp['targetPort'] in (port, 'metrics'), sp
assert svc['spec'].get('clusterIP') == 'None'

# Probes: present, and they ask the daemon through its socket.
for probe in ('livenessProbe', 'readinessProbe', 'startupProbe'):
    cmd = c[probe]['exec']['command']
    assert cmd[0] == 'kvshare' and 'stats' in cmd, (probe, cmd)
    assert flag(cmd, '--socket') == sockdir, (probe, cmd)

# ---- Pod Security "baseline", as the Pod Security Standards define it
# (kubernetes.io/docs/concepts/security/pod-security-standards/).
BASELINE_CAPS = {'AUDIT_WRITE', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID',
                 'KILL', 'MKNOD', 'NET_BIND_SERVICE', 'SETFCAP', 'SETGID',
                 'SETPCAP', 'SETUID', 'SYS_CHROOT'}
SAFE_SYSCTLS = {'kernel.shm_rmid_forced', 'net.ipv4.ip_local_port_range',
                'net.ipv4.ip_unprivileged_port_start', 'net.ipv4.tcp_syncookies',
                'net.ipv4.ping_group_range', 'net.ipv4.ip_local_reserved_ports',
                'net.ipv4.tcp_keepalive_time', 'net.ipv4.tcp_fin_timeout',
                'net.ipv4.tcp_keepalive_intvl', 'net.ipv4.tcp_keepalive_probes'}
SELINUX_TYPES = {None, '', 'container_t', 'container_init_t',
                 'container_kvm_t', 'container_engine_t'}

def baseline(meta, ps):
    """The baseline rules a pod (metadata, spec) breaks, one string each."""
    bad = []
    for f in ('hostNetwork', 'hostPID', 'hostIPC'):
        if ps.get(f):
            bad.append(f)
    for v in ps.get('volumes', []):
        if 'hostPath' in v:
            bad.append('hostPath volume %s' % v['name'])
    psc = ps.get('securityContext') or {}
    for sc, who in [(psc, 'pod')] + [
            (ct.get('securityContext') or {}, ct['name'])
            for key in ('initContainers', 'containers', 'ephemeralContainers')
            for ct in ps.get(key, [])]:
        if sc.get('privileged'):
            bad.append('privileged %s' % who)
        if (sc.get('windowsOptions') or {}).get('hostProcess'):
            bad.append('hostProcess %s' % who)
        extra = set((sc.get('capabilities') or {}).get('add', [])) - BASELINE_CAPS
        if extra:
            bad.append('capabilities %s of %s' % (sorted(extra), who))
        sel = sc.get('seLinuxOptions') or {}
        if sel.get('type') not in SELINUX_TYPES or sel.get('user') or sel.get('role'):
            bad.append('seLinuxOptions of %s' % who)
        if sc.get('procMount', 'Default') != 'Default':
            bad.append('procMount of %s' % who)
        if (sc.get('seccompProfile') or {}).get('type') == 'Unconfined':
            bad.append('seccomp Unconfined in %s' % who)
        if (sc.get('appArmorProfile') or {}).get('type') == 'Unconfined':
            bad.append('AppArmor Unconfined in %s' % who)
    for s_ in psc.get('sysctls', []):
        if s_['name'] not in SAFE_SYSCTLS:
            bad.append('sysctl %s' % s_['name'])
    for key in ('initContainers', 'containers', 'ephemeralContainers'):
        for ct in ps.get(key, []):
            for p in ct.get('ports', []):
                if p.get('hostPort'):
                    bad.append('hostPort %s of %s' % (p['hostPort'], ct['name']))
    for k, v in (meta.get('annotations') or {}).items():
        if k.startswith('container.apparmor.security.beta.kubernetes.io/') and \
                v != 'runtime/default' and not v.startswith('localhost/'):
            bad.append('AppArmor annotation %s' % k)
    return bad

# The checker itself: each rule is found.
probe_pod = {
    'hostNetwork': True, 'hostPID': True, 'hostIPC': True,
    'volumes': [{'name': 'h', 'hostPath': {'path': '/'}}],
    'securityContext': {'sysctls': [{'name': 'kernel.msgmax', 'value': '1'}],
                        'seccompProfile': {'type': 'Unconfined'}},
    'containers': [{'name': 'x', 'ports': [{'containerPort': 1, 'hostPort': 80}],
                    'securityContext': {
                        'privileged': True, 'procMount': 'Unmasked',
                        'capabilities': {'add': ['SYS_ADMIN', 'CHOWN']},
                        'seLinuxOptions': {'type': 'spc_t'},
                        'appArmorProfile': {'type': 'Unconfined'},
                        'windowsOptions': {'hostProcess': True}}}]}
found = baseline({'annotations': {
    'container.apparmor.security.beta.kubernetes.io/x': 'unconfined'}}, probe_pod)
assert len(found) == 14, found
assert baseline({}, {'containers': [{'name': 'x', 'securityContext': {
    'capabilities': {'add': ['CHOWN'], 'drop': ['ALL']},
    'seccompProfile': {'type': 'RuntimeDefault'}}}]}) == []

PSA = 'pod-security.kubernetes.io/'
for what, meta, ps, n in (('the DaemonSet', spec['template']['metadata'], pspec, ns),
                          ('the worker', pod['metadata'], wspec, wns)):
    bad = baseline(meta, ps)
    # The socket folder, and nothing else.
    assert bad == ['hostPath volume %s' % [v['name'] for v in ps['volumes']
                                           if 'hostPath' in v][0]], (what, bad)
    labels = n['metadata'].get('labels', {})
    assert labels.get(PSA + 'enforce') == 'privileged', (what, labels)
    assert labels.get(PSA + 'warn') == 'baseline', (what, labels)
    assert labels.get(PSA + 'audit') == 'baseline', (what, labels)
    # What baseline leaves to restricted, kept anyway: non-root, no
    # escalation, capabilities dropped, RuntimeDefault seccomp.
    assert ps['securityContext']['runAsNonRoot'], what
    assert ps['securityContext']['seccompProfile']['type'] == 'RuntimeDefault', what
    for ct in ps['containers']:
        sc = ct['securityContext']
        assert sc['allowPrivilegeEscalation'] is False, (what, ct['name'])
        assert sc['capabilities']['drop'] == ['ALL'], (what, ct['name'])
print('Pod Security baseline: the DaemonSet and the worker break it only by '
      'their hostPath socket folder; namespaces %s and %s enforce privileged, '
      'warn and audit baseline' % (ns['metadata']['name'], wns['metadata']['name']))
print('manifests: %s; sockets per GPU in %s (hostPath %s); daemon and worker '
      'request nvidia.com/gpu; metrics port %d; gid %d'
      % (', '.join(kinds), sockdir, hp, port, dsec['runAsGroup']))
with open(os.path.join(d, 'metrics.port'), 'w') as fh:
    fh.write('%d %d %d\n' % (port, dsec['runAsUser'], dsec['runAsGroup']))
EOF
  # Field names and types against the Kubernetes API's models (the Python
  # client's, generated from its OpenAPI schema).  Debian 12 packages no
  # schema validator (kubeconform, kubeval) and kubectl needs a cluster.
  if "$py" -c 'import kubernetes' 2>/dev/null; then
    "$py" - "$k8s" <<'EOF' || fail "the manifests against the API models (above)"
import os, re, sys, yaml
import kubernetes.client as kc
k8s = sys.argv[1]

def check(obj, typ, where, errs):
    if typ in ('str', 'object', 'datetime', 'date'):
        return
    if typ == 'int':
        if not isinstance(obj, int) or isinstance(obj, bool):
            errs.append('%s: %r is not an int' % (where, obj))
        return
    if typ == 'bool':
        if not isinstance(obj, bool):
            errs.append('%s: %r is not a bool' % (where, obj))
        return
    m = re.match(r'list\[(.*)\]$', typ)
    if m:
        if not isinstance(obj, list):
            errs.append('%s: not a list' % where)
            return
        for i, x in enumerate(obj):
            check(x, m.group(1), '%s[%d]' % (where, i), errs)
        return
    m = re.match(r'dict\(str, (.*)\)$', typ)
    if m:
        for k, v in obj.items():
            check(v, m.group(1), '%s.%s' % (where, k), errs)
        return
    cls = getattr(kc, typ)
    if not isinstance(obj, dict):
        errs.append('%s: not a %s' % (where, typ))
        return
    names = {v: k for k, v in cls.attribute_map.items()}
    for k, v in obj.items():
        if k not in names:
            errs.append('%s: unknown field %s in %s' % (where, k, typ))
        else:
            check(v, cls.openapi_types[names[k]], '%s.%s' % (where, k), errs)

errs = []
n = 0
for f in sorted(os.listdir(k8s)):
    with open(os.path.join(k8s, f)) as fh:
        for doc in yaml.safe_load_all(fh):
            if doc:
                check(doc, 'V1' + doc['kind'], '%s:%s' % (f, doc['kind']), errs)
                n += 1
# The checker itself: a misspelt field must be found.
bad = []
check({'kind': 'Pod', 'spec': {'containers': [{'name': 'x', 'mountpath': 1}]}},
      'V1Pod', 'self-test', bad)
assert bad, 'the checker misses unknown fields'
print('\n'.join(errs) or 'API models (python3-kubernetes %s): %d objects ok'
      % (__import__('kubernetes').__version__, n))
sys.exit(1 if errs else 0)
EOF
  else
    echo "note: python3-kubernetes not installed: field names not checked against the API"
  fi
fi

# ---- 4. the Dockerfile -----------------------------------------------------
echo "== Dockerfile"
if ! command -v dpkg-query >/dev/null || ! command -v readelf >/dev/null; then
  skip_part "no dpkg-query or readelf: Dockerfile's packages not checked"
elif [ ! -f "$dir/metrics.port" ]; then
  skip_part "Dockerfile not checked (the manifests' part did not run)"
else
  # The packages the binaries need: each NEEDED library of kvshared, kvshare
  # and libkvshare, and each library of the daemon's pkg-config modules
  # (linked --as-needed, so some are not NEEDED until used), to its package.
  libs=$(for f in "$daemon" "$cli" "$build"/libkvshare.so.*.*; do
           readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
         done
         mods=$(sed -n 's/^DAEMON_PKGS *:= *//p' "$root/daemon/module.mk")
         [ -n "$mods" ] || echo "NO-DAEMON_PKGS"
         pkg-config --libs-only-l $mods | tr ' ' '\n' | sed -n 's/^-l\(.*\)/lib\1.so/p')
  grep -q NO-DAEMON_PKGS <<<"$libs" && fail "no DAEMON_PKGS in daemon/module.mk"
  need=$(for l in $(sort -u <<<"$libs"); do
           # libkvshare: the image's own; the C library's parts: libc6;
           # the sanitizers' runtimes: a SAN build's, never in the image.
           case $l in libkvshare.so*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|\
                      libasan.so*|libubsan.so*|liblsan.so*|libtsan.so*)
             continue ;;
           esac
           p=$(ldconfig -p | awk -v l="$l" '$1 == l { print $NF; exit }')
           [ -n "$p" ] || { echo "UNRESOLVED:$l"; continue; }
           p=$(readlink -f "$p")
           # dpkg knows /lib/... or /usr/lib/... (merged /usr): try both.
           { dpkg-query -S "$p" || dpkg-query -S "${p#/usr}"; } 2>/dev/null |
             sed 's/:.*//;q' | grep . || echo "UNPACKAGED:$l"
         done | sort -u)
  grep -q 'UNRESOLVED\|UNPACKAGED' <<<"$need" && fail "libraries without a package: $need"
  read -r port uid gid <"$dir/metrics.port"
  "$py" - "$root" "$dir/inst" "$daemon" "$port" "$uid" "$gid" $need <<'EOF' || fail "the Dockerfile (above)"
import fnmatch, os, re, shlex, subprocess, sys, json
root, inst, daemon, port, uid, gid = sys.argv[1:7]
need = set(sys.argv[7:])
with open(os.path.join(root, 'deploy', 'Dockerfile')) as fh:
    text = re.sub(r'\\\n', ' ', fh.read())
ins = []
for line in text.splitlines():
    line = line.strip()
    if line and not line.startswith('#'):
        op, _, rest = line.partition(' ')
        ins.append((op.upper(), rest.strip()))
stages = [r for op, r in ins if op == 'FROM']
assert len(stages) == 2, stages
assert re.match(r'debian:12(-slim)? AS build$', stages[0]), stages[0]
assert re.match(r'debian:12(-slim)? AS runtime$', stages[1]), stages[1]
cut = [i for i, (op, _) in enumerate(ins) if op == 'FROM'][1]
build, runtime = ins[:cut], ins[cut:]

ignore = []
with open(os.path.join(root, '.dockerignore')) as fh:
    ignore = [l.strip() for l in fh if l.strip() and not l.startswith('#')]

def ignored(path):
    parts = path.split('/')
    for pat in ignore:
        pat = pat.lstrip('/')
        for i in range(1, len(parts) + 1):
            sub = '/'.join(parts[:i])
            if fnmatch.fnmatch(sub, pat) or (pat.startswith('**/') and
                    fnmatch.fnmatch(parts[i - 1], pat[3:])):
                return True
    return False

runs = ' '.join(r for op, r in build if op == 'RUN')
assert 'deploy/install-deps.sh' in runs and 'make' in runs, runs
# Debian's packages only: nothing fetched from anywhere else.
for op, r in ins:
    if op in ('RUN', 'ADD'):
        for w in ('pip', 'curl', 'wget', 'git clone', 'http://', 'https://'):
            assert w not in r, ('%s fetches outside Debian (%s)' % (op, w), r)
m = re.search(r'make install (.*?)(&&|$)', runs)
assert m and 'DESTDIR=/out' in m.group(1) and 'PREFIX=/usr/local' in m.group(1), runs
for op, rest in ins:
    if op != 'COPY':
        continue
    words = shlex.split(rest)
    opts = [w for w in words if w.startswith('--')]
    srcs = [w for w in words if not w.startswith('--')][:-1]
    assert srcs, rest
    for s in srcs:
        if '--from=build' in opts:
            # The build stage's `make install DESTDIR=/out`: the same install
            # into a scratch folder (part 1) has it.
            assert s.startswith('/out/'), s
            assert os.path.exists(os.path.join(inst, s[len('/out/'):])), \
                'COPY --from=build %s: make install makes no such file' % s
        else:
            assert not opts, rest
            assert os.path.exists(os.path.join(root, s)), 'COPY %s: no such file' % s
            if s != '.':
                assert not ignored(s.rstrip('/')), 'COPY %s: in .dockerignore' % s
for must in ('.git', 'build', 'build-san', 'build-sd'):
    assert ignored(must), '.dockerignore lets %s in' % must
for must in ('deploy/install-deps.sh', 'daemon/serve.c', 'Makefile'):
    assert not ignored(must), '.dockerignore keeps out %s' % must

# The runtime packages: exactly the ones the binaries need.
(arg,) = [r for op, r in runtime if op == 'ARG' and r.startswith('RUNTIME_PKGS=')]
pkgs = set(shlex.split(arg.split('=', 1)[1])[0].split())
assert pkgs == need, ('RUNTIME_PKGS', 'missing', sorted(need - pkgs),
                      'not needed', sorted(pkgs - need))
rruns = ' '.join(r for op, r in runtime if op == 'RUN')
assert '$RUNTIME_PKGS' in rruns and '--no-install-recommends' in rruns, rruns
def known(p):
    r = subprocess.run(['apt-cache', 'show', '--no-all-versions', p],
                       capture_output=True, text=True)
    return r.returncode == 0 and 'Package: ' + p in r.stdout
if known('libc6'):
    for p in sorted(pkgs):
        assert known(p), '%s is not a Debian package here' % p
else:
    print('note: no apt lists here: the packages\' names not looked up')

def one(op):
    v = [r for o, r in runtime if o == op]
    assert len(v) == 1, (op, v)
    return v[0]

user = one('USER')
assert user.split(':')[0] not in ('0', 'root'), user
assert user == '%s:%s' % (uid, gid), ('USER', user, 'the DaemonSet runs', uid, gid)
assert '--uid %s' % uid in rruns and '--gid %s' % gid in rruns, rruns
vols = json.loads(one('VOLUME'))
assert one('EXPOSE').split() == [port], (one('EXPOSE'), port)
hc = one('HEALTHCHECK')
assert re.search(r'CMD .*kvshare\b.* stats', hc), hc
entry = json.loads(one('ENTRYPOINT'))
cmd = json.loads(one('CMD'))
assert entry == ['/usr/local/bin/kvshared'], entry
assert os.path.dirname(cmd[cmd.index('--socket') + 1]) in vols, (cmd, vols)
# The image's config is the installed example config.
args = list(cmd)
if '--config' in args:
    args[args.index('--config') + 1] = os.path.join(root, 'deploy', 'kvshared.conf')
r = subprocess.run([daemon, *args, '--print-config'], capture_output=True, text=True)
assert r.returncode == 0, ('kvshared refuses the CMD', r.stderr)
vals = dict(l.split(' = ', 1) for l in r.stdout.splitlines() if ' = ' in l)
assert vals['metrics_listen'].rsplit(':', 1)[1] == port, vals['metrics_listen']
print('Dockerfile: runtime packages %s; user %s; volume %s; port %s'
      % (' '.join(sorted(pkgs)), user, ' '.join(vols), port))
EOF
fi

if [ ${#skipped[@]} -gt 0 ]; then
  echo "SKIP: parts not run: ${skipped[*]}"
  exit 77
fi
echo "test_deploy: ok"
