#!/bin/bash
# test_ring_suite — the client API's integration tests again, with every
# session through a request ring (KVS_RING=1): first with the client
# spinning on replies (the daemon polls by default), then with the client
# sleeping at once (KVS_RING_SPIN_US=0: each reply wakes it through its
# eventfd).  Each test checks its own results, the pool and the fds, so a
# call that behaves differently through the ring fails it.  Needs $KVS_BUILD
# (set by run-tests.sh).  Exit 0 pass, 1 fail.
set -u
build=${KVS_BUILD:-build}
tests="test_client_api test_share test_kill9 test_swap test_many"
for spin in 50 0; do
  for t in $tests; do
    bin=$build/tests/integration/$t
    [ -x "$bin" ] || { echo "FAIL: $bin not built"; exit 1; }
    if ! out=$(KVS_RING=1 KVS_RING_SPIN_US=$spin timeout 120 "$bin" 2>&1); then
      echo "$out" | tail -40
      echo "FAIL: $t through the ring (KVS_RING_SPIN_US=$spin)"
      exit 1
    fi
    echo "ok: $t through the ring (KVS_RING_SPIN_US=$spin)"
  done
done
echo "test_ring_suite: ok"
