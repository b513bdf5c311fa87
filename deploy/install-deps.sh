#!/bin/sh
# Installs the Debian packages kvshare builds and tests with.  Run as root.
# Called by `make` when pkg-config cannot find a dependency.
#   --fuzz   also clang and libFuzzer, for `make fuzz` (never needed by
#            `make` or `make test`)
#   --bench  also fio, the baseline of the disk tier's benchmark (`make
#            bench`; bench_tiers skips its disk part without it)
set -eu
PKGS="build-essential pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler \
liburing-dev libcmocka-dev libxxhash-dev libjansson-dev python3 python3-numpy \
gnuplot-nox libmicrohttpd-dev libzmq3-dev libmsgpack-dev libsystemd-dev systemd curl \
python3-prometheus-client python3-zmq python3-msgpack python3-pytest python3-yaml python3-torch \
yamllint python3-venv python3-pip python3-setuptools python3-kubernetes \
libhiredis-dev redis-server redis-tools gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
if [ "${1:-}" = "--fuzz" ]; then
  PKGS="$PKGS clang-14 libclang-rt-14-dev"
fi
if [ "${1:-}" = "--bench" ]; then
  PKGS="$PKGS fio"
fi
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# promtool, Prometheus's metrics checker (test_observe.sh runs /metrics
# through it), is taken out of Debian's prometheus package: the package
# itself would install (and may start) a Prometheus server.
need_promtool=
command -v promtool >/dev/null 2>&1 || need_promtool=1
# nvdisasm, where nvcc is but the toolkit came without it: test_wgmma_ptx.sh
# reads the SASS of the wgmma kernels with it (NVIDIA's wheel from PyPI,
# 6 MB, in /usr/local/lib/kvshare-tools; the test skips that part without)
TOOLS=/usr/local/lib/kvshare-tools
need_nvdisasm=
if { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; } &&
   ! command -v nvdisasm >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvdisasm ] &&
   [ ! -x "$TOOLS/nvidia/cu13/bin/nvdisasm" ]; then
  need_nvdisasm=1
fi
[ -z "$missing" ] && [ -z "$need_promtool" ] && [ -z "$need_nvdisasm" ] && exit 0
if [ "$(id -u)" != 0 ]; then
  # (nvdisasm alone is optional: not worth a failure)
  [ -z "$missing" ] && [ -z "$need_promtool" ] && exit 0
  echo "kvshare: missing packages:$missing${need_promtool:+ promtool (from prometheus)}" >&2
  echo "kvshare: run 'sudo deploy/install-deps.sh' (or install them with apt-get) and retry" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if [ -n "$missing" ] || [ -n "$need_promtool" ]; then
  apt-get update -q >&2
fi
if [ -n "$missing" ]; then
  echo "kvshare: installing:$missing" >&2
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $missing >&2
fi
if [ -n "$need_promtool" ]; then
  echo "kvshare: installing promtool (from Debian's prometheus package) in /usr/local/bin" >&2
  tmp=$(mktemp -d)
  chmod 755 "$tmp" # (apt-get download runs as _apt)
  (cd "$tmp" && apt-get download -q prometheus >&2) &&
    dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool &&
    install -m 755 "$tmp/usr/bin/promtool" /usr/local/bin/promtool
  rc=$?
  rm -rf "$tmp"
  [ $rc = 0 ] || { echo "kvshare: could not install promtool" >&2; exit 1; }
fi
if [ -n "$need_nvdisasm" ]; then
  echo "kvshare: installing nvdisasm (PyPI: nvidia-cuda-nvdisasm) in $TOOLS" >&2
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
      --target "$TOOLS" nvidia-cuda-nvdisasm==13.5.37 >&2 ||
    echo "kvshare: could not install nvdisasm; test_wgmma_ptx.sh skips its SASS check" >&2
fi
