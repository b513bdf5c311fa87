#!/bin/bash
# test_public_header — libkvshare as an installed user sees it: the four
# installed headers alone (copied to a temporary include/kvshare/, as make
# install lays them out) compile a program in C (and C++ when g++ is here)
# that links with -lkvshare only and talks to a real kvshared; the shared
# object exports exactly the kvs_ names of its version script; the
# pkg-config template is well formed.
set -u
build=${KVS_BUILD:-build}
fail() { echo "FAIL: $*" >&2; [ -f "${dir:-}/log" ] && sed 's/^/  log| /' "$dir/log" >&2; exit 1; }
[ -e "$build/libkvshare.so" ] || fail "$build/libkvshare.so not built"
[ -x "$build/kvshared" ] || { echo "SKIP: kvshared not built"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-hdr-XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

# The exported symbols: every one is public (kvs_*), none is internal.
syms=$(nm -D --defined-only "$build/libkvshare.so" | awk '$2 ~ /[TDBR]/ {print $3}' | sed 's/@.*//')
bad=$(grep -v '^kvs_' <<<"$syms" | grep -v '^KVSHARE_')
[ -z "$bad" ] || fail "exported but not public: $bad"
grep -q '^kvs__' <<<"$syms" && fail "internal kvs__ symbols exported"
for s in kvs_connect kvs_batch_submit kvs_strerror kvs_cpu_write_kv kvs_kernels_cpu; do
  grep -qx "$s" <<<"$syms" || fail "$s not exported"
done
# ... and every function the public headers declare is exported (the
# headers' static inline helpers are not functions of the library).
for h in client/kvshare.h gpu/kvs_kernels.h proto/kvs_status.h; do
  grep -v '^[[:space:]]*\*\|^[[:space:]]*/\*\|^#\|static inline' "$h" | grep -oE '\bkvs_[a-z0-9_]+\(' | tr -d '('
done | sort -u >"$dir/declared"
missing=$(grep -vxF -f <(printf '%s\n' "$syms") "$dir/declared")
[ -z "$missing" ] || fail "declared in a public header but not exported: $missing"
readelf -d "$build/libkvshare.so" | grep -q 'SONAME.*libkvshare.so.0' || fail "soname"

mkdir -p "$dir/include/kvshare"
cp client/kvshare.h proto/kvs_status.h shm/kvs_layout.h gpu/kvs_kernels.h "$dir/include/kvshare/"
cat >"$dir/user.c" <<'EOF'
#include <kvshare.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
  kvs_client *c;
  int rc = kvs_connect(argv[1], NULL, &c);
  if (rc) { fprintf(stderr, "connect: %s\n", kvs_strerror(rc)); return 1; }
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t tok[40];
  for (int i = 0; i < 40; i++) tok[i] = 7 + i;
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  if (kvs_lookup(c, 1, tok, 40, NULL, 0, &lr) || kvs_allocate(c, 1, 40, &ar)) return 1;
  kvs_paged_kv kv;
  if (kvs_paged_kv_of(c, 0, &kv) || kv.block_size != l->block_size) return 1;
  memset(kvs_block_ptr(c, ar.blocks[0]), 1, l->block_stride);
  uint32_t sealed;
  if (kvs_commit(c, 1, 0, NULL, 40, ar.blocks, ar.num_blocks, &sealed) || sealed != 2) return 1;
  kvs_batch *b;
  if (kvs_batch_new(&b) || kvs_batch_free_req(b, 1) != 0 || kvs_batch_submit(c, b) ||
      kvs_batch_status(b, 0) != 0) return 1;
  kvs_batch_free(b);
  kvs_stats st;
  if (kvs_stats_get(c, 1, &st) || st.check != 0 || st.used_blocks != 0) return 1;
  printf("installed-user program: ok (%s %s, kernels '%s')\n", kvs_version(),
         kvs_pool_backend(c), kvs_kernels_cpu()->name);
  kvs_close(c);
  return argc > 2;
}
EOF
cc -std=c99 -Wall -Wextra -Werror -pedantic -I"$dir/include/kvshare" -o "$dir/user" \
  "$dir/user.c" -L"$build" -lkvshare -Wl,-rpath,"$(cd "$build" && pwd)" 2>"$dir/cc.err" ||
  { cat "$dir/cc.err" >&2; fail "the installed headers do not compile in C99"; }
if command -v g++ >/dev/null; then
  cp "$dir/user.c" "$dir/user.cc"
  g++ -std=c++11 -Wall -Werror -fsyntax-only -I"$dir/include/kvshare" "$dir/user.cc" 2>"$dir/cxx.err" ||
    { cat "$dir/cxx.err" >&2; fail "the installed headers do not compile in C++"; }
fi

# pkg-config file, as make install writes it.
sed -e "s|@PREFIX@|$dir|" -e 's|@VERSION@|0.1.0|' client/kvshare.pc.in >"$dir/kvshare.pc"
PKG_CONFIG_PATH=$dir pkg-config --cflags --libs kvshare | grep -q -- "-I$dir/include/kvshare" ||
  fail "kvshare.pc cflags"
PKG_CONFIG_PATH=$dir pkg-config --libs kvshare | grep -q -- "-lkvshare" || fail "kvshare.pc libs"

. "$(dirname "$0")/../lib/daemon.sh"
kvs_start_daemon "$build/kvshared" "$dir" "$dir/s" "$dir/log" --num-layers 1 \
  --head-dim 8 --pool-blocks 64 || fail "kvshared did not start"
# (An ASan-built libkvshare needs the ASan runtime first in a plain program.)
asan=$(ldd "$build/libkvshare.so" | awk '/libasan/ {print $3}')
LD_PRELOAD=$asan ASAN_OPTIONS=detect_leaks=0 "$dir/user" "$dir/s" || fail "the program failed"
kill -TERM "$pid"; wait "$pid"; rc=$?; pid=
[ $rc = 0 ] || fail "kvshared exited $rc"
echo "test_public_header: ok"
