#!/bin/bash
# test_envelope_suite — the client API's integration tests again with
# compact frames off (KVS_COMPACT=0): every call goes as a protobuf
# Envelope, as it does to a daemon that does not take compact frames, and
# as it did before them.  The default runs of these tests use compact frames
# wherever a call has one, so between the two every call is run both ways;
# each test checks its own results, the pool and the fds.  Needs $KVS_BUILD
# (set by run-tests.sh).  Exit 0 pass, 1 fail.
set -u
build=${KVS_BUILD:-build}
tests="test_client_api test_share test_kill9 test_swap test_many test_packed"
for t in $tests; do
  bin=$build/tests/integration/$t
  [ -x "$bin" ] || { echo "FAIL: $bin not built"; exit 1; }
  if ! out=$(KVS_COMPACT=0 timeout 120 "$bin" 2>&1); then
    echo "$out" | tail -40
    echo "FAIL: $t with compact frames off"
    exit 1
  fi
  echo "ok: $t with compact frames off"
done
echo "test_envelope_suite: ok"
