"""connex.pp: StageNode with Python (numpy) engines in one process — options, bad input, tokens
equal to an undisturbed run, streaming callbacks, cancel, stats, health."""

import threading

import numpy as np
import pytest

import connex
import connex.pp
from connex import transport
from connex.directory import DirectoryClient
from connex.pp import StageNode, StageNodeOptions

from conftest import wait_until
from toy_engine import ToyEngine, reference_tokens


@pytest.fixture
def client(server):
    c = DirectoryClient(server.bind_addr)
    c.start()
    yield c
    c.close()


@pytest.fixture
def pipeline(client):
    """A 2-stage pipeline of model 'm' in this process: (owner, stage 1)."""
    n1 = StageNode(client, ToyEngine(1, 2), model="m", stage=1, stages=2, transport="tcp")
    n0 = StageNode(client, ToyEngine(0, 2), model="m", stage=0, stages=2, transport="tcp")
    yield n0, n1
    n0.close()
    n1.close()


def test_options():
    o = StageNodeOptions(model="m", stage=1, stages=3, inflight=2)
    assert (o.model, o.stage, o.stages, o.replica, o.inflight) == ("m", 1, 3, 0, 2)
    assert o.step_timeout_ms == 5000 and o.reprefill_max == 8
    with pytest.raises(TypeError, match="no option 'stagez'"):
        StageNodeOptions(model="m", stagez=1)
    with pytest.raises(connex.InvalidArgument):
        StageNodeOptions(model="m", stage=3, stages=2).validate()
    # KV standby and prefill-decode roles (docs/design/pd.md).
    o = StageNodeOptions(model="m", stage=1, stages=2, kv_standby=True, pd_role="decode")
    assert o.kv_standby and o.pd_role == "decode" and o.pd_retain_ms == 30000
    o.validate()
    with pytest.raises(connex.InvalidArgument, match="'prefil'"):
        StageNodeOptions(model="m", pd_role="prefil")
    with pytest.raises(connex.InvalidArgument, match="decode"):
        StageNodeOptions(model="m", stage=0, stages=2, pd_role="decode").validate()


def test_options_from_env(monkeypatch):
    monkeypatch.setenv("CONNEX_PP_INFLIGHT", "3")
    assert StageNodeOptions(model="m").from_env().inflight == 3
    monkeypatch.setenv("CONNEX_PP_INFLIGHT", "many")
    with pytest.raises(connex.InvalidArgument, match="CONNEX_PP_INFLIGHT"):
        StageNodeOptions(model="m").from_env()


def test_bad_engine_and_transport(client):
    class NoRelease:
        def execute_step(self, t):
            return t

        def holds_request(self, i):
            return False

        def num_held_requests(self):
            return 0

    with pytest.raises(TypeError, match="no method release"):
        StageNode(client, NoRelease(), model="m", stages=1)
    with pytest.raises(TypeError, match="transport must be"):
        StageNode(client, ToyEngine(0, 1), model="m", stages=1, transport=42)
    with pytest.raises(connex.InvalidArgument, match="belongs to other/g0/s0/r0"):
        StageNode(client, ToyEngine(0, 1), model="m", stages=1,
                  transport=transport.tcp(("other", 0, 0, 0)))
    with pytest.raises(connex.InvalidArgument):
        StageNode(client, ToyEngine(0, 1), model="m", stage=2, stages=2)
    with pytest.raises(TypeError, match="not both"):
        StageNode(client, ToyEngine(0, 1), StageNodeOptions(model="m"), stages=1)
    with pytest.raises(TypeError, match="abstract"):
        connex.pp.Engine()


