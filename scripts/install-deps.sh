#!/usr/bin/env bash
# Installs every Debian package Ferry needs to build, test and benchmark.
# Idempotent: only packages that are missing are installed. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev
  libssl-dev libcpp-httplib-dev libhiredis-dev libcli11-dev nlohmann-json3-dev
  libfabric-dev liburing-dev fio
  etcd-server etcd-client redis-server
  python3 python3-dev pybind11-dev python3-pytest python3-numpy
  python3-torch python3-matplotlib python3-pytest-timeout
  python3-pip python3-setuptools python3-wheel python3-venv
  iproute2 procps
  clang clang-format libclang-rt-14-dev iperf3 nftables
  ccache stress-ng
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
