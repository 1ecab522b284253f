"""A pipeline of stage processes running a Python (numpy) engine under the C++ step protocol: a
stage process is SIGKILLed mid-generation and every request still gets exactly the tokens of an
undisturbed run (the owner re-sends its steps to the other replica, which recomputes the
requests). Also over a data plane written in Python (connex.transport.from_python)."""

import os
import signal
import subprocess
import sys
import threading

import pytest

import connex.pp
from connex import transport
from connex.directory import DirectoryClient

from conftest import wait_until
from py_data_plane import TcpDataPlane
from toy_engine import ToyEngine, reference_tokens

STAGES = 3
MODEL = "pyfail"
HERE = os.path.dirname(os.path.abspath(__file__))


class StageProcess:
    def __init__(self, directory, stage, replica, data_plane):
        self.lid = (MODEL, stage, 0, replica)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "pp_stage.py"), directory, MODEL, str(stage),
             str(STAGES), str(replica), "--data-plane", data_plane],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE)

    def wait_ready(self, timeout):
        # readline blocks: read it on a thread so that the wait has a deadline.
        line = []
        t = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        return bool(line) and line[0].startswith("ready")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(params=["tcp", "python"])
def cluster(request, server):
    """Stages 1 and 2 in two replicas, one process each; the owner (stage 0, replica 0) here."""
    data_plane = request.param
    procs = {}
    client = DirectoryClient(server.bind_addr)
    client.start()
    plane, node = None, None
    try:
        for stage in range(1, STAGES):
            for replica in range(2):
                procs[(stage, replica)] = StageProcess(server.bind_addr, stage, replica,
                                                       data_plane)
        for p in procs.values():
            assert p.wait_ready(30), f"{p.lid} did not start"
        if data_plane == "python":
            plane = TcpDataPlane()
            te = transport.from_python(plane, (MODEL, 0, 0, 0), plane.address)
        else:
            te = "tcp"
        node = connex.pp.StageNode(client, ToyEngine(0, STAGES), model=MODEL, stage=0,
                                   stages=STAGES, replica=0, step_timeout_ms=2000,
                                   probe_timeout_ms=500, transport=te)
        assert client.await_view(MODEL, 1 + len(procs), timeout=10)
        yield node, procs, plane
    finally:
        if node is not None:
            node.close()
        for p in procs.values():
            p.stop()
        client.close()
        if plane is not None:
            plane.close()


PROMPTS = {i: [(7 * i + j) % 60 for j in range(1 + i % 4)] for i in range(1, 7)}
NEW_TOKENS = 40


def generate(node, base_id, on_token=None):
    futures = {i: node.submit(base_id + i, p, NEW_TOKENS, on_token=on_token)
               for i, p in PROMPTS.items()}
    return {i: f.result(timeout=120) for i, f in futures.items()}


def test_sigkill_of_a_stage_process_mid_generation_keeps_every_token(cluster):
    node, procs, plane = cluster
    undisturbed = generate(node, 100)
    for i, p in PROMPTS.items():
        assert undisturbed[i] == reference_tokens(p, NEW_TOKENS, STAGES), i
    before = node.stats

    # The same requests again; the stage-1 process of the owner's own chain (replica 0) is
    # killed from the token callback once the first request has streamed 5 tokens, so every
    # request is mid-generation.
    victim = procs[(1, 0)]
    streamed = {}
    killed = threading.Event()

    def on_token(rid, token):
        streamed.setdefault(rid, []).append(token)
        if len(streamed[rid]) == 5 and not killed.is_set():
            killed.set()
            victim.kill()

    disturbed = generate(node, 200, on_token)
    assert killed.is_set()
    assert disturbed == undisturbed
    for i in PROMPTS:
        assert streamed[200 + i] == undisturbed[i]  # no token lost or repeated in the stream
    # The kill hit steps in flight: the owner moved its requests to the other replica.
    assert wait_until(lambda: node.stats["failovers"] > before["failovers"], 10), node.stats
    s = node.stats
    assert s["aborted"] == 0 and s["completed"] == 2 * len(PROMPTS)
    if plane is not None:
        assert plane.served > 0  # stage 1 read the owner's steps through the Python data plane
