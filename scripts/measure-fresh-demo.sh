#!/usr/bin/env bash
# A cold `make demo` on a fresh machine: a Debian 12 root made with debootstrap holding what this
# machine's image had before scripts/install-deps.sh ran (the compilers, CMake, GoogleTest, Python;
# /var/log/apt/history.log), none of our other packages and no ccache; a fresh clone of this
# checkout's HEAD is measured in it by scripts/measure-cold-demo.sh, install-deps included.
# Needs root and Debian's apt repository. Usage: scripts/measure-fresh-demo.sh [ROOT]
# (default /tmp/connex-fresh-root; removed first). docs/development.md quotes its output.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
root="${1:-/tmp/connex-fresh-root}"
IMAGE_PACKAGES=(build-essential cmake make ninja-build g++-12 clang-14 libclang-rt-14-dev lld-14 lld
                clang-format libgtest-dev libgmock-dev libbenchmark-dev libicu-dev iproute2 procps
                python3 python3-dev openssl pkg-config git curl llvm ca-certificates jq man-db)
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
umount "$root/proc" "$root/dev/shm" "$root/dev/pts" 2>/dev/null || true
rm -rf "$root"
debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian > /dev/null
cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/" 2>/dev/null &&
  rm -f "$root/etc/apt/sources.list"
cp /etc/resolv.conf "$root/etc/"
mount -t proc proc "$root/proc"
mount -t tmpfs tmpfs "$root/dev/shm"
mount -t devpts devpts "$root/dev/pts"
trap 'umount "$root/proc" "$root/dev/shm" "$root/dev/pts"' EXIT
chroot "$root" /bin/bash -c "export DEBIAN_FRONTEND=noninteractive; apt-get update -qq &&
  apt-get install -y -qq --no-install-recommends ${IMAGE_PACKAGES[*]} > /tmp/image.log &&
  apt-get clean"
git clone -q "$here" "$root/root/src"
chroot "$root" /bin/bash -c "cd /root/src && bash scripts/measure-cold-demo.sh /root/cold"
