#!/usr/bin/env bash
# Installs the Debian packages Connex builds, tests and benchmarks with.
# Idempotent: installs only what is missing; does nothing when all are present.
set -euo pipefail

PACKAGES=(
  build-essential cmake make ninja-build g++-12 clang-14 libclang-rt-14-dev lld-14 lld clang-format
  libgtest-dev libgmock-dev libbenchmark-dev
  libabsl-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
  libucx-dev ucx-utils
  libboost-dev nlohmann-json3-dev libcli11-dev libspdlog-dev
  iperf3 iproute2 procps
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
