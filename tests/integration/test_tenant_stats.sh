#!/bin/bash
# test_tenant_stats — the per-tenant numbers of a kvshared with two tenants
# (a: uid 40001, 24 blocks; b: uid 40002, the rest of a 64-block pool),
# each driven by a worker that runs as its tenant's uid (a child of the
# checking script that drops root with setresuid: it reads no file of the
# checkout) through the Python binding, while root watches as an observer.
#
#   - each worker's session names its own tenant (Client.tenant,
#     kvs_tenant), and its stats hold its own line only, equal to its
#     partition's counters (the session's aggregates);
#   - a holds 5 blocks of a request, probes b's prompt (no hit: the
#     partitions share nothing) and is refused an allocation larger than
#     what is left of its share (no_space); b fills a prompt and looks it up again (16 hit
#     tokens of 33 looked up, 4 cached blocks): root's `kvshare stats
#     --json` (an observer: tenant "") has both lines with exactly those
#     numbers, and its pool-wide figures add the lines up; its text output
#     has the tenants' table; a Python observer (no_map=True) sees the same
#     lines, is refused a Lookup (EPERM), and root without no_map is
#     refused at connect;
#   - the CLI run as a tenant's uid (a copy of it and of libkvshare in the
#     test's folder) sees its own tenant and line only, in stats and top;
#   - /metrics has the per-tenant series with the same numbers and passes
#     promtool; `kvshare top --json` and `top -b` as root show both tenants;
#   - b then holds its whole share: its 4 cached blocks are evicted (its
#     line's evictions, and /metrics'), a's line does not move;
#   - once the workers are gone nothing is left in use, the invariant
#     check passes in every partition, and SIGTERM stops the daemon (0).
#
# Skips (77) while kvshared has no --tenant option, without root (the
# workers' uids) or setpriv, or without promtool.
set -u
build=${KVS_BUILD:-build}
build=$(cd "$build" && pwd) || { echo "FAIL: no build folder"; exit 1; }
root=$(cd "$(dirname "$0")/../.." && pwd)
daemon=$build/kvshared
cli=$build/kvshare
py=/usr/bin/python3
[ -x "$py" ] || py=python3
dir=
pid=
fail() {
  echo "FAIL: $*" >&2
  [ -n "$dir" ] && [ -f "$dir/log" ] && sed 's/^/  log| /' "$dir/log" >&2
  exit 1
}

[ -x "$daemon" ] || { echo "SKIP: $daemon not built"; exit 77; }
[ -x "$cli" ] || fail "$cli not built"
"$daemon" --help 2>&1 | grep -q -- '--tenant' ||
  { echo "SKIP: this kvshared has no --tenant option yet"; exit 77; }
[ "$(id -u)" = 0 ] ||
  { echo "SKIP: needs root (the tenants' workers run as uids 40001 and 40002)"; exit 77; }
command -v setpriv >/dev/null || { echo "SKIP: no setpriv (util-linux)"; exit 77; }
command -v promtool >/dev/null ||
  { echo "SKIP: no promtool (deploy/install-deps.sh installs it)"; exit 77; }