def test_tokens_equal_an_undisturbed_run(pipeline):
    n0, n1 = pipeline
    assert n0.lid == ("m", 0, 0, 0) and n1.lid == ("m", 1, 0, 0)
    assert n0.epoch > 0 and n0.health() is None
    prompts = {i: [1 + i, 2, 3 + 2 * i][: 1 + i % 3] for i in range(8)}
    streamed = {i: [] for i in prompts}
    done = {}
    futures = {i: n0.submit(i, p, 12, done=lambda r, i=i: done.__setitem__(i, r),
                            on_token=lambda rid, t: streamed[rid].append(t))
               for i, p in prompts.items()}
    for i, p in prompts.items():
        want = reference_tokens(p, 12, 2)
        assert futures[i].result(timeout=30) == want
        assert streamed[i] == want
    assert wait_until(lambda: len(done) == len(prompts), 5)
    assert all(done[i] == futures[i].result() for i in prompts)
    assert wait_until(lambda: n0.stats["completed"] == len(prompts), 5)
    assert wait_until(lambda: n1.engine.num_held_requests() == 0 and
                      n0.engine.num_held_requests() == 0, 5)
    s = n1.stats
    assert s["steps_executed"] > 0 and s["fenced"] == 0 and isinstance(s["epochs"], list)


def test_submit_bad_input(pipeline):
    n0, n1 = pipeline
    with pytest.raises(connex.InvalidArgument):
        n0.submit(1, [], 4)
    with pytest.raises(connex.Fenced):
        n1.submit(1, [1], 4)
    with pytest.raises(TypeError):
        n0.submit(1, "abc", 4)
    with pytest.raises(connex.InvalidArgument):
        connex.pp.Sampling(temperature=5)
    with pytest.raises(connex.NotFound):
        n0.cancel(12345)


def test_an_engine_error_ends_the_request_with_it(pipeline):
    n0, _ = pipeline
    f = n0.submit(7, [1, 999], 4)  # token 999 is outside the toy vocabulary
    with pytest.raises(connex.Error) as e:
        f.result(timeout=60)
    assert "999" in str(e.value)


def test_cancel_from_a_token_callback(pipeline):
    n0, _ = pipeline
    got = []

    def on_token(rid, token):
        got.append(token)
        if len(got) == 3:
            n0.cancel(rid, "enough")

    f = n0.submit(3, [4, 5], 1000, on_token=on_token)
    with pytest.raises(connex.Cancelled, match="enough"):
        f.result(timeout=30)
    assert len(got) == 3


def test_generation_progresses_while_a_python_thread_spins(pipeline):
    """The engines need the GIL (they are Python), so a thread that never released it would stall
    the nodes; a busy pure-Python thread, which the interpreter preempts every switch interval,
    must not starve them nor their callbacks."""
    n0, _ = pipeline
    tokens = []
    stop = threading.Event()

    def spin():  # pure-Python loop: holds the GIL except at the interpreter's switch points
        x = 0
        while not stop.is_set():
            x += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        f = n0.submit(9, [3, 1], 6, on_token=lambda r, tok: tokens.append(tok))
        assert f.result(timeout=30) == reference_tokens([3, 1], 6, 2) == tokens
    finally:
        stop.set()
        t.join()


def test_close_ends_unfinished_requests(client):
    n1 = StageNode(client, ToyEngine(1, 2), model="c", stage=1, stages=2, transport="tcp")
    n0 = StageNode(client, ToyEngine(0, 2), model="c", stage=0, stages=2, transport="tcp")
    n1.stop()  # a stage that does not answer: the owner's request cannot finish
    f = n0.submit(1, [1], 5)
    n0.close()
    with pytest.raises(connex.Cancelled):
        f.result(timeout=10)
    with pytest.raises(RuntimeError, match="closed"):
        n0.submit(2, [1], 5)
    n1.close()


def test_numpy_dtypes_cross_stages(client):
    """Every dtype numpy and the protocol share survives a stage boundary unchanged."""
    seen = {}

    class First(ToyEngine):
        def execute_step(self, t):
            out = super().execute_step(t)
            n = len(t["tokens"])
            out.update({"f16": np.full((n, 2), 1.5, np.float16),
                        "i64": np.arange(n, dtype=np.int64) + 2**40,
                        "i32": np.arange(n, dtype=np.int32)})
            return out

    class Last(ToyEngine):
        def execute_step(self, t):
            seen.update({k: (v.dtype, v.shape) for k, v in t.items()})
            return super().execute_step(t)

    n1 = StageNode(client, Last(1, 2), model="d", stage=1, stages=2, transport="tcp")
    n0 = StageNode(client, First(0, 2), model="d", stage=0, stages=2, transport="tcp")
    assert n0.submit(1, [1, 2], 2).result(timeout=30) == reference_tokens([1, 2], 2, 2)
    assert seen["f16"] == (np.float16, (1, 2)) and seen["i64"][0] == np.int64
    assert seen["hidden"][0] == np.float32 and seen["request_ids"][0] == np.int64
    n0.close()
    n1.close()


