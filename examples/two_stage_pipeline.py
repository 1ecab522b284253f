#!/usr/bin/env python3
"""two_stage_pipeline: directory discovery plus a numpy tensor pulled across processes, through
the Python API (the C++ twin is examples/two_stage_pipeline.cc and prints the same lines).

The parent starts a directory and stage 0; it spawns itself as stage 1; stage 0 finds stage 1
through the directory (never a fixed address). Each stage is a connex.pp.StageNode running a
numpy engine written in Python: stage 0 turns the prompt into a float32 [tokens, hidden] tensor,
which stage 1 pulls with one one-sided read from stage 0's send ring. Both sides print what
crossed (shape, checksum); stage 1 answers with 31 bits of its checksum, and the parent exits 0
when they agree.

    PYTHONPATH=build/python python3 examples/two_stage_pipeline.py [--backend tcp|shm|ucx]
        [--tokens N] [--hidden D] [--log-level LEVEL]
"""

import argparse
import os
import subprocess
import sys

import numpy as np

import connex
import connex.pp
from connex.directory import DirectoryClient
from connex.directory_server import DirectoryServer

MODEL = "example"


def checksum(array):
    """FNV-1a over the array's bytes (as the C++ twin computes it)."""
    h = 1469598103934665603
    for b in np.ascontiguousarray(array).tobytes():
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def describe(array):
    dtype = {"float32": "F32", "int32": "I32", "int64": "I64", "float16": "F16"}[str(array.dtype)]
    shape = "[" + ", ".join(str(d) for d in array.shape) + "]"
    return f"{dtype} {shape} checksum={checksum(array):016x}"


class ExampleEngine(connex.pp.Engine):
    """Stage 0: token t becomes the row t * 0.5 + [0, 1, ..., hidden-1]. Stage 1: reports what it
    received and returns 31 bits of its checksum as every request's next token. Stateless."""

    def __init__(self, stage, hidden):
        self.stage, self.hidden = stage, hidden
        self.sent_checksum = None

    def execute_step(self, tensors):
        if self.stage == 0:
            tokens = tensors["tokens"].astype(np.float32)
            hidden = tokens[:, None] * np.float32(0.5) + np.arange(self.hidden, dtype=np.float32)
            self.sent_checksum = checksum(hidden)
            print(f"stage 0 sent:     hidden {describe(hidden)}", flush=True)
            return {"hidden": hidden}
        hidden = tensors["hidden"]
        print(f"stage 1 received: hidden {describe(hidden)}", flush=True)
        n = len(tensors["request_ids"])
        return {"next_tokens": np.full(n, checksum(hidden) & 0x7FFFFFFF, np.int32)}

    def missing_requests(self, tensors):
        return []

    def holds_request(self, request_id):
        return True

    def release(self, request_id):
        pass

    def num_held_requests(self):
        return 0


def start_stage(stage, backend, hidden, client, engine):
    slot_bytes = max(1 << 20, (hidden * 4 * 4096 + 4096) // 64 * 64)
    return connex.pp.StageNode(client, engine, model=MODEL, stage=stage, stages=2,
                               slot_bytes=slot_bytes, transport=backend)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=os.environ.get("CONNEX_PP_BACKEND", "tcp"),
                        choices=["tcp", "shm", "ucx", "auto"], help="transport of both stages")
    parser.add_argument("--log-level", default=os.environ.get("CONNEX_LOG_LEVEL", "warn"),
                        help="trace, debug, info, warn, error or off")
    parser.add_argument("--tokens", type=int, default=8, help="prompt length (rows)")
    parser.add_argument("--hidden", type=int, default=1024, help="columns of the tensor")
    parser.add_argument("--role", default="driver", help=argparse.SUPPRESS)
    parser.add_argument("--directory", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.tokens <= 4096 or not 1 <= args.hidden <= 65536:
        parser.error("--tokens must be in [1, 4096] and --hidden in [1, 65536]")
    try:
        connex.set_log_level(args.log_level)
    except connex.InvalidArgument as e:
        parser.error(f"--log-level: {e}")

    if args.role == "stage1":
        client = DirectoryClient(args.directory)
        client.start()
        node = start_stage(1, args.backend, args.hidden, client, ExampleEngine(1, args.hidden))
        sys.stdin.read()  # runs until the driver closes our stdin
        node.stop(leave=True, drain_timeout=2.0)
        return 0

    server = DirectoryServer("127.0.0.1:0", "127.0.0.1:0")
    server.start()
    print(f"directory at {server.bind_addr}", flush=True)
    # Stage 1 is its own process.
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "stage1",
                              "--directory", server.bind_addr, "--backend", args.backend,
                              "--hidden", str(args.hidden), "--log-level", args.log_level],
                             stdin=subprocess.PIPE)
    try:
        client = DirectoryClient(server.bind_addr)
        client.start()
        engine = ExampleEngine(0, args.hidden)
        node = start_stage(0, args.backend, args.hidden, client, engine)
        # Discovery: stage 1 is found through the directory.
        if not client.await_view(MODEL, 2, timeout=15):
            print("two_stage_pipeline: discovery: stage 1 did not join within 15 s",
                  file=sys.stderr)
            return 1
        for r in client.view(MODEL, 1):
            print(f"discovered {r.lid} epoch={r.epoch} at {' '.join(r.addresses)}", flush=True)
        prompt = [i * 3 + 1 for i in range(args.tokens)]
        try:
            got = node.submit(1, prompt, 1).result(timeout=30)
        except connex.Error as e:
            print(f"two_stage_pipeline: step: {e}", file=sys.stderr)
            return 1
        ok = got == [engine.sent_checksum & 0x7FFFFFFF]
        print(f"result: stage 1's checksum {'matches' if ok else 'DOES NOT MATCH'} stage 0's "
              f"over backend {args.backend}", flush=True)
        child.stdin.close()
        code = child.wait(timeout=30)
        node.stop(leave=True, drain_timeout=1.0)
        return 0 if ok and code == 0 else 1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


if __name__ == "__main__":
    sys.exit(main())