"$py" -c 'import numpy' 2>/dev/null || { echo "SKIP: $py lacks numpy"; exit 77; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-tenant-XXXXXX")
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
# The tenants' processes reach the socket: the folder is searchable, the
# socket writable by all (the daemon still admits only the tenants' uids,
# by SO_PEERCRED).  The CLI they run is a copy beside its library.
chmod 755 "$dir"
mkdir "$dir/bin"
cp "$cli" "$build/libkvshare.so.0" "$dir/bin/"
chmod -R a+rX "$dir/bin"
sock=$dir/kvshared.sock

. "$(dirname "$0")/../lib/daemon.sh"
kvs_start_daemon "$daemon" "$dir" "$sock" "$dir/log" --num-layers 1 \
  --head-dim 8 --block-size 4 --pool-blocks 64 --backend host \
  --metrics-listen 127.0.0.1:0 \
  --tenant "a uids=40001 blocks=24" --tenant "b uids=40002" ||
  fail "kvshared with two tenants did not become ready"
chmod 666 "$sock" || fail "chmod $sock"
port=$(sed -n 's|.*metrics: http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$dir/log" | head -n1)
[ -n "$port" ] || fail "no metrics port in the log"

# Under the sanitizer build python loads an ASan+UBSan libkvshare: the
# runtimes are preloaded into python (leak detection off for it); the CLI
# it runs gets the environment it would have had without them.
pyenv=()
if readelf -d "$build/libkvshare.so.0" 2>/dev/null | grep -q 'NEEDED.*libasan'; then
  cc=${CC:-cc}
  asan=$("$cc" -print-file-name=libasan.so)
  ubsan=$("$cc" -print-file-name=libubsan.so)
  if [ ! -e "$asan" ] || [ ! -e "$ubsan" ]; then
    echo "SKIP: sanitizer build, but no ASan/UBSan runtime to preload into python"
    exit 77
  fi
  pyenv=(env "KVS_CHILD_LD_PRELOAD=${LD_PRELOAD-}" "KVS_CHILD_ASAN_OPTIONS=${ASAN_OPTIONS-}"
         "LD_PRELOAD=$asan $ubsan${LD_PRELOAD:+ $LD_PRELOAD}"
         "ASAN_OPTIONS=detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}")
fi

PYTHONDONTWRITEBYTECODE=1 KVS_LIBRARY=$build/libkvshare.so.0 "${pyenv[@]}" \
  "$py" - "$root" "$dir" "$sock" "$port" <<'EOF' || fail "the tenants' numbers"
import json
import os
import re
import subprocess
import sys
import time
import traceback
import urllib.request

root, dir, sock, port = sys.argv[1:5]
sys.path.insert(0, os.path.join(root, "client", "python"))
import kvshare  # noqa: E402

kvshare._lib.lib()  # loaded now: the workers, once not root, open nothing
UIDS = {"a": 40001, "b": 40002}
SHARES = {"a": 24, "b": 40}
BS = 4
FIELDS = ("num_blocks", "free_blocks", "cached_blocks", "used_blocks",
          "num_requests", "sessions", "lookups", "query_tokens",
          "hit_tokens", "evictions", "no_space", "pool_bytes")


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def child_env():
    env = dict(os.environ)
    for var in ("LD_PRELOAD", "ASAN_OPTIONS"):
        saved = env.pop("KVS_CHILD_" + var, None)
        if saved is None:
            continue
        if saved:
            env[var] = saved
        else:
            env.pop(var, None)
    return env


def cli(*args, uid=None):
    """The CLI (root's, or the copy run as uid), its JSON or text."""
    cmd = [os.path.join(dir, "bin", "kvshare"), "--socket", sock] + list(args)
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}",
               "--clear-groups"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(),
                       timeout=60)
    check(p.returncode == 0, f"{cmd}: exit {p.returncode}: {p.stderr}")
    if "--json" in args and "top" not in args:
        return json.loads(p.stdout)
    return p.stdout


# ---- the workers: one per tenant, each a child that runs as its uid -------
def serve(r, w):
    c = kvshare.Client(sock, name="tenant-worker")

    def hold(req, toks):
        hit = c.lookup(req, toks)
        a = c.allocate(req, len(toks) - hit.hit_tokens)
        return len(hit.blocks) + len(a.blocks)

    def fill(req, toks):
        hit = c.lookup(req, toks)
        c.allocate(req, len(toks) - hit.hit_tokens)
        sealed = c.commit(req, hit.hit_tokens, n=len(toks) - hit.hit_tokens)
        c.free(req)
        return [hit.hit_tokens, sealed]

    def probe(req, toks):
        hit = c.lookup(req, toks).hit_tokens
        c.free(req)
        return hit

    cmds = {
        "hello": lambda: {"tenant": c.tenant, "num_blocks": c.layout.num_blocks,
                          "mapped": c.mapped, "pool_size": c.pool_size},
        "hold": hold, "fill": fill, "probe": probe,
        "free": c.free,
        "stats": lambda: c.stats(check=True).as_dict(),
        "view": lambda b: list(c.block_tensor(b).shape),
        "pool_view": lambda: list(c.pool_tensor().shape)[:1],
    }
    for line in r:
        cmd, *args = json.loads(line)
        if cmd == "quit":
            c.close()
            return
        try:
            out = {"ok": cmds[cmd](*args)}
        except kvshare.KvsError as e:
            out = {"status": e.name, "message": str(e)}
        w.write(json.dumps(out) + "\n")
        w.flush()


