#!/usr/bin/env bash
# Prefill-decode disaggregation's figures for docs/results.md (docs/design/pd.md):
#   connex-chaos pd --kill both   (decode KV standby on): prefill and decode kills in turn, and the
#     colocated pipeline on the same load and kill times -> docs/results-data/pd-both.json
#   connex-chaos pd --kill decode (standby on, and off: resumes from retained copies), no
#     colocated run -> pd-decode-standby.json, pd-decode-retained.json
#   connex-chaos pd --kill none --qps 1, long prompts absent: the handoffs' read throughput on a
#     quiet deployment -> pd-quiet.json, beside connex-bench transport at the handoffs' size
#     -> pd-transport.txt
# Usage: scripts/pd-results.sh [DURATION_S (30)]. A failed run is recorded, not fatal.
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-30}"
bin=build/bin
data=docs/results-data
mkdir -p "$data"
common=(--qps 4 --duration "$duration" --kill-every 5 --max-tokens 200 --quiet)
echo "connex-chaos pd --kill both --kv-standby on ${common[*]}" >&2
"$bin/connex-chaos" pd --kill both --kv-standby on "${common[@]}" --json "$data/pd-both.json" || true
for mode in on off; do
  name=$([ "$mode" = on ] && echo standby || echo retained)
  echo "connex-chaos pd --kill decode --kv-standby $mode --no-colocated ${common[*]}" >&2
  "$bin/connex-chaos" pd --kill decode --kv-standby "$mode" --no-colocated "${common[@]}" \
    --json "$data/pd-decode-$name.json" || true
done
echo "connex-chaos pd --kill none --qps 1 --no-colocated" >&2
"$bin/connex-chaos" pd --kill none --qps 1 --duration 20 --max-tokens 64 --no-colocated --quiet \
  --json "$data/pd-quiet.json" || true
# One handoff update is one read of about the handoff's bytes per request.
size=$(/usr/bin/python3 -c "import json; r=json.load(open('$data/pd-quiet.json')); \
print(int(r['pd']['kv']['bytes_per_request']))" 2>/dev/null || echo 422000)
echo "connex-bench transport --backend tcp --sizes $size" >&2
"$bin/connex-bench" transport --backend tcp --sizes "$size" --seconds 2 > "$data/pd-transport.txt" \
  2>&1 || true
