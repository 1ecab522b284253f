"""connex.StageEngine: the reference engine loaded from a checkpoint in the Hugging Face layout
(random weights in Llama 3.2's shapes, its real tokenizer files beside them) — its config, a step
by hand on numpy arrays, clear errors, and a two-stage pipeline of StageNodes running it natively,
whose tokens equal connex-generate's."""

import json
import os
import subprocess

import numpy as np
import pytest

import connex
from connex.directory import DirectoryClient
from connex.pp import StageNode

PROMPT = [128000, 9906, 11, 1917, 0, 358, 1097]


def _bin(name):
    bin_dir = os.environ.get("CONNEX_BIN_DIR")
    path = os.path.join(bin_dir or "", name)
    if not bin_dir or not os.path.exists(path):
        pytest.skip(f"{name} (CONNEX_BIN_DIR) is needed")
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("hf") / "llama")
    subprocess.run([_bin("connex-mkmodel"), "--hf", d, "--config", "llama-3.2-1b", "--layers", "2",
                    "--dim", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
                    "--shard-size", "4M", "--log-level", "warn"], check=True)
    return d


def reference(model_dir, prompt, max_tokens):
    # Greedy, as the steps below: not the sampling defaults of the model's generation_config.json.
    out = subprocess.run([_bin("connex-generate"), "--model", model_dir, "--prompt-tokens",
                          ",".join(map(str, prompt)), "--max-tokens", str(max_tokens),
                          "--ignore-eos", "--json", "--log-level", "warn",
                          "--generation-config", "none"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[0])["tokens"]


def step(request_id, start, tokens):
    return {"request_ids": np.array([request_id], np.int64),
            "start_positions": np.array([start], np.int32),
            "num_tokens": np.array([len(tokens)], np.int32),
            "tokens": np.array(tokens, np.int32)}


def test_config_and_a_step_by_hand(model_dir):
    e = connex.StageEngine.load(model_dir, threads=1)
    assert (e.stage, e.stages) == (0, 1)
    c = e.config
    assert c["model_type"] == "llama" and c["vocab_size"] == 128256 and c["num_hidden_layers"] == 2
    assert c["bos_token_id"] == 128000 and 128009 in c["eos_token_ids"]
    assert c["tie_word_embeddings"] is True
    assert "2 layers" in repr(e)
    want = reference(model_dir, PROMPT, 4)
    out = e.execute_step(step(7, 0, PROMPT))
    got = [int(out["next_tokens"][0])]
    for _ in range(3):
        out = e.execute_step(step(7, len(PROMPT) + len(got) - 1, [got[-1]]))
        got.append(int(out["next_tokens"][0]))
    assert got == want
    assert e.holds_request(7) and e.num_held_requests() == 1
    # Without the state of request 8, a step from position 3 is reported missing.
    assert e.missing_requests(step(8, 3, [5])) == [8]
    e.release(7)
    assert not e.holds_request(7) and e.num_held_requests() == 0


def test_bad_input_is_named(model_dir, tmp_path):
    with pytest.raises(connex.NotFound):
        connex.StageEngine.load(str(tmp_path / "nothing-here"))
    with pytest.raises(connex.InvalidArgument, match="stage"):
        connex.StageEngine.load(model_dir, stage=2, stages=2)
    with pytest.raises(connex.InvalidArgument, match="threads"):
        connex.StageEngine.load(model_dir, threads=-1)
    e = connex.StageEngine.load(model_dir, threads=1)
    with pytest.raises(connex.InvalidArgument, match="'start_positions' is missing"):
        e.execute_step({"request_ids": np.array([1], np.int64)})
    with pytest.raises(connex.InvalidArgument, match="'tokens' has dtype"):
        e.execute_step(dict(step(1, 0, [1]), tokens=np.array([1.5], np.float64)))


def test_a_pipeline_of_native_engines_equals_connex_generate(server, model_dir):
    client = DirectoryClient(server.bind_addr)
    client.start()
    try:
        engines = [connex.StageEngine.load(model_dir, stage=s, stages=2, threads=1)
                   for s in (0, 1)]
        n1 = StageNode(client, engines[1], model="hf", stage=1, stages=2, transport="tcp")
        n0 = StageNode(client, engines[0], model="hf", stage=0, stages=2, transport="tcp")
        try:
            assert n0.engine is engines[0]
            prompts = [PROMPT, PROMPT[:3], [128000, 40, 1093, 279]]
            futures = [n0.submit(i, p, 8) for i, p in enumerate(prompts)]
            for f, p in zip(futures, prompts):
                assert f.result(timeout=60) == reference(model_dir, p, 8)
            # The node's loop is the engine's only caller now.
            with pytest.raises(connex.Fenced, match="StageNode runs this engine"):
                engines[1].num_held_requests()
            with pytest.raises(connex.Fenced, match="runs it already"):
                StageNode(client, engines[1], model="hf2", stage=1, stages=2, transport="tcp")
        finally:
            n0.close()
            n1.close()
    finally:
        client.close()
