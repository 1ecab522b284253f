#!/usr/bin/python3
"""Decode steps of one stage engine before and after it sits idle: do its weights go cold?

    PYTHONPATH=build/python CONNEX_ENGINE_WEIGHTS=mapped|copied \\
        /usr/bin/python3 bench/engine_idle_weights.py MODEL [IDLE_SECONDS]

Loads MODEL (a connex-mkmodel .safetensors file or a Hugging Face directory) as one stage,
prefills four tokens, times three decode steps, sleeps IDLE_SECONDS (default 100), times three
more, and prints the step times with the process's resident file/anonymous memory and its page
fault counts around them (docs/results.md, "Weights that go cold").
"""
import os
import sys
import time

import numpy as np

import connex


def step(request_id, start, tokens):
    return {"request_ids": np.array([request_id], np.int64),
            "start_positions": np.array([start], np.int32),
            "num_tokens": np.array([len(tokens)], np.int32),
            "tokens": np.array(tokens, np.int32)}


def memory():
    """RssFile and RssAnon in MB, and the minor and major faults so far."""
    out = {}
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("RssFile", "RssAnon")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) // 1024
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    out["minflt"], out["majflt"] = int(fields[7]), int(fields[9])
    return out


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    idle = float(sys.argv[2]) if len(sys.argv) == 3 else 100.0
    weights = os.environ.get("CONNEX_ENGINE_WEIGHTS", "copied (the default)")
    engine = connex.StageEngine.load(sys.argv[1])
    out = engine.execute_step(step(1, 0, [1, 2, 3, 4]))
    position, token = 4, int(out["next_tokens"][0])

    def decode(n):
        nonlocal position, token
        times = []
        for _ in range(n):
            start = time.monotonic()
            out = engine.execute_step(step(1, position, [token]))
            times.append("%.0f ms" % ((time.monotonic() - start) * 1e3))
            position, token = position + 1, int(out["next_tokens"][0])
        return times

    print(weights, "before idle:", decode(3), memory(), flush=True)
    time.sleep(idle)
    before = memory()
    print(weights, "after %.0f s idle:" % idle, before, decode(3), memory(), flush=True)


if __name__ == "__main__":
    main()
