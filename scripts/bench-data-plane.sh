#!/usr/bin/env bash
# Data-plane figures for docs/results.md: connex-bench for every backend next to the references
# measured in the same session (single-thread memcpy, iperf3 with 1 MiB writes, ucx_perftest
# -t ucp_get on the same UCX transport), ROUNDS rounds interleaved, medians printed at the end.
# Usage: scripts/bench-data-plane.sh [BIN_DIR] [SECONDS] [ROUNDS]
#
# Rounds, because loopback throughput here is noisy, and over UCX's tcp transport ucx_perftest
# alternates between ~1.2 and ~1.65 GB/s at 64 MiB from one run to the next. UCX's tcp runs
# (ours and ucx_perftest) both use UCX_NET_DEVICES=lo, so that they use the same device.
set -euo pipefail
BIN=${1:-build/bin}
S=${2:-2}
ROUNDS=${3:-3}
SIZES=4K,64K,1M,16M,64M
B="$BIN/connex-bench"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
echo "# $(date -u +%FT%TZ) $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg), $ROUNDS rounds"

# One JSON object per line in $OUT, tagged with what produced it.
record() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d["tag"]=sys.argv[1]; print(json.dumps(d))' "$1" >>"$OUT"; }

iperf() {
  iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
  sleep 0.5
  iperf3 -c 127.0.0.1 -p 5299 -l 1M -t 3 -J | python3 -c \
    'import json,sys; d=json.load(sys.stdin); print(json.dumps({"results":[{"size":0,"gbps":d["end"]["sum_received"]["bits_per_second"]/8e9}]}))' |
    record iperf3
  wait
}

perftest() {  # TLS: ucx_perftest -t ucp_get for every size, one JSON object
  local tls=$1 line results=()
  local -x UCX_NET_DEVICES=${UCX_NET_DEVICES:-all}
  [[ $tls == tcp ]] && UCX_NET_DEVICES=lo
  for size in 4096 65536 1048576 16777216 67108864; do
    local n=$((size >= 16777216 ? 60 : 2000))
    UCX_TLS=$tls ucx_perftest -p 13371 >/dev/null 2>&1 &
    sleep 0.5
    line=$(UCX_TLS=$tls ucx_perftest 127.0.0.1 -p 13371 -t ucp_get -s $size -n $n -w 10 2>/dev/null |
      awk -v size=$size '/^Final/ {printf "{\"size\":%d,\"gbps\":%.4f,\"p50_us\":%.1f}", size, $7*1.048576/1000, $3}')
    wait
    [[ -n $line ]] && results+=("$line")
  done
  (IFS=,; echo "{\"results\":[${results[*]}]}") | record "ucx_perftest $tls"
}

for round in $(seq "$ROUNDS"); do
  echo "# round $round"
  "$B" memcpy --sizes $SIZES --seconds 1 --json | record memcpy
  for backend in tcp shm; do
    "$B" transport --backend $backend --sizes $SIZES --seconds "$S" --json 2>/dev/null | record "$backend"
  done
  iperf
  # ucx over UCX's tcp transport and over posix shared memory. Peer error handling is `auto`:
  # on over tcp (a connection transport), off over posix, as in ucx_perftest without -e.
  UCX_TLS=tcp UCX_NET_DEVICES=lo "$B" transport --backend ucx --sizes $SIZES --seconds "$S" --json 2>/dev/null | record "ucx tcp"
  perftest tcp
  UCX_TLS=posix "$B" transport --backend ucx --sizes $SIZES --seconds "$S" --json 2>/dev/null | record "ucx posix"
  perftest posix
  # UCX's own choice (no UCX_TLS), what the ucx backend uses by default.
  "$B" transport --backend ucx --sizes $SIZES --seconds "$S" --json 2>/dev/null | record "ucx default"
done

for backend in tcp shm ucx; do
  "$B" peer-death --backend $backend --runs 20 --json 2>/dev/null
done
for backend in tcp shm ucx; do
  "$B" peer-death --backend $backend --runs 5 --stop --json 2>/dev/null
done

python3 - "$OUT" <<'EOF'
import collections, json, statistics, sys
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    d = json.loads(line)
    for r in d["results"]:
        runs[d["tag"]][r["size"]].append(r)
def fmt(tag, size):
    rs = runs[tag].get(size)
    if not rs: return ""
    g = statistics.median(r["gbps"] for r in rs)
    if "p50_us" in rs[0] and tag not in ("memcpy",) and not tag.startswith("ucx_perftest"):
        return "%.2f (%.1f)" % (g, statistics.median(r["p50_us"] for r in rs))
    return "%.2f" % g
tags = ["memcpy", "shm", "tcp", "iperf3", "ucx tcp", "ucx_perftest tcp", "ucx posix",
        "ucx_perftest posix", "ucx default"]
print("median of %d rounds, GB/s (p50 us)" % max(len(v) for t in runs.values() for v in t.values()))
print("| size | " + " | ".join(tags) + " |")
print("|---" * (len(tags) + 1) + "|")
for size in (4096, 65536, 1048576, 16777216, 67108864):
    cells = [fmt(t, 0 if t == "iperf3" else size) for t in tags]
    print("| %d | %s |" % (size, " | ".join(cells)))
print("all runs, GB/s:")
for t in tags:
    for size, rs in sorted(runs[t].items()):
        print("  %-20s %9d: %s" % (t, size, " ".join("%.2f" % r["gbps"] for r in rs)))
EOF