class Worker:
    def __init__(self, tenant):
        self.tenant, uid = tenant, UIDS[tenant]
        pr, cw = os.pipe()
        cr, pw = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                os.close(pr)
                os.close(pw)
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                serve(os.fdopen(cr), os.fdopen(cw, "w"))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        os.close(cr)
        os.close(cw)
        self.r, self.w = os.fdopen(pr), os.fdopen(pw, "w")

    def call(self, *cmd, status=None):
        self.w.write(json.dumps(cmd) + "\n")
        self.w.flush()
        line = self.r.readline()
        check(line, f"worker {self.tenant} died at {cmd}")
        out = json.loads(line)
        if status is not None:
            check(out.get("status") == status, f"{self.tenant} {cmd}: {out}, wanted {status}")
            return out
        check("ok" in out, f"{self.tenant} {cmd}: {out}")
        return out["ok"]

    def quit(self):
        self.w.write(json.dumps(["quit"]) + "\n")
        self.w.close()
        _, st = os.waitpid(self.pid, 0)
        check(os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0,
              f"worker {self.tenant} ended with {st}")


workers = {t: Worker(t) for t in ("a", "b")}
for t, w in workers.items():
    h = w.call("hello")
    check(h["tenant"] == t, f"worker of uid {UIDS[t]}: tenant {h}")
    check(h["num_blocks"] == SHARES[t] and h["mapped"], f"{t}: Welcome {h}")
    # The Python views reach the partition's blocks only: the whole pool
    # view is the partition, a block id past it is refused.
    check(w.call("pool_view") == [SHARES[t]], f"{t}: pool view")
    w.call("view", SHARES[t] - 1)
    w.call("view", SHARES[t], status="ERANGE")
    w.call("view", SHARES["a"] + SHARES["b"], status="ERANGE")

# a: a request holding 5 blocks; b's prompt probed (another partition: no
# hit); an allocation larger than its share refused.  b: a prompt filled
# (4 sealed blocks, cached once freed), then looked up again.
prompt_a = list(range(1000, 1020))
prompt_b = list(range(2000, 2016))
check(workers["a"].call("hold", 1, prompt_a) == 5, "a holds 5 blocks")
check(workers["b"].call("fill", 1, prompt_b) == [0, 4], "b fills 4 blocks")
check(workers["a"].call("probe", 2, prompt_b + [7]) == 0, "a hits b's prompt")
check(workers["b"].call("probe", 2, prompt_b + [7]) == 16, "b misses its prompt")
# (80 tokens: 20 blocks, within the share of 24 but more than its 19 free)
workers["a"].call("hold", 3, list(range(3000, 3080)), status="ENOSPC")
workers["a"].call("free", 3)
want = {
    "a": dict(num_blocks=24, free_blocks=19, cached_blocks=0, used_blocks=5,
              num_requests=1, sessions=1, lookups=3,
              query_tokens=20 + 17 + 80, hit_tokens=0, evictions=0,
              no_space=1),
    "b": dict(num_blocks=40, free_blocks=36, cached_blocks=4, used_blocks=0,
              num_requests=0, sessions=1, lookups=2, query_tokens=16 + 17,
              hit_tokens=16, evictions=0, no_space=0),
}


def same(line, t, what):
    for k, v in want[t].items():
        check(line[k] == v, f"{what}: tenant {t} {k} {line[k]}, wanted {v}: {line}")


# ---- each worker sees its own tenant and line only ------------------------
for t, w in workers.items():
    st = w.call("stats")
    check(st["tenant"] == t, f"{t}: stats tenant {st['tenant']!r}")
    check([x["name"] for x in st["tenants"]] == [t], f"{t} sees {st['tenants']}")
    same(st["tenants"][0], t, f"worker {t}'s own line")
    for k in ("num_blocks", "free_blocks", "cached_blocks", "used_blocks",
              "num_requests", "lookups", "query_tokens", "hit_tokens",
              "no_space", "pool_bytes"):
        check(st[k] == st["tenants"][0][k], f"{t}: its stats' {k} is not its line's")
    check(st["check"] == 0, f"{t}: invariant check {st['check_message']}")

