"""Interpreter shutdown with live objects (servers, clients with callbacks, event iterators,
engines with registered arrays, peer sets, stage nodes running Python engines, threads blocked in
the API) neither hangs nor crashes: each scenario runs in its own interpreter, which must exit 0
within a deadline."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

SETUP = """
import threading, time
import numpy as np
import connex
from connex import transport
from connex.directory import DirectoryClient
from connex.directory_server import DirectoryServer
from connex.elastic import ElasticPeerSet

server = DirectoryServer("127.0.0.1:0", "127.0.0.1:0")
server.start()
holder = DirectoryClient(server.bind_addr, "demo", stage_idx=1, replica_idx=0)
holder.start()
engine = transport.tcp(("demo", 1, 0, 0))
array = np.arange(1 << 16, dtype=np.float64)
engine.register_memory(array)
managed = engine.allocate_managed_buffer(4096)
view = np.frombuffer(managed, dtype=np.uint8)
holder.register(addresses=engine.local_addresses)
watcher = DirectoryClient(server.bind_addr, "demo", stage_idx=0)
watcher.start()
watcher.watch("demo")
got = []
watcher.subscribe(lambda e: got.append(e))
stream = watcher.events()
owner_engine = transport.tcp(("demo", 0, 0, 0))
owner_engine.subscribe_peer_events(lambda e: got.append(e))
peers = ElasticPeerSet(watcher, owner_engine, stage_idx=1)
peers.start()
assert peers.wait_ready(1, 5)
"""

SCENARIOS = {
    "live objects": "",
    "a daemon thread blocked in an event iterator": """
        def consume():
            for event in stream:
                got.append(event)
        threading.Thread(target=consume, daemon=True).start()
        time.sleep(0.1)
    """,
    "callbacks firing while the interpreter exits": """
        def churn():
            r = 1
            try:
                while True:
                    holder.join(("demo", 1, 0, r % 4 + 1), ["tcp://127.0.0.1:9"])
                    r += 1
            except (connex.Error, RuntimeError):
                pass  # closed by the exit
        threading.Thread(target=churn, daemon=True).start()
        deadline = time.monotonic() + 5
        while len(got) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(got) >= 5, got
    """,
    "a pipeline of Python engines mid-generation": """
        import connex.pp
        from toy_engine import ToyEngine
        n1 = connex.pp.StageNode(watcher, ToyEngine(1, 2), model="pp", stage=1, stages=2,
                                 transport="tcp")
        n0 = connex.pp.StageNode(watcher, ToyEngine(0, 2), model="pp", stage=0, stages=2,
                                 transport="tcp")
        tokens = []
        future = n0.submit(1, [1, 2], 1000000, on_token=lambda r, t: tokens.append(t))
        deadline = time.monotonic() + 10
        while len(tokens) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(tokens) >= 20, tokens
    """,
    "a pipeline over a Python data plane mid-generation": """
        import connex.pp
        from py_data_plane import TcpDataPlane
        from toy_engine import ToyEngine
        planes = [TcpDataPlane(), TcpDataPlane()]
        nodes = [connex.pp.StageNode(watcher, ToyEngine(s, 2), model="pyd", stage=s, stages=2,
                                     transport=transport.from_python(planes[s], ("pyd", s, 0, 0),
                                                                     planes[s].address))
                 for s in (1, 0)]
        tokens = []
        future = nodes[1].submit(1, [1, 2], 1000000, on_token=lambda r, t: tokens.append(t))
        deadline = time.monotonic() + 10
        while len(tokens) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(tokens) >= 20, tokens
    """,
    "a daemon thread blocked in a slow directory call": """
        def slow():
            try:
                DirectoryClient("127.0.0.1:1", request_timeout_ms=5000).start()
            except connex.Error:
                pass
        threading.Thread(target=slow, daemon=True).start()
        time.sleep(0.1)
    """,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_exit_with_live_objects(name):
    script = SETUP + textwrap.dedent(SCENARIOS[name]) + "\nprint('exiting', flush=True)\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    assert "exiting" in proc.stdout
    assert "Fatal" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_explicit_close_then_exit():
    script = SETUP + textwrap.dedent("""
        peers.close(); stream.close(); watcher.close(); holder.deregister(); holder.close()
        del view; managed.free(); engine.close(); owner_engine.close(); server.stop()
        print('exiting', flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "exiting" in proc.stdout


@pytest.mark.parametrize("wait", ["for event in stream: pass", "inbox.receive()",
                                  "next(iter(stream))"])
def test_ctrl_c_interrupts_a_blocking_wait(wait):
    import signal

    script = textwrap.dedent(f"""
        import sys
        from connex.directory import DirectoryClient
        from connex.directory_server import DirectoryServer
        from connex.elastic import MessageInbox
        server = DirectoryServer(); server.start()
        client = DirectoryClient(server.bind_addr); client.start(); client.watch("demo")
        stream = client.events()
        inbox = MessageInbox()
        try:
            print("ready", flush=True)
            {wait}
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # into the wait (an earlier signal is caught as well, in print)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "interrupted" in out, err
    assert proc.returncode == 0, err
