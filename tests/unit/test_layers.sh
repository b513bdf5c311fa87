#!/bin/bash
# test_layers — the direction of dependencies (docs/architecture.md), read
# from the code itself: the #include lines of every source, and the calls
# between the daemon's object files (their undefined symbols, resolved by
# nm against the symbols the others define).
#
# - The daemon's rooms have an order, lowest first:
#     core/, daemon/log.c  <  daemon/config.c  <  pool/  <  tiers/
#       <  observe/, dispatch/  <  net/, part/  <  daemon/serve.c, main.c
#   A file includes headers and calls functions of its own room or of
#   lower ones only: state comes up as data and callbacks, never as a call
#   to an upper room by name.
# - The request layer's files (net/, dispatch/, observe/, serve.c and the
#   codecs in proto/) form no circle of calls, file to file.
# - dispatch/ sees no wire type: nothing it includes, directly or not, is
#   protobuf-c's (the .d files the compiler wrote say what it includes).
# - client/ includes nothing of daemon/; proto/ and shm/ nothing of
#   daemon/ or client/.
# Run from the repository root with KVS_BUILD set (tests/run-tests.sh).
set -eu
build=${KVS_BUILD:-build}
[ -f "$build/kvshared" ] || { echo "skipped: no $build/kvshared"; exit 77; }
command -v nm >/dev/null || { echo "skipped: no nm"; exit 77; }
exec python3 - "$build" <<'EOF'
import os, re, subprocess, sys

build = sys.argv[1]
ORDER = {'core': 0, 'log': 0, 'config': 1, 'pool': 2, 'tiers': 3,
         'observe': 4, 'dispatch': 4, 'net': 5, 'part': 5, 'top': 6}
problems = []

def room(path):
    """The daemon room of a source path, or None outside daemon/."""
    p = path.split('/')
    if p[0] != 'daemon':
        return None
    if len(p) == 2:
        for r in ('log', 'config'):
            if p[1].startswith(r + '.'):
                return r
        return 'top'
    return p[1] if p[1] in ORDER else None

def sources(top):
    for d, _, fs in os.walk(top):
        for f in fs:
            if f.endswith(('.c', '.h')):
                yield os.path.join(d, f)

inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
for top in ('daemon', 'client', 'proto', 'shm'):
    for src in sources(top):
        text = open(src).read()
        for h in inc.findall(text):
            if top == 'client' and h.startswith('daemon/'):
                problems.append('%s includes %s: client/ never includes '
                                'daemon/' % (src, h))
            if top in ('proto', 'shm') and h.startswith(('daemon/', 'client/')):
                problems.append('%s includes %s' % (src, h))
            if top == 'daemon' and h.startswith('daemon/'):
                a, b = room(src), room(h)
                if a and b and ORDER[b] > ORDER[a]:
                    problems.append('%s (%s) includes %s, of a room above it '
                                    '(%s)' % (src, a, h, b))

# dispatch/ and protobuf-c: what the compiler says dispatch.c includes.
for dep in ('daemon/dispatch/dispatch.d', 'daemon/dispatch/reqmap.d'):
    path = os.path.join(build, dep)
    if not os.path.exists(path):
        problems.append('no %s: build first' % path)
        continue
    deps = open(path).read()
    for bad in ('kvshare.pb-c.h', 'protobuf-c.h', 'kvs_frame.h'):
        if bad in deps:
            problems.append('%s includes %s (dispatch sees no wire type)'
                            % (dep[:-2] + '.c', bad))

# Calls, object to object.
objs = []
for top in ('daemon', 'proto'):
    for d, _, fs in os.walk(os.path.join(build, top)):
        for f in fs:
            src = os.path.relpath(os.path.join(d, f), build)[:-2] + '.c'
            if f.endswith('.o') and os.path.exists(src):
                objs.append((src, os.path.join(d, f)))
defined, undefined = {}, {}
for src, o in objs:
    out = subprocess.run(['nm', o], capture_output=True, text=True).stdout
    undefined[src] = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in 'TDBR':
            defined.setdefault(parts[2], src)
        elif len(parts) == 2 and parts[0] == 'U':
            undefined[src].add(parts[1])
calls = {src: set() for src, _ in objs}
for src, syms in undefined.items():
    for s in syms:
        dst = defined.get(s)
        if dst and dst != src:
            calls[src].add((dst, s))
for src, edges in calls.items():
    a = room(src)
    for dst, s in edges:
        b = room(dst)
        if a and b and ORDER[b] > ORDER[a]:
            problems.append('%s (%s) calls %s of %s (%s), a room above it'
                            % (src, a, s, dst, b))
        if src.startswith('proto/') and b:
            problems.append('%s calls %s of %s' % (src, s, dst))

# No circle among the request layer's files.
def request_layer(src):
    return room(src) in ('net', 'dispatch', 'observe') or \
        src == 'daemon/serve.c' or src.startswith('proto/codec')
graph = {s: {d for d, _ in calls[s] if request_layer(d)}
         for s in calls if request_layer(s)}
state = {}
def visit(n, path):
    state[n] = 1
    for m in sorted(graph.get(n, ())):
        if state.get(m) == 1:
            problems.append('a circle of calls: %s' %
                            ' -> '.join(path[path.index(m):] + [m]))
        elif m not in state:
            visit(m, path + [m])
    state[n] = 2
for n in sorted(graph):
    if n not in state:
        visit(n, [n])

nfiles = len(objs)
nedges = sum(len(e) for e in calls.values())
if problems:
    print('\n'.join(problems))
    sys.exit(1)
print('%d objects, %d calls between them: every call and include points '
      'down; the request layer (%d files) has no circle; dispatch includes '
      'no protobuf' % (nfiles, nedges, len(graph)))
EOF
