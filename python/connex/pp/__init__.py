"""The step protocol: a pipeline stage (``StageNode``) running an engine written in Python.

An engine implements the engine contract (``connex/pp/engine.h``,
``docs/design/engine-contract.md``) over dicts of numpy arrays; subclass :class:`Engine`::

    class MyEngine(connex.pp.Engine):
        def execute_step(self, tensors): ...      # {"request_ids", "start_positions",
        def holds_request(self, request_id): ...  #  "num_tokens", "tokens" | "hidden", ...}
        def release(self, request_id): ...
        def num_held_requests(self): ...

    node = connex.pp.StageNode(directory_client, MyEngine(), model="m", stage=0, stages=2)
    tokens = node.submit(1, [5, 6, 7], max_new_tokens=8).result(timeout=30)

Stage 0 owns the requests submitted to it: it routes their steps through the other stages'
replicas (found in the directory), and when a stage dies it re-sends the steps to another replica,
which recomputes the request (a step at start position 0 with the prompt plus the tokens so far).
"""

import abc

from connex._connex import Sampling, StageNode, StageNodeOptions  # noqa: F401

# Keys of a step's tensor dict (engine.h).
REQUEST_IDS = "request_ids"  # int64 [B]
START_POSITIONS = "start_positions"  # int32 [B]
NUM_TOKENS = "num_tokens"  # int32 [B]
TOKENS = "tokens"  # int32 [N], first stage's input
NEXT_TOKENS = "next_tokens"  # int32 [B], last stage's output


class Engine(abc.ABC):
    """The engine contract, over dicts of numpy arrays (``{name: numpy.ndarray}``).

    The node calls one engine from one thread (its loop thread, with the GIL held), never runs the
    same step twice on a stage, and sends a request either from position 0 (start afresh: drop
    any state held for it first; this is how a request is recomputed after a failover, possibly
    in several chunks) or at exactly the positions the engine holds. Every step carries the batch
    keys ``request_ids`` (int64 [B]), ``start_positions`` (int32 [B]) and ``num_tokens`` (int32
    [B]); the first stage also gets ``tokens`` (int32 [N], N = sum of num_tokens), later stages
    whatever the previous stage returned. Every returned tensor must have N or B rows; the last
    stage returns ``next_tokens`` (int32 [B]). Batch keys and ``sampling.*`` keys missing from
    the result are copied from the input. Dtypes: float32, float16, int32, int64.

    For exact failover (a recomputed request produces the tokens of an undisturbed run) the
    engine must be batch-invariant and prefill/decode-invariant.
    """

    @abc.abstractmethod
    def execute_step(self, tensors):
        """Runs one step and returns the output dict. Raise :class:`connex.NotFound` when a
        request's state is not held (nothing may be modified then), :class:`connex.InvalidArgument`
        for malformed input; any other exception fails the step as INTERNAL."""

    def missing_requests(self, tensors):
        """Ids of the requests of ``tensors`` whose state is not held at their start position
        (default: those with start position > 0 for which ``holds_request`` is false)."""
        return [int(i) for i, s in zip(tensors[REQUEST_IDS], tensors[START_POSITIONS])
                if s != 0 and not self.holds_request(int(i))]

    @abc.abstractmethod
    def holds_request(self, request_id):
        """Whether the engine holds state for ``request_id``."""

    @abc.abstractmethod
    def release(self, request_id):
        """Drops a finished, aborted or moved request's state (no-op when not held)."""

    @abc.abstractmethod
    def num_held_requests(self):
        """How many requests' state the engine holds now."""

    def output_bytes_per_token(self):
        """An upper bound of the bytes the output grows by per token (0: unknown). Read once,
        when the node starts."""
        return 0

    # ---- A request's state as data (optional; a KV standby needs it) ----
    # docs/design/engine-contract.md, "State as data": an engine that implements these can hand a
    # request's state to an engine of the same stage of the same model, which then produces
    # exactly the outputs the exporter would have. The arrays are the engine's own (only such an
    # engine reads them); the node copies them, so the engine keeps nothing it exported.

    def exports_state(self):
        """Whether ``export_state``, ``import_state`` and ``drop_state`` are implemented (default
        False: the node does not call them). Read once, when the node starts."""
        return False

    def held_positions(self, request_id):
        """Positions of the request's state held now; 0 when none."""
        return 0

    def export_state(self, request_id, start, end):
        """The request's state for positions [start, end) (0 <= start < end <= held_positions),
        as ``{name: numpy.ndarray}`` of the engine's own naming, each with end - start rows (one
        per position). Raise ``IndexError`` when fewer than ``end`` positions are held."""
        raise NotImplementedError(f"{type(self).__name__} does not export request state")

    def import_state(self, request_id, start, state):
        """Appends ``state`` (what ``export_state`` of an engine of the same stage and model
        returned for positions [start, start + rows)) to the request's state, which must hold
        exactly ``start`` positions (0: start afresh, dropping what is held): else raise
        :class:`connex.Fenced` (FAILED_PRECONDITION); :class:`connex.InvalidArgument` names a
        missing or malformed array. On error nothing may change."""
        raise NotImplementedError(f"{type(self).__name__} does not import request state")

    def drop_state(self, request_id, start):
        """Cuts the request's state back to its first ``start`` positions (0: as ``release``), so
        that its next step may start there; no-op when no more are held."""
        if start == 0:
            self.release(request_id)
            return
        raise NotImplementedError(f"{type(self).__name__} cannot cut request state back")


__all__ = [
    "Engine",
    "NEXT_TOKENS",
    "NUM_TOKENS",
    "REQUEST_IDS",
    "START_POSITIONS",
    "Sampling",
    "StageNode",
    "StageNodeOptions",
    "TOKENS",
]
