#!/bin/bash
# test_sockpoll_suite — the client API's integration tests again with both
# ends of every socket polling instead of sleeping: each daemon started
# with --socket-poll-us (KVS_ITEST_SOCKET_POLL_US), each client spinning on
# its replies (KVS_SOCKET_SPIN_US).  Each test checks its own results, the
# pool, the fds and a clean stop, so a call that behaves differently when
# the daemon polls fails it; and the daemons must say that frames came
# while they polled (else nothing here was tested).  Needs $KVS_BUILD (set
# by run-tests.sh).  Exit 0 pass, 1 fail.
set -u
build=${KVS_BUILD:-build}
tests="test_client_api test_share test_kill9 test_swap test_many"
total=
for t in $tests; do
  bin=$build/tests/integration/$t
  [ -x "$bin" ] || { echo "FAIL: $bin not built"; exit 1; }
  if ! out=$(KVS_ITEST_SOCKET_POLL_US=200 KVS_SOCKET_SPIN_US=200 \
             KVS_ITEST_LOG=1 timeout 120 "$bin" 2>&1); then
    echo "$out" | tail -40
    echo "FAIL: $t with the sockets polled"
    exit 1
  fi
  awake=$(echo "$out" | sed -n 's/.*socket polling (socket_poll_us 200): \([0-9]*\) of \([0-9]*\) frames.*/\1 \2/p')
  [ -n "$awake" ] || { echo "$out" | tail -20; echo "FAIL: $t: no daemon said it polled"; exit 1; }
  echo "$awake" | awk '$1 > 0 { ok = 1 } END { exit !ok }' ||
    { echo "FAIL: $t: no frame came while a daemon polled ($awake)"; exit 1; }
  total="$total $awake"
  echo "ok: $t with the sockets polled (frames while polling, of frames: $(echo $awake | tr '\n' ' '))"
done
# Most frames of all the tests must have come while a daemon polled (a
# client that did not wait in between; 99% here on 2 vCPUs).
echo "$total" | tr ' ' '\n' | awk 'NF { v[n++] = $1 }
  END { for (i = 0; i + 1 < n; i += 2) { a += v[i]; f += v[i + 1] }
        printf "all tests: %d of %d frames while a daemon polled\n", a, f
        exit !(2 * a >= f) }' ||
  { echo "FAIL: fewer than half the frames came while a daemon polled"; exit 1; }
echo "test_sockpoll_suite: ok"
