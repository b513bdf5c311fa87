#!/bin/bash
# test_top — `kvshare top` against a real kvshared.
#
# Usage errors (exit 2), no daemon (exit 3).  On a daemon with a host tier,
# `top --json` runs while two demo workers (tests/demo/worker) run a chat
# workload, then while `kvshare ping` runs: every frame's pool states sum to
# num_blocks, its deltas are the differences of its totals, its rates are
# delta / elapsed, its hit rates are hit / query tokens; against independent
# references: the totals equal `kvshare stats --json` before and after, the
# workers' own counts of lookups, prompt and hit tokens, and the exact
# frames of the pings (top's own frames left out).  Batch text frames
# (-b, and by default into a pipe) parse.  The daemon killed under top:
# exit 1 and a message.  The interactive view on a pseudo-terminal: it
# enters the alternate screen, fits a resized window, and on 'q', ^C and
# the daemon's death leaves the alternate screen and restores the
# terminal's modes.
set -u
build=${KVS_BUILD:-build}
cli=$build/kvshare
daemon=$build/kvshared
worker=$build/tests/demo/worker
py=/usr/bin/python3
[ -x "$py" ] || py=python3
fail() {
  echo "FAIL: $*" >&2
  for f in "$dir"/log "$dir"/*.err; do
    [ -s "$f" ] && sed "s/^/  $(basename "$f")| /" "$f" >&2
  done
  exit 1
}

[ -x "$cli" ] || fail "$cli not built"
[ -x "$daemon" ] || { echo "SKIP: $daemon not built"; exit 77; }
[ -x "$worker" ] || { echo "SKIP: $worker not built"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-top-XXXXXX")
pid=
tpid=
wpids=()
cleanup() {
  for p in $tpid "${wpids[@]}" $pid; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
sock=$dir/kvshared.sock
. "$(dirname "$0")/../lib/daemon.sh"

# Lines in FILE, once it has at least N (top $tpid still running meanwhile).
wait_lines() {
  local file=$1 n=$2 have
  for _ in $(seq 600); do
    have=$(wc -l <"$file")
    [ "$have" -ge "$n" ] && { echo "$have"; return 0; }
    kill -0 "$tpid" 2>/dev/null || { echo "top exited early" >&2; return 1; }
    sleep 0.1
  done
  echo "top did not print $n lines" >&2
  return 1
}

# ---- usage and connection errors ----------------------------------------
for args in "--interval 0" "--interval -1" "--interval abc" "--interval 1e9" \
            "--interval nan" "--count 0" "--count x" "--count" "--bogus" \
            "--check" "extra" "--interval"; do
  # shellcheck disable=SC2086
  "$cli" --socket "$dir/nope.sock" top $args >/dev/null 2>"$dir/usage.out"
  rc=$?
  [ $rc = 2 ] || fail "top $args: exit $rc, wanted 2"
  grep -q "usage: kvshare" "$dir/usage.out" || fail "top $args: no usage"
done
rm -f "$dir/usage.out"
"$cli" top --help | grep -q "top \[--interval S\]" || fail "top --help"
"$cli" --socket "$dir/nope.sock" top --count 1 >/dev/null 2>&1; rc=$?
[ $rc = 3 ] || fail "top with no daemon: exit $rc, wanted 3"

# ---- JSON frames under a known load, on a daemon with a host tier --------
kvs_start_daemon "$daemon" "$dir" "$sock" "$dir/log" --num-layers 2 \
  --head-dim 16 --pool-blocks 128 --host-tier-bytes 1M || {
  grep -q "not built yet" "$dir/log" && { echo "SKIP: this kvshared cannot serve yet"; exit 77; }
  fail "kvshared did not become ready"
}
"$cli" --socket "$sock" stats --json >"$dir/before.json" || fail "stats before"

"$cli" --socket "$sock" top --json --interval 0.2 --count 1000000 \
  >"$dir/top.json" 2>"$dir/top.err" &
tpid=$!
wait_lines "$dir/top.json" 1 >/dev/null || fail "top --json"
for w in 0 1; do
  "$worker" --socket "$sock" --id $w --users 2 --turns 3 --sys 40 --reply 4 \
    >"$dir/worker$w.out" 2>"$dir/worker$w.err" &
  wpids+=($!)
done
for p in "${wpids[@]}"; do wait "$p" || fail "a demo worker failed"; done
wpids=()
n=$(wait_lines "$dir/top.json" 1) || fail "top --json"
# Frame n+2's sample is taken after frame n+1 was printed, so after the
# workers ended: frame n+3 covers an idle interval.
idle=$((n + 3))
mark=$(wait_lines "$dir/top.json" "$idle") || fail "top --json"
"$cli" --socket "$sock" ping --count 40 >/dev/null || fail "ping"
n=$(wait_lines "$dir/top.json" 1) || fail "top --json"
wait_lines "$dir/top.json" $((n + 3)) >/dev/null || fail "top --json"
kill -TERM "$tpid"
wait "$tpid"; rc=$?
tpid=
[ $rc = 143 ] || fail "top --json after SIGTERM: exit $rc, wanted 143 (the signal)"
[ -s "$dir/top.err" ] && fail "top --json wrote to stderr"
"$cli" --socket "$sock" stats --json >"$dir/after.json" || fail "stats after"
cat "$dir"/worker*.out
head -c 600 "$dir/top.json"; echo " ..."

"$py" - "$dir" "$idle" "$mark" <<'EOF' || fail "top --json frames"
import json, sys
d, idle, mark = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
before = json.load(open(d + "/before.json"))
after = json.load(open(d + "/after.json"))
frames = [json.loads(l) for l in open(d + "/top.json")]
workers = []
for w in (0, 1):
    line = [l for l in open("%s/worker%d.out" % (d, w)) if l.startswith("RESULT")][0]
    workers.append(dict(kv.split("=") for kv in line.split()[1:]))

def close(a, b, tol):
    return abs(a - b) <= tol

assert [f["frame"] for f in frames] == list(range(1, len(frames) + 1)), "frame numbers"
assert len(frames) >= mark + 3, (len(frames), mark)
for i, f in enumerate(frames):
    assert f["num_blocks"] == 128, f
    assert f["free_blocks"] + f["cached_blocks"] + f["used_blocks"] == 128, f
    t = f["totals"]
    assert f["hit_rate_total"] is not None or t["query_tokens"] == 0, f
    if t["query_tokens"]:
        assert 0 <= f["hit_rate_total"] <= 1, f
        assert close(f["hit_rate_total"], t["hit_tokens"] / t["query_tokens"], 1e-6), f
    assert [x["name"] for x in f["tiers"]] == ["host"], f
    tier = f["tiers"][0]
    assert tier["used"] <= tier["slots"] == before["tiers"][0]["slots"], f
    assert f["swap"]["swapped_requests"] == 0, f
    if i == 0:
        assert f["elapsed"] is None and f["delta"] is None and f["hit_rate"] is None, f
        assert all(v is None for v in f["rates"].values()), f
        continue
    p = frames[i - 1]
    el = f["elapsed"]
    assert el > 0 and close(el, f["time"] - p["time"], 0.1), (el, f["time"], p["time"])
    assert f["own_frames"] == 3, f  # Stats, tier stats, swap stats
    assert set(f["delta"]) == set(t) == set(f["rates"]), f
    for k, v in t.items():
        dk = v - p["totals"][k]
        assert f["delta"][k] == dk >= 0, (k, f, p)
        if k == "frames_in":
            dk -= f["own_frames"]
        assert close(f["rates"][k], dk / el, 0.0006 + 1e-4 * dk / el), (k, dk, el, f)
    dq, dh = f["delta"]["query_tokens"], f["delta"]["hit_tokens"]
    if dq:
        assert 0 <= f["hit_rate"] <= 1 and close(f["hit_rate"], dh / dq, 1e-6), f
    else:
        assert f["hit_rate"] is None, f
    for k, r in tier["rates"].items():
        dk = tier[k] - p["tiers"][0][k]
        assert dk >= 0 and close(r, dk / el, 0.0006 + 1e-4 * dk / el), (k, tier, p)
    for k, r in f["swap"]["rates"].items():
        assert r == 0, f

# The references: stats before and after, the workers' own counts.
first, last = frames[0]["totals"], frames[-1]["totals"]
ref = {"lookups": "requests", "query_tokens": "prompt_tokens", "hit_tokens": "hit_tokens"}
for k in first:
    if k != "frames_in":
        assert first[k] == before[k] and last[k] == after[k], (k, before, first, last, after)
for k, wk in ref.items():
    load = sum(int(w[wk]) for w in workers)
    assert load > 0 and last[k] - first[k] == load, (k, load, first, last)
    assert sum(f["delta"][k] for f in frames[1:]) == load, k
assert int(workers[1]["hit_tokens"]) > 0, "no hit: the workers share a system prompt"
assert any(f["rates"]["lookups"] > 0 for f in frames[1:]), "no lookup rate seen"
assert any(f["hit_rate"] for f in frames[1:]), "no interval hit rate seen"
assert any(f["rates"]["allocated_blocks"] > 0 for f in frames[1:]), "no allocation rate"
# An idle interval: top's own frames only.
f = frames[idle - 1]
assert f["delta"]["frames_in"] == f["own_frames"] and f["rates"]["frames_in"] == 0, f
assert f["rates"]["lookups"] == 0 and f["hit_rate"] is None, f
# The pings: a Hello and 40 Pings, top's own frames left out.
pings = sum(f["delta"]["frames_in"] - f["own_frames"] for f in frames[mark:])
assert pings == 41, pings
assert close(sum(f["rates"]["frames_in"] * f["elapsed"] for f in frames[mark:]), 41, 0.05), "ping rate"
print("top --json: %d frames checked, %d lookups, %d/%d tokens hit" %
      (len(frames), last["lookups"] - first["lookups"],
       last["hit_tokens"] - first["hit_tokens"], last["query_tokens"] - first["query_tokens"]))
EOF

# ---- batch text frames (-b, and the default into a file) ----------------
# (Wide enough that no line wraps; the widths are checked below.)
COLUMNS=200 "$cli" --socket "$sock" top -b --count 3 --interval 0.2 >"$dir/top.txt" ||
  fail "top -b exit $?"
COLUMNS=200 "$cli" --socket "$sock" top --interval=0.2 --count=2 >"$dir/top2.txt" ||
  fail "top into a file exit $?"
cat "$dir/top.txt"
"$py" - "$dir" <<'EOF' || fail "top -b text frames"
import json, re, sys
d = sys.argv[1]
after = json.load(open(d + "/after.json"))
for name, count in (("top.txt", 3), ("top2.txt", 2)):
    text = open("%s/%s" % (d, name)).read()
    assert "\x1b" not in text, "escape sequences in batch output"
    blocks = text.rstrip("\n").split("\n\n")
    assert len(blocks) == count, (name, len(blocks))
    for i, b in enumerate(blocks):
        lines = b.split("\n")
        assert re.match(r"kvshare top  \d\d:\d\d:\d\d  frame %d  every 0.2s  model \S+  socket \S+$" % (i + 1),
                        lines[0]), lines[0]
        rows = {l.split()[0]: l for l in lines[1:] if not l.startswith(" ")}
        m = re.match(r"pool +blocks (\d+)  free (\d+)  cached (\d+)  used (\d+)  \(host, ", rows["pool"])
        n, fr, ca, us = map(int, m.groups())
        assert n == 128 and fr + ca + us == n, rows["pool"]
        # Nothing ran since the stats: the same states and totals.
        assert (fr, ca, us) == (after["free_blocks"], after["cached_blocks"], after["used_blocks"])
        bar = [l for l in lines if l.startswith("          [")][0]
        cells = bar.split("[")[1].split("]")[0]
        assert set(cells) <= set("#+.") and cells.count("#") == round(us * len(cells) / n), bar
        m = re.match(r"hit +interval (\S+)  total (\S+)%  \(tokens hit (\d+) of (\d+) this interval\)$",
                     rows["hit"])
        assert m, rows["hit"]
        assert abs(float(m.group(2)) / 100 - after["hit_tokens"] / after["query_tokens"]) < 0.001
        rate = re.match(r"rate/s +lookups (\S+)  frames (\S+)  allocs (\S+)  evictions (\S+)  sealed (\S+)$",
                        rows["rate/s"])
        assert rate, rows["rate/s"]
        want = "-" if i == 0 else "0.0"
        assert all(v == want for v in rate.groups()), rows["rate/s"]
        assert re.match(r"load +sessions 1  requests 0  queued 0 B  indexed \d+$", rows["load"]), rows["load"]
        assert re.match(r"errors +protocol \d+  no_space \d+  copy \d+$", rows["errors"])
        assert re.match(r"tier host used \d+/\d+ \(\S+%\)  demotions/s \S+  promotions/s \S+  "
                        r"drops/s \S+  failures 0  io_errors 0$", rows["tier"]), rows["tier"]
        assert re.match(r"swap +swapped 0  held_slots 0  outs/s \S+  ins/s \S+  failures 0  "
                        r"tier_lost \d+$", rows["swap"]), rows["swap"]
print("top -b: frames parse")
EOF

# ---- the width: $COLUMNS (80 by default) when not a terminal ------------
# No line is wider; a wrapped line goes on indented, so that joining the
# continuation lines gives back the wide frame, word for word.
for w in 60 80 132 default; do
  if [ $w = default ]; then
    env -u COLUMNS "$cli" --socket "$sock" top -b --count 2 --interval 0.2 >"$dir/top-w.txt"
    w=80
  else
    COLUMNS=$w "$cli" --socket "$sock" top -b --count 2 --interval 0.2 >"$dir/top-w.txt"
  fi || fail "top at width $w exit $?"
  "$py" - "$dir" $w <<'EOF' || fail "top at width $w"
import re, sys
d, w = sys.argv[1], int(sys.argv[2])
text = open(d + "/top-w.txt").read()
wide = open(d + "/top.txt").read().rstrip("\n").split("\n\n")[1].split("\n")
for line in text.splitlines():
    assert len(line) <= w, "%d columns at width %d: %r" % (len(line), w, line)
frame = text.rstrip("\n").split("\n\n")[1].split("\n")
joined = []
for line in frame:
    if line.startswith("  ") and not line.startswith("          ["):
        joined[-1] += "  " + line.strip()
    else:
        joined.append(line)
def words(lines):  # the numbers change from frame to frame: the names stay
    return [re.sub(r"[\d.]+", "N", x) for l in lines for x in l.split()
            if not x.startswith("[")]  # (the bar is as wide as the screen)
assert words(joined) == words(wide), (joined, wide)
assert any(l.startswith("          [") and l.endswith("# used, + cached, . free")
           for l in frame), frame  # the legend, whole, beside the bar
socket = [x for l in frame for x in l.split() if x.endswith("kvshared.sock")]
assert socket == [d + "/kvshared.sock"], socket  # the socket's path, whole
print("width %d: %d lines, none wider" % (w, len(frame)))
EOF
done

# ---- the daemon killed under top: exit 1 and a message ------------------
"$cli" --socket "$sock" top -b --interval 0.2 >"$dir/top3.txt" 2>"$dir/top3.err" &
tpid=$!
for _ in $(seq 600); do
  [ "$(grep -c '^kvshare top' "$dir/top3.txt")" -ge 2 ] && break
  kill -0 "$tpid" 2>/dev/null || break
  sleep 0.1
done
kill -9 "$pid"
wait "$pid" 2>/dev/null
pid=
echo "(kvshared killed with SIGKILL)"
for _ in $(seq 300); do kill -0 "$tpid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$tpid" 2>/dev/null && fail "top still runs 30 s after the daemon died"
wait "$tpid"; rc=$?
tpid=
cat "$dir/top3.err"
[ $rc = 1 ] || fail "top after the daemon died: exit $rc, wanted 1"
grep -q "^kvshare: top: lost the daemon at $sock: " "$dir/top3.err" ||
  fail "top after the daemon died: no message"
rm -f "$dir/top3.err"

# ---- no tiers; the interactive view on a pseudo-terminal ----------------
kvs_start_daemon "$daemon" "$dir" "$sock" "$dir/log" --num-layers 2 \
  --head-dim 16 --pool-blocks 64 || fail "kvshared (no tiers) did not become ready"
out=$("$cli" --socket "$sock" top --json --count 2 --interval 0.2) || fail "top --json (no tiers)"
"$py" - "$out" <<'EOF' || fail "top --json without tiers: $out"
import json, sys
f = [json.loads(l) for l in sys.argv[1].splitlines()]
assert len(f) == 2 and f[1]["frame"] == 2, f
assert f[1]["tiers"] == [] and f[1]["swap"] is None and f[1]["tier_lost"] == 0, f
assert f[1]["own_frames"] == 2 and f[1]["rates"]["frames_in"] == 0, f  # Stats, tier stats
assert f[1]["num_blocks"] == 64 and f[1]["sessions"] == 1, f
EOF

# A hang-up its caller ignores (nohup) does not stop it; SIGTERM does, and
# so it does while its output is stalled (a reader that never reads).
( trap '' HUP; exec "$cli" --socket "$sock" top -b --interval 0.1 >/dev/null ) &
tpid=$!
sleep 0.5
kill -HUP "$tpid"
sleep 0.3
kill -0 "$tpid" 2>/dev/null || fail "top died of an ignored SIGHUP"
kill -TERM "$tpid"; wait "$tpid"; rc=$?
tpid=
[ $rc = 143 ] || fail "top after SIGTERM: exit $rc, wanted 143"
mkfifo "$dir/stall"
exec 7<>"$dir/stall"   # a reader that never reads
"$cli" --socket "$sock" top -b --interval 0.01 >"$dir/stall" &
tpid=$!
sleep 1.5              # the pipe (64 KiB) fills; top blocks in write
kill -TERM "$tpid"
for _ in $(seq 50); do kill -0 "$tpid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$tpid" 2>/dev/null && { kill -9 "$tpid"; fail "top stalled on its output ignores SIGTERM"; }
wait "$tpid"; rc=$?
tpid=
exec 7<&-
[ $rc = 143 ] || fail "top stalled, then SIGTERM: exit $rc, wanted 143"

"$py" - "$cli" "$sock" "$pid" <<'EOF' || fail "interactive top"
import fcntl, os, pty, re, select, signal, struct, sys, termios, time
cli, sock, dpid = sys.argv[1], sys.argv[2], int(sys.argv[3])
ENTER, LEAVE, SHOW = b"\x1b[?1049h", b"\x1b[?1049l", b"\x1b[?25h"

def start():
    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        os.environ["TERM"] = "xterm"
        os.execv(cli, [cli, "--socket", sock, "top", "--interval", "0.2"])
    return pid, fd

def read_until(fd, buf, pred, what):
    deadline = time.monotonic() + 60
    while not pred(buf):
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for %s: %r" % (what, buf[-400:]))
        r, _, _ = select.select([fd], [], [], 1)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                raise AssertionError("EOF waiting for %s: %r" % (what, buf[-400:]))
            buf += chunk
    return buf

def finish(pid, fd, buf):
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
    _, status = os.waitpid(pid, 0)
    lflag = termios.tcgetattr(fd)[3]
    os.close(fd)
    return buf, status, lflag

def restored(buf, lflag, what):
    assert buf.count(ENTER) >= 1, what
    tail = buf[buf.rindex(ENTER):]
    assert LEAVE in tail and SHOW in tail, (what, tail[-200:])
    assert lflag & termios.ICANON and lflag & termios.ECHO, (what, "termios not restored")

def frames(buf):
    return len(re.findall(rb"frame \d+", buf))

# 'q' quits; a resize redraws to fit.
pid, fd = start()
buf = read_until(fd, b"", lambda b: frames(b) >= 2, "two frames")
assert ENTER in buf and b"pool      blocks 64  free 64" in buf, buf[:400]
assert re.search(rb"q: quit", buf), buf[:400]
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 8, 40, 0, 0))
at = len(buf)
buf = read_until(fd, buf, lambda b: frames(b[at:]) >= 2, "a redraw after the resize")
screen = buf[at:].split(b"\x1b[H")[-2]  # a whole frame drawn after the resize
lines = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", screen).split(b"\r\n")
assert 1 < len(lines) <= 8 and max(len(l) for l in lines) <= 39, lines
os.write(fd, b"q")
buf, status, lflag = finish(pid, fd, buf)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
restored(buf, lflag, "q")

# ^C: the terminal restored, then death by SIGINT.
pid, fd = start()
buf = read_until(fd, b"", lambda b: frames(b) >= 1, "a frame")
os.write(fd, b"\x03")
buf, status, lflag = finish(pid, fd, buf)
assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT, status
restored(buf, lflag, "^C")

# The daemon dies: the terminal restored, a message after it, exit 1.
pid, fd = start()
buf = read_until(fd, b"", lambda b: frames(b) >= 1, "a frame")
os.kill(dpid, signal.SIGKILL)
buf, status, lflag = finish(pid, fd, buf)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1, status
restored(buf, lflag, "daemon gone")
assert b"kvshare: top: lost the daemon" in buf[buf.rindex(LEAVE):], buf[-300:]
print("interactive top: ok")
EOF
wait "$pid" 2>/dev/null
pid=
echo "test_top: ok"
