#!/usr/bin/env python3
"""bench_transfer: one-sided reads through the Python API against the same reads through C++
(`connex-bench transport`), from the same peer, alternating in the same minutes.

A `connex-bench serve` process owns a managed buffer filled with a known pattern; each round runs
`connex-bench transport --peer SPEC` (C++ reader) and then reads the same bytes through
`connex.transport` (a Python reader: `transfer_sync_read` into a ManagedBuffer, as connex-bench
does, and into a registered numpy array), one read in flight, for `--seconds` each. Prints every
round and the medians; GB/s is 1e9 bytes/s. docs/results.md, "Data plane from Python".

    PYTHONPATH=build/python python3 python/tools/bench_transfer.py --bin build/bin
        [--backend tcp,shm] [--size 16M] [--seconds 2] [--rounds 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import connex
from connex import transport

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    text = text.strip().upper()
    if text and text[-1] in UNITS:
        return int(text[:-1]) * UNITS[text[-1]]
    return int(text)


def check_pattern(array, size):
    """The bytes connex-bench serve writes: PatternByte(1, i) = (i*131) ^ (i>>9) ^ 29."""
    i = np.arange(0, size, 4099, dtype=np.uint64)
    want = ((i * np.uint64(131)) ^ (i >> np.uint64(9)) ^ np.uint64(29)) & np.uint64(0xFF)
    got = np.frombuffer(array, dtype=np.uint8, count=size)[::4099]
    if not np.array_equal(got, want.astype(np.uint8)):
        sys.exit("bench_transfer: the bytes read through Python are wrong")


def python_reads(engine, peer, base, local, size, seconds):
    engine.transfer_sync_read(peer, local, base, size)  # warm up: connection, page faults
    latencies = []
    start = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline:
        t0 = time.perf_counter()
        engine.transfer_sync_read(peer, local, base, size)
        now = time.perf_counter()
        latencies.append((now - t0) * 1e6)
    elapsed = now - start
    check_pattern(local, size)
    return len(latencies) * size / elapsed / 1e9, statistics.median(latencies)


def cpp_reads(bench, backend, spec, size, seconds):
    out = subprocess.run([bench, "--log-level", "warn", "transport", "--backend", backend,
                          "--peer", spec, "--sizes", str(size), "--seconds", str(seconds),
                          "--json"], capture_output=True, text=True, check=True).stdout
    r = json.loads(out)["results"][0]
    return r["gbps"], r["p50_us"]


def run_backend(bench, backend, size, seconds, rounds):
    serve = subprocess.Popen([bench, "--log-level", "warn", "serve", "--backend", backend,
                              "--size", str(size)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # serves until stdin closes
    try:
        line = serve.stdout.readline().split()
        if len(line) != 2 or line[0] != "PEER":
            sys.exit(f"bench_transfer: connex-bench serve printed {line!r}")
        spec = line[1]
        lid, base, _, *addresses = spec.split(";")
        peer = (lid, addresses)
        base = int(base, 16)
        engine = transport.create_transfer_engine(backend, ("pybench", 2, 0, 0))
        managed = engine.allocate_managed_buffer(size)
        array = np.zeros(size, dtype=np.uint8)
        engine.register_memory(array)
        rows = []
        for r in range(rounds):
            c = cpp_reads(bench, backend, spec, size, seconds)
            m = python_reads(engine, peer, base, managed, size, seconds)
            a = python_reads(engine, peer, base, array, size, seconds)
            rows.append((c, m, a))
            print(f"{backend} round {r + 1}: C++ {c[0]:.2f} GB/s (p50 {c[1]:.0f} us), "
                  f"Python managed {m[0]:.2f} ({m[1]:.0f}), Python numpy {a[0]:.2f} "
                  f"({a[1]:.0f}); ratio {m[0] / c[0]:.2f} / {a[0] / c[0]:.2f}", flush=True)
        engine.unregister_memory(array)
        managed.free()
        engine.close()
        med = [statistics.median(row[k][0] for row in rows) for k in range(3)]
        p50 = [statistics.median(row[k][1] for row in rows) for k in range(3)]
        print(f"{backend} median: C++ {med[0]:.2f} GB/s (p50 {p50[0]:.0f} us), Python managed "
              f"{med[1]:.2f} ({p50[1]:.0f}), Python numpy {med[2]:.2f} ({p50[2]:.0f}); "
              f"Python/C++ {med[1] / med[0]:.2f} / {med[2] / med[0]:.2f}", flush=True)
    finally:
        serve.kill()
        serve.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=os.environ.get("CONNEX_BIN_DIR", "build/bin"),
                        help="directory of connex-bench")
    parser.add_argument("--backend", default="tcp,shm", help="comma-separated backends")
    parser.add_argument("--size", default="16M", help="bytes per read (K, M, G suffixes)")
    parser.add_argument("--seconds", type=float, default=2.0, help="per side and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bench = os.path.join(args.bin, "connex-bench")
    if not os.access(bench, os.X_OK):
        parser.error(f"--bin: no connex-bench in {args.bin}")
    try:
        size = parse_size(args.size)
    except ValueError:
        parser.error(f"--size: {args.size!r} is not a size")
    if size <= 0 or args.seconds <= 0 or args.rounds <= 0:
        parser.error("--size, --seconds and --rounds must be positive")
    connex.set_log_level(os.environ.get("CONNEX_LOG_LEVEL", "warn"))
    print(f"bench_transfer: {size} bytes, one read in flight, {args.seconds} s per side, "
          f"{args.rounds} rounds; load average {os.getloadavg()[0]:.2f}", flush=True)
    for backend in args.backend.split(","):
        run_backend(bench, backend, size, args.seconds, args.rounds)


if __name__ == "__main__":
    main()
