"""A small deterministic numpy model split into pipeline stages, for the step protocol tests.

Each stage keeps, per request, its position count and a running float32 sum of its inputs (its
"KV cache"), and maps every token's input row through tanh(W_stage @ (h + mean so far)); the last
stage picks argmax(W_out @ h). Every token is computed alone, in order, with the same numpy
operations whether it comes in a prefill, a chunk or a decode step and whatever else shares the
step, so the model is batch-invariant and prefill/decode-invariant: a request recomputed after a
failover produces bit for bit the tokens of an undisturbed run. Weights come from a fixed seed, so
every process builds the same model.

Its state as data (export_state / import_state / drop_state) is the running sum after each
position, "sum" float32 [positions, DIM]: an engine that imports it continues bit for bit.
"""

import numpy as np

import connex
import connex.pp

VOCAB = 64
DIM = 16


class ToyEngine(connex.pp.Engine):
    def __init__(self, stage, stages, seed=7):
        rng = np.random.default_rng(seed)
        self.embed = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
        self.weights = [(rng.standard_normal((DIM, DIM)) / np.sqrt(DIM)).astype(np.float32)
                        for _ in range(stages)]
        self.head = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
        self.positions = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
        self.stage, self.stages = stage, stages
        self.state = {}  # request id -> (positions, running sum)
        self.sums = {}  # request id -> the running sum after each position (its state as data)
        self.steps = 0

    def _missing(self, tensors):
        return [int(r) for r, s in zip(tensors["request_ids"], tensors["start_positions"])
                if s != 0 and self.state.get(int(r), (-1, None))[0] != s]

    def missing_requests(self, tensors):
        return self._missing(tensors)

    def execute_step(self, tensors):
        missing = self._missing(tensors)
        if missing:
            raise connex.NotFound(f"stage {self.stage}: requests {missing} not held")
        first, last = self.stage == 0, self.stage + 1 == self.stages
        x = tensors["tokens"] if first else tensors["hidden"]
        w = self.weights[self.stage]
        rows, next_tokens, updates, row = [], [], {}, 0
        for rid, start, count in zip(tensors["request_ids"], tensors["start_positions"],
                                     tensors["num_tokens"]):
            rid = int(rid)
            pos, acc = (0, np.zeros(DIM, np.float32)) if start == 0 else self.state[rid]
            sums = [] if start == 0 else list(self.sums[rid])
            y = None
            for _ in range(int(count)):
                if first:
                    token = int(x[row])
                    if not 0 <= token < VOCAB:
                        raise connex.InvalidArgument(f"token {token} outside [0, {VOCAB})")
                    h = self.embed[token] + self.positions[pos % VOCAB]
                else:
                    h = x[row]
                acc = acc + h
                sums.append(acc)
                pos += 1
                y = np.tanh(w @ (h + acc / np.float32(pos))).astype(np.float32)
                rows.append(y)
                row += 1
            updates[rid] = (pos, acc, sums)
            if last:
                next_tokens.append(int(np.argmax(self.head @ y)))
        for rid, (pos, acc, sums) in updates.items():  # only once the whole step succeeded
            self.state[rid] = (pos, acc)
            self.sums[rid] = sums
        self.steps += 1
        if last:
            return {"next_tokens": np.array(next_tokens, np.int32)}
        return {"hidden": np.stack(rows) if rows else np.zeros((0, DIM), np.float32)}

    def holds_request(self, request_id):
        return request_id in self.state

    def release(self, request_id):
        self.state.pop(request_id, None)
        self.sums.pop(request_id, None)

    def num_held_requests(self):
        return len(self.state)

    def output_bytes_per_token(self):
        return DIM * 4

    def exports_state(self):
        return True

    def held_positions(self, request_id):
        return self.state.get(request_id, (0, None))[0]

    def export_state(self, request_id, start, end):
        held = self.held_positions(request_id)
        if not 0 <= start < end:
            raise connex.InvalidArgument(f"export of request {request_id}: [{start}, {end})")
        if end > held:
            raise IndexError(f"export of request {request_id}: [{start}, {end}) but {held} held")
        return {"sum": np.stack(self.sums[request_id][start:end])}

    def import_state(self, request_id, start, state):
        what = f"stage {self.stage}: import of request {request_id}"
        if set(state) != {"sum"}:
            raise connex.InvalidArgument(f"{what}: keys {sorted(state)}, expected ['sum']")
        rows = state["sum"]
        if rows.dtype != np.float32 or rows.ndim != 2 or rows.shape[1] != DIM or not len(rows):
            raise connex.InvalidArgument(f"{what}: 'sum' is {rows.dtype} {list(rows.shape)}, "
                                         f"expected float32 [rows >= 1, {DIM}]")
        held = self.held_positions(request_id)
        if start != 0 and held != start:
            raise connex.Fenced(f"{what}: the state starts at {start} but {held} are held")
        sums = ([] if start == 0 else self.sums[request_id]) + [r.copy() for r in rows]
        self.sums[request_id] = sums
        self.state[request_id] = (len(sums), sums[-1])

    def drop_state(self, request_id, start):
        if start == 0:
            self.release(request_id)
        elif self.held_positions(request_id) > start:
            self.sums[request_id] = self.sums[request_id][:start]
            self.state[request_id] = (start, self.sums[request_id][-1])


def reference_tokens(prompt, max_new_tokens, stages):
    """What an undisturbed pipeline of `stages` ToyEngines generates, run here token by token."""
    engines = [ToyEngine(s, stages) for s in range(stages)]
    tokens, out = list(prompt), []
    start, new = 0, list(prompt)
    while len(out) < max_new_tokens:
        t = {"request_ids": np.array([1], np.int64), "start_positions": np.array([start], np.int32),
             "num_tokens": np.array([len(new)], np.int32), "tokens": np.array(new, np.int32)}
        for e in engines:
            t = {**t, **e.execute_step(t)}
        token = int(t["next_tokens"][0])
        out.append(token)
        start += len(new)
        new = [token]
        tokens.append(token)
    return out