def test_migrate_moves_the_signals_under_the_same_lid(pipeline, client):
    n0, n1 = pipeline
    assert n0.submit(1, [1, 2], 6).result(timeout=30) == reference_tokens([1, 2], 6, 2)
    before = client.resolve(n1.lid)
    n1.migrate()
    after = client.resolve(n1.lid)
    assert n1.lid == ("m", 1, 0, 0) and n1.health() is None
    assert after.addresses != before.addresses and n1.epoch == after.epoch
    # The owner follows the MIGRATED event to the new address.
    assert n0.submit(2, [3], 6).result(timeout=30) == reference_tokens([3], 6, 2)


def test_migrate_keeps_curve(tmp_path):
    # A deployment with one CURVE key pair (connexctl keygen): the directory, the clients and the
    # nodes' signals use it; a migrated node's new signal address must be a CURVE one too (it
    # used to come back in clear, which its CURVE peers refuse to talk to).
    import os
    import subprocess

    from connex.directory_server import DirectoryServer

    bin_dir = os.environ.get("CONNEX_BIN_DIR")
    if not bin_dir or not os.path.exists(os.path.join(bin_dir, "connexctl")):
        pytest.skip("connexctl (CONNEX_BIN_DIR) is needed to make the key pair")
    prefix = str(tmp_path / "deploy")
    subprocess.run([os.path.join(bin_dir, "connexctl"), "keygen", "--out", prefix], check=True,
                   capture_output=True)
    key = prefix + ".key"
    with DirectoryServer(curve_key_file=key) as server:
        c = DirectoryClient(server.bind_addr, curve_key_file=key)
        c.start()
        n1 = StageNode(c, ToyEngine(1, 2), model="cm", stage=1, stages=2, transport="tcp")
        n0 = StageNode(c, ToyEngine(0, 2), model="cm", stage=0, stages=2, transport="tcp")
        try:
            assert n0.submit(1, [1, 2], 6).result(timeout=30) == reference_tokens([1, 2], 6, 2)
            signal = [a for a in c.resolve(n1.lid).addresses if a.startswith("pp+")]
            assert signal and "?curve=" in signal[0]
            n1.migrate()
            moved = [a for a in c.resolve(n1.lid).addresses if a.startswith("pp+")]
            assert moved and moved != signal and "?curve=" in moved[0]
            assert n0.submit(2, [3], 6).result(timeout=30) == reference_tokens([3], 6, 2)
        finally:
            n0.close()
            n1.close()
            c.close()


@pytest.mark.parametrize("bad,message", [
    (lambda t: {"hidden": np.zeros((len(t["tokens"]), 4), np.float64)}, "dtype float64"),
    (lambda t: [1, 2, 3], "not a dict|expected a dict"),
    (lambda t: {"hidden": "text"}, "'hidden' has dtype <U4"),
    (lambda t: {"hidden": object()}, "'hidden' has dtype object"),
    (lambda t: {7: np.zeros(1, np.int32)}, "key is a int"),
])
def test_a_malformed_engine_result_ends_the_request_with_a_named_error(client, bad, message):
    class Bad(ToyEngine):
        def execute_step(self, t):
            return bad(t)

    n1 = StageNode(client, ToyEngine(1, 2), model="bad", stage=1, stages=2, transport="tcp")
    n0 = StageNode(client, Bad(0, 2), model="bad", stage=0, stages=2, transport="tcp",
                   attempt_max=2)
    with pytest.raises(connex.Error, match=message):
        n0.submit(1, [1, 2], 3).result(timeout=60)
    n0.close()
    n1.close()