# ---- root, an observer: both lines, the pool-wide figures add them up -----
obs = cli("stats", "--json", "--check")
print("kvshare stats --json (root):", json.dumps(obs["tenants"]))
check(obs["tenant"] == "", f"root's tenant {obs['tenant']!r}")
check([x["name"] for x in obs["tenants"]] == ["a", "b"], obs["tenants"])
lines = {x["name"]: x for x in obs["tenants"]}
for t in ("a", "b"):
    same(lines[t], t, "root's kvshare stats --json")
for k in ("num_blocks", "free_blocks", "cached_blocks", "used_blocks",
          "num_requests", "lookups", "query_tokens", "hit_tokens",
          "evictions", "no_space", "pool_bytes"):
    check(obs[k] == sum(x[k] for x in obs["tenants"]), f"pool-wide {k} {obs[k]}")
check(obs["num_blocks"] == 64 and obs["check"] == 0, obs)
bytes_per_block = lines["a"]["pool_bytes"] // 24
check(all(lines[t]["pool_bytes"] == SHARES[t] * bytes_per_block for t in lines),
      "pool_bytes is not the share's")

text = cli("stats")
print(text)
rows = text[text.index("tenants:\n"):].splitlines()
check(rows[1].split() == ["name", "blocks", "used", "cached", "free", "hit",
                          "evictions", "sessions"], rows[1])
check(rows[2].split() == ["a", "24", "5", "0", "19", "0.0%", "0", "1"], rows[2])
check(rows[3].split() == ["b", "40", "0", "4", "36", "48.5%", "0", "1"], rows[3])
check(not re.search(r"^tenant ", text, re.M), "root has a tenant line")

# A Python observer: the same lines; it may not look up, nor map the pool.
with kvshare.Client(sock, name="observer", no_map=True) as o:
    check(o.tenant == "" and not o.mapped, "observer's Welcome")
    st = o.stats()
    check(st.tenant == "" and [x.name for x in st.tenants] == ["a", "b"], st.tenants)
    for x in st.tenants:
        same(x.__dict__, x.name, "the Python observer's stats")
    check(abs(st.tenants[1].hit_rate - 16 / 33) < 1e-9, "hit_rate")
    try:
        o.lookup(1, [1, 2, 3])
        fail("an observer's lookup was run")
    except kvshare.KvsError as e:
        check(e.status == kvshare.EPERM, f"observer's lookup: {e}")
try:
    kvshare.Client(sock, name="observer-map")
    fail("root connected with a mapping")
except kvshare.ConnectError as e:
    check(e.status == kvshare.EPERM and "no tenant" in e.message, f"root maps: {e}")

# ---- the CLI run by a tenant's user: its tenant only ----------------------
own = cli("stats", "--json", uid=UIDS["a"])
check(own["tenant"] == "a" and [x["name"] for x in own["tenants"]] == ["a"], own)
want["a"]["sessions"] = 2  # the worker and this CLI
same(own["tenants"][0], "a", "tenant a's kvshare stats --json")
want["a"]["sessions"] = 1
text = cli("stats", uid=UIDS["a"])
check(re.search(r"^tenant +a$", text, re.M), text)
frame = json.loads(cli("top", "--json", "--count", "1", uid=UIDS["b"]))
check(frame["tenant"] == "b" and [x["name"] for x in frame["tenants"]] == ["b"], frame)

# ---- /metrics: the same numbers, promtool's approval ----------------------
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                              timeout=10).read().decode()
p = subprocess.run(["promtool", "check", "metrics"], input=body,
                   capture_output=True, text=True)
check(p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(),
      f"promtool check metrics: {p.returncode} {p.stdout} {p.stderr}")


def metric(name, t, extra=""):
    m = re.findall(r'^%s\{tenant="%s"%s\} (\d+)$' % (re.escape(name), t,
                                                     re.escape(extra)), body, re.M)
    check(len(m) == 1, f"/metrics: {name}{{tenant={t}{extra}}}: {m}")
    return int(m[0])


for fam, kind in (("kvshare_tenant_blocks", "gauge"),
                  ("kvshare_tenant_capacity_blocks", "gauge"),
                  ("kvshare_tenant_sessions", "gauge"),
                  ("kvshare_tenant_lookups_total", "counter"),
                  ("kvshare_tenant_hit_tokens_total", "counter")):
    check(f"# TYPE {fam} {kind}\n" in body, f"/metrics: no {kind} {fam}")
