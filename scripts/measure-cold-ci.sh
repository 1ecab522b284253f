#!/usr/bin/env bash
# A cold `.ci/run`: a fresh clone of this checkout's HEAD into a scratch folder, run with an empty
# ccache, as CI's new machines run it. .ci/run prints each phase's time and a summary at the end.
# Usage: scripts/measure-cold-ci.sh [SCRATCH_DIR]   (default /tmp/connex-cold-ci; removed first)
# docs/development.md ("What a build pays for") quotes its output.
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
scratch="${1:-/tmp/connex-cold-ci}"
rm -rf "$scratch" && mkdir -p "$scratch"
git clone -q "$here" "$scratch/src" && cd "$scratch/src" || exit 1
export CCACHE_DIR="$scratch/ccache"  # empty: a cold compiler cache
.ci/run > "$scratch/ci.log" 2>&1
rc=$?
grep -A8 '^=== .ci/run: phases' "$scratch/ci.log"
echo "exit $rc (log $scratch/ci.log)"
exit $rc
