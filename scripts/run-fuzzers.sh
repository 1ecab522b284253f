#!/usr/bin/env bash
# Runs every libFuzzer target `fuzz_<name>` in BIN_DIR for SECONDS each, starting from the seed
# corpus fuzz/corpus/<name>/ (copied, so the checked-in seeds are never modified).
# Usage: scripts/run-fuzzers.sh BIN_DIR [SECONDS]
set -euo pipefail
bin_dir=${1:?usage: run-fuzzers.sh BIN_DIR [SECONDS]}
seconds=${2:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
status=0
for fuzzer in "$bin_dir"/fuzz_*; do
  [ -x "$fuzzer" ] || continue
  name=$(basename "$fuzzer"); name=${name#fuzz_}
  work=$(mktemp -d)
  if [ -d "$root/fuzz/corpus/$name" ]; then cp -r "$root/fuzz/corpus/$name/." "$work/"; fi
  echo "fuzz: $name for ${seconds}s"
  if ! "$fuzzer" -max_total_time="$seconds" -print_final_stats=1 "$work" >"$work.log" 2>&1; then
    echo "fuzz: $name FAILED"; tail -40 "$work.log"; status=1
  else
    grep -E "stat::number_of_executed_units|Done" "$work.log" | tail -2 || true
  fi
  rm -rf "$work" "$work.log"
done
exit $status