for t in ("a", "b"):
    w_ = dict(want[t], pool_bytes=lines[t]["pool_bytes"])
    for state in ("free", "cached", "used"):
        check(metric("kvshare_tenant_blocks", t, f',state="{state}"') == w_[state + "_blocks"],
              f"/metrics: {t} {state} blocks")
    for fam, k in (("kvshare_tenant_capacity_blocks", "num_blocks"),
                   ("kvshare_tenant_pool_bytes", "pool_bytes"),
                   ("kvshare_tenant_requests", "num_requests"),
                   ("kvshare_tenant_sessions", "sessions"),
                   ("kvshare_tenant_lookups_total", "lookups"),
                   ("kvshare_tenant_query_tokens_total", "query_tokens"),
                   ("kvshare_tenant_hit_tokens_total", "hit_tokens"),
                   ("kvshare_tenant_evictions_total", "evictions"),
                   ("kvshare_tenant_no_space_total", "no_space")):
        check(metric(fam, t) == w_[k], f"/metrics: {fam} of {t}: {metric(fam, t)}, wanted {w_[k]}")
used = int(re.search(r'^kvshare_pool_blocks\{state="used"\} (\d+)$', body, re.M).group(1))
check(used == 5, f"/metrics: pool-wide used blocks {used}")
print("/metrics: per-tenant series checked, promtool passes")

# ---- kvshare top as root: both tenants ------------------------------------
frames = [json.loads(l) for l in
          cli("top", "--json", "--count", "2", "--interval", "0.2").splitlines()]
check(len(frames) == 2, frames)
f = frames[1]
check(f["tenant"] == "" and [x["name"] for x in f["tenants"]] == ["a", "b"], f)
check(f["own_frames"] == 3, f"own_frames {f['own_frames']}: Stats, tier, tenant stats")
for x in f["tenants"]:
    same(x, x["name"], "top --json")
    check(x["rates"]["lookups"] == 0 and x["hit_rate"] is None, x)
check(abs(f["tenants"][1]["hit_rate_total"] - 16 / 33) < 1e-6, f["tenants"][1])
env = dict(child_env(), COLUMNS="200")
text = subprocess.run([os.path.join(dir, "bin", "kvshare"), "--socket", sock, "top",
                       "-b", "--count", "1"], capture_output=True, text=True,
                      env=env, timeout=60).stdout
print(text)
check(re.search(r"^tenant +a  blocks 24  free 19  cached 0  used 5  hit 0\.0%  "
                r"lookups/s -  evictions/s -  sessions 1$", text, re.M), text)
check(re.search(r"^tenant +b  blocks 40  free 36  cached 4  used 0  hit 48\.5%  "
                r"lookups/s -  evictions/s -  sessions 1$", text, re.M), text)

# ---- b takes its whole share: its cached blocks are evicted, a's untouched
check(workers["b"].call("hold", 9, list(range(4000, 4000 + 40 * BS))) == 40,
      "b holds its whole share")
want["b"].update(free_blocks=0, cached_blocks=0, used_blocks=40,
                 num_requests=1, lookups=3, query_tokens=33 + 160,
                 evictions=4)
lines = {x["name"]: x for x in cli("stats", "--json")["tenants"]}
for t in ("a", "b"):
    same(lines[t], t, "after b took its share")
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                              timeout=10).read().decode()
check(metric("kvshare_tenant_evictions_total", "b") == 4 and
      metric("kvshare_tenant_evictions_total", "a") == 0, "/metrics: evictions")
workers["b"].call("free", 9)

# ---- the workers leave: nothing in use, every partition checked -----------
for w in workers.values():
    w.quit()
for _ in range(100):  # sessions close asynchronously in the daemon
    end = cli("stats", "--json", "--check")
    if all(x["sessions"] == 0 for x in end["tenants"]):
        break
    time.sleep(0.05)
check(all(x["sessions"] == 0 and x["used_blocks"] == 0 and x["num_requests"] == 0
          for x in end["tenants"]), end["tenants"])
check(end["check"] == 0 and end["used_blocks"] == 0, end)
print("test_tenant_stats: numbers checked")
EOF

kill -TERM "$pid"
wait "$pid"; rc=$?
pid=
[ $rc = 0 ] || fail "kvshared exited $rc after SIGTERM"
echo "test_tenant_stats: ok"
