"""One pipeline stage process running a ToyEngine (numpy) under the C++ step protocol, for the
multi-process tests. Prints "ready EPOCH" once it serves; stops (leaving the directory) when its
stdin closes.

    pp_stage.py DIRECTORY MODEL STAGE STAGES REPLICA [--data-plane tcp|python]
"""

import argparse
import sys

import connex.pp
from connex import transport
from connex.directory import DirectoryClient

from toy_engine import ToyEngine


def main():
    p = argparse.ArgumentParser()
    p.add_argument("directory")
    p.add_argument("model")
    p.add_argument("stage", type=int)
    p.add_argument("stages", type=int)
    p.add_argument("replica", type=int)
    p.add_argument("--data-plane", default="tcp", choices=["tcp", "python"])
    p.add_argument("--step-timeout-ms", type=int, default=2000)
    a = p.parse_args()

    client = DirectoryClient(a.directory)
    client.start()
    lid = (a.model, a.stage, 0, a.replica)
    plane = None
    if a.data_plane == "python":
        from py_data_plane import TcpDataPlane
        plane = TcpDataPlane()
        te = transport.from_python(plane, lid, plane.address)
    else:
        te = a.data_plane
    node = connex.pp.StageNode(client, ToyEngine(a.stage, a.stages), model=a.model,
                               stage=a.stage, stages=a.stages, replica=a.replica,
                               step_timeout_ms=a.step_timeout_ms, probe_timeout_ms=500,
                               transport=te)
    print("ready", node.epoch, flush=True)
    sys.stdin.read()  # until the test closes our stdin
    node.stop(leave=True, drain_timeout=2.0)
    node.close()
    client.close()
    if plane is not None:
        plane.close()


if __name__ == "__main__":
    main()
