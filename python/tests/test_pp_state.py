"""connex.pp: a Python engine's request state as data, through the C++ adapter the step protocol
uses (connex._connex._EngineAdapter): a toy engine that imports another's exported state continues
with exactly its outputs; errors come back with their codes; an engine without the calls gets the
contract's defaults."""

import numpy as np
import pytest

import connex
import connex.pp
from connex._connex import _EngineAdapter

from toy_engine import ToyEngine

STAGES = 2


def step(engines, rid, start, tokens):
    """Runs a step of request `rid` through `engines`; its last stage's output."""
    t = {"request_ids": np.array([rid], np.int64), "start_positions": np.array([start], np.int32),
         "num_tokens": np.array([len(tokens)], np.int32), "tokens": np.array(tokens, np.int32)}
    outputs = []
    for e in engines:
        out = e.execute_step(t)
        outputs.append(out)
        t = {**t, **out}
    return outputs


def generate(engines, rid, start, tokens, n):
    """n steps from `tokens` at `start`, each feeding back its token: (tokens, every output)."""
    got, outputs = [], []
    for _ in range(n):
        out = step(engines, rid, start, tokens)
        outputs.append(out)
        start += len(tokens)
        tokens = [int(out[-1]["next_tokens"][0])]
        got.append(tokens[0])
    return got, outputs


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for step_a, step_b in zip(x, y):
            assert step_a.keys() == step_b.keys()
            for key in step_a.keys() - {"request_ids"}:  # the importer's ids are its own
                assert step_a[key].dtype == step_b[key].dtype
                assert step_a[key].tobytes() == step_b[key].tobytes(), key


@pytest.mark.parametrize("cuts", [[0], [0, 3], [0, 2, 7]])
def test_an_imported_state_continues_with_the_exporters_outputs(cuts):
    a = [_EngineAdapter(ToyEngine(s, STAGES)) for s in range(STAGES)]
    b = [_EngineAdapter(ToyEngine(s, STAGES)) for s in range(STAGES)]
    assert all(e.exports_state() for e in a)
    prompt = [3, 14, 15, 9, 26, 5]
    tokens, _ = generate(a, 1, 0, prompt, 4)
    n = len(prompt) + 3  # the last token is not fed yet
    for ea, eb in zip(a, b):
        assert ea.held_positions(1) == n
        for start, end in zip(cuts, cuts[1:] + [n]):
            state = ea.export_state(1, start, end)
            assert state["sum"].shape == (end - start, 16)
            eb.import_state(7, start, state)  # the importer's id is its own
        assert eb.held_positions(7) == n
    more_a, out_a = generate(a, 1, n, [tokens[-1]], 5)
    more_b, out_b = generate(b, 7, n, [tokens[-1]], 5)
    assert more_a == more_b
    same(out_a, out_b)


def test_a_cut_back_state_reruns_to_the_same_outputs():
    a = [_EngineAdapter(ToyEngine(s, STAGES)) for s in range(STAGES)]
    prompt = [1, 2, 3, 4, 5]
    tokens, _ = generate(a, 1, 0, prompt, 3)
    n = len(prompt) + 2
    before = [e.export_state(1, 0, n) for e in a]
    _, first = generate(a, 1, n, [tokens[-1]], 3)
    for e, state in zip(a, before):
        e.drop_state(1, n)
        assert e.held_positions(1) == n
        assert e.export_state(1, 0, n)["sum"].tobytes() == state["sum"].tobytes()
    _, again = generate(a, 1, n, [tokens[-1]], 3)
    same(first, again)
    for e in a:
        e.drop_state(1, 0)
        assert not e.holds_request(1) and e.num_held_requests() == 0


def test_state_errors_keep_their_codes_and_change_nothing():
    a = _EngineAdapter(ToyEngine(0, STAGES))
    b = _EngineAdapter(ToyEngine(0, STAGES))
    step([a], 1, 0, [1, 2, 3, 4])
    with pytest.raises(connex.Error, match=r"\[0, 5\) but 4 held") as e:
        a.export_state(1, 0, 5)
    assert e.value.code == "OUT_OF_RANGE"
    with pytest.raises(connex.InvalidArgument):
        a.export_state(1, 2, 2)
    tail = a.export_state(1, 2, 4)
    with pytest.raises(connex.Fenced, match="starts at 2 but 0 are held"):
        b.import_state(9, 2, tail)
    assert b.held_positions(9) == 0 and not b.holds_request(9)
    with pytest.raises(connex.InvalidArgument, match="expected float32"):
        b.import_state(9, 0, {"sum": np.zeros((2, 15), np.float32)})
    with pytest.raises(connex.InvalidArgument, match="expected \\['sum'\\]"):
        b.import_state(9, 0, {**tail, "kv.9.k": np.zeros((2, 16), np.float32)})
    assert b.num_held_requests() == 0
    b.import_state(9, 0, a.export_state(1, 0, 2))
    b.import_state(9, 2, tail)
    assert b.export_state(9, 0, 4)["sum"].tobytes() == a.export_state(1, 0, 4)["sum"].tobytes()


class Minimal:
    """An engine with only the required calls."""

    def __init__(self):
        self.released = []

    def execute_step(self, tensors):
        return {}

    def holds_request(self, request_id):
        return False

    def release(self, request_id):
        self.released.append(request_id)

    def num_held_requests(self):
        return 0


class Base(connex.pp.Engine):
    """An engine that inherits connex.pp.Engine's state defaults."""

    execute_step = Minimal.execute_step
    holds_request = Minimal.holds_request
    num_held_requests = Minimal.num_held_requests

    def __init__(self):
        self.released = []

    def release(self, request_id):
        self.released.append(request_id)


@pytest.mark.parametrize("engine_type", [Minimal, Base])
def test_an_engine_without_state_calls_gets_the_defaults(engine_type):
    engine = engine_type()
    e = _EngineAdapter(engine)
    assert not e.exports_state()
    assert e.held_positions(1) == 0
    for call in (lambda: e.export_state(1, 0, 1), lambda: e.import_state(1, 0, {}),
                 lambda: e.drop_state(1, 3)):
        with pytest.raises(connex.Error) as error:
            call()
        assert error.value.code == "UNIMPLEMENTED"
    e.drop_state(5, 0)  # as release
    assert engine.released == [5]


def test_an_engine_that_says_it_exports_state_needs_the_calls():
    class Half(Minimal):
        def exports_state(self):
            return True

        def held_positions(self, request_id):
            return 0

    with pytest.raises(TypeError, match="has no method export_state"):
        _EngineAdapter(Half())
