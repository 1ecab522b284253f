#!/usr/bin/env bash
# Data-plane figures for docs/results.md: connex-bench for every backend next to the references
# measured in the same session (single-thread memcpy, iperf3 with 1 MiB writes, ucx_perftest
# -t ucp_get on the same UCX transport). Usage: scripts/bench-data-plane.sh [BIN_DIR] [SECONDS]
set -euo pipefail
BIN=${1:-build/bin}
S=${2:-2}
SIZES=4K,64K,1M,16M,64M
B="$BIN/connex-bench"
echo "# $(date -u +%FT%TZ) $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$B" memcpy --sizes $SIZES --seconds 1 --json
for backend in tcp shm; do
  "$B" transport --backend $backend --sizes $SIZES --seconds "$S" --json 2>/dev/null
done
# ucx over its tcp transport (peer error handling on, the default) and over posix shared memory
# (peer error handling off: UCX 1.13 has no peer-failure support on shared memory).
UCX_TLS=tcp "$B" transport --backend ucx --sizes $SIZES --seconds "$S" --json 2>/dev/null
CONNEX_TRANSPORT_UCX_PEER_ERRORS=0 UCX_TLS=posix \
  "$B" transport --backend ucx --sizes $SIZES --seconds "$S" --json 2>/dev/null
# iperf3, one stream, 1 MiB writes.
iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
sleep 0.5
iperf3 -c 127.0.0.1 -p 5299 -l 1M -t 5 -J | python3 -c \
  'import json,sys; d=json.load(sys.stdin); print("iperf3 -l 1M:", round(d["end"]["sum_received"]["bits_per_second"]/8e9, 3), "GB/s")'
wait
# ucx_perftest -t ucp_get, same sizes, on the two UCX transports.
for tls in tcp posix; do
  for size in 4096 65536 1048576 16777216 67108864; do
    n=$(( size >= 16777216 ? 100 : 2000 ))
    UCX_TLS=$tls ucx_perftest -p 13371 >/dev/null 2>&1 &
    sleep 0.5
    UCX_TLS=$tls ucx_perftest 127.0.0.1 -p 13371 -t ucp_get -s $size -n $n -w 10 2>/dev/null |
      awk -v tls=$tls -v size=$size '/^Final/ {printf "ucx_perftest %s %d: %.3f GB/s, latency %.1f us\n", tls, size, $7*1.048576/1000, $3}'
    wait
  done
done
for backend in tcp shm ucx; do
  "$B" peer-death --backend $backend --runs 20 --json 2>/dev/null
done
for backend in tcp shm ucx; do
  "$B" peer-death --backend $backend --runs 5 --stop --json 2>/dev/null
done
