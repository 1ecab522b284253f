#!/usr/bin/env bash
# A cold `make demo`, each phase timed: a fresh clone of this checkout's HEAD into a scratch
# folder, built with an empty ccache (so nothing earlier helps), then the demo itself.
# Usage: scripts/measure-cold-demo.sh [SCRATCH_DIR]   (default /tmp/connex-cold-demo; removed first)
# docs/development.md ("What a build pays for") quotes its output.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
scratch="${1:-/tmp/connex-cold-demo}"
rm -rf "$scratch" && mkdir -p "$scratch"
git clone -q "$here" "$scratch/src" && cd "$scratch/src" || exit 1
export CCACHE_DIR="$scratch/ccache"  # empty: a cold compiler cache
targets="$(sed -n 's/^DEMO_TARGETS := //p' Makefile)"
phase() {  # phase NAME COMMAND...: runs it, logs to $scratch/NAME.log, prints its time
  local name="$1"; shift
  local start end
  start=$(date +%s.%N)
  "$@" > "$scratch/$name.log" 2>&1
  local rc=$?
  end=$(date +%s.%N)
  printf '%-14s %8.1f s  (exit %d, log %s)\n' "$name" "$(awk "BEGIN {print $end - $start}")" "$rc" \
    "$scratch/$name.log"
  return $rc
}
total_start=$(date +%s.%N)
# make demo's own steps (Makefile: deps-demo, demo-configure, demo-build).
phase install-deps make --no-print-directory deps-demo || exit 1
phase configure make --no-print-directory demo-configure || exit 1
# shellcheck disable=SC2086
phase build cmake --build build -j"$(nproc)" --target $targets || exit 1
phase demo ./build/bin/connex-chaos demo || exit 1
printf '%-14s %8.1f s\n' total "$(awk "BEGIN {print $(date +%s.%N) - $total_start}")"
echo "compiler time by area (build/.ninja_log):"
awk -F'\t' '!/^#/ {t=($2-$1)/1000; split($4,p,"/"); a=(p[1]=="connex")?p[1]"/"p[2]:p[1]; s[a]+=t; n+=t}
            END {for (k in s) printf "  %-24s %7.0f s\n", k, s[k]; printf "  %-24s %7.0f s\n", "total", n}' \
  build/.ninja_log | sort -k2 -n -r
