#!/usr/bin/env bash
# The KV standby's figures for docs/results.md, on vs off in the same minutes:
#   bench_handover --kv-standby off|on over prompts of 64 .. 2000 tokens (kill -> next token
#     against the context length) -> docs/results-data/kv-standby-handover.json
#   connex-chaos failover --runs RUNS --kv-standby off|on -> kv-standby-failover-{off,on}.json
#   connex-chaos steady --inflight 4 --kv-standby off|on -> kv-standby-steady-{off,on}.json
# then scripts/results-charts draws docs/assets/kv-standby-handover.svg.
# Usage: scripts/kv-standby-results.sh [RUNS (200)] [HANDOVER_RUNS (5)]
# KV_PROMPTS (default "64 250 500 1000 2000") chooses the prompt lengths, KV_PARTS (default
# "handover failover steady") the parts that run. A failed run is recorded (its figures say so),
# not fatal.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-200}"
handover_runs="${2:-5}"
bin=build/bin
data=docs/results-data
mkdir -p "$data"
parts="${KV_PARTS:-handover failover steady}"
if [[ " $parts " == *" handover "* ]]; then
  out="$data/kv-standby-handover.json"
  echo "[" > "$out.tmp"
  first=1
  for prompt in ${KV_PROMPTS:-64 250 500 1000 2000}; do
    # A long prompt's prefill takes seconds: the other requests must not end before the kill.
    max_new=160
    [ "$prompt" -lt 2000 ] || max_new=400
    for mode in off on; do
      echo "bench_handover --kv-standby $mode --prompt-tokens $prompt --runs $handover_runs" \
        "--max-new-tokens $max_new" >&2
      line=$("$bin/bench_handover" --runs "$handover_runs" --kv-standby "$mode" \
        --prompt-tokens "$prompt" --max-new-tokens "$max_new" --json) || true
      [ -n "$line" ] || continue
      [ "$first" = 1 ] || echo "," >> "$out.tmp"
      first=0
      echo "$line" >> "$out.tmp"
    done
  done
  echo "]" >> "$out.tmp"
  mv "$out.tmp" "$out"
fi
[[ " $parts " == *" failover "* ]] && for mode in off on; do
  echo "connex-chaos failover --runs $runs --kv-standby $mode" >&2
  "$bin/connex-chaos" failover --runs "$runs" --kv-standby "$mode" --quiet \
    --json "$data/kv-standby-failover-$mode.json" || true
done
[[ " $parts " == *" steady "* ]] && for mode in off on; do
  echo "connex-chaos steady --inflight 4 --kv-standby $mode" >&2
  "$bin/connex-chaos" steady --inflight 4 --qps 2 --duration 20 --kv-standby "$mode" --quiet \
    --json "$data/kv-standby-steady-$mode.json" || true
done
scripts/results-charts
