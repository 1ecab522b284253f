#!/usr/bin/env python3
"""A float64 numpy forward pass of a Hugging Face Llama / Mistral / Qwen2 model directory.

Written from the transformers definitions (modeling_llama.py, modeling_qwen2.py,
modeling_mistral.py, modeling_rope_utils.py), independently of the engine, for
hf_reference_test.cc: RMSNorm, rotate-half RoPE with the rope_scaling types (llama3, linear,
dynamic), grouped-query attention with q/k/v(/o) biases and Mistral's sliding window, SwiGLU,
and an LM head that may be the tied embedding. It reads config.json and the safetensors files
(single or sharded through the index) itself.

Dynamic NTK scaling follows the engine's documented rule: the query and key at position p use
the base HF derives for a sequence of max(p + 1, max_position_embeddings) tokens (what HF computes
when it decodes token p as the last of its sequence).

usage: llama_reference.py MODEL_DIR TOKENS_FILE ROWS [--ablate rope_scaling|bias|window]
TOKENS_FILE holds a JSON list of token ids; prints {"logits": [...]}: the logits of the last ROWS
positions. --ablate drops one feature, to show that a test would notice its absence.
"""
import json
import math
import os
import struct
import sys

import numpy as np


def load_tensors(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            data = f.read()
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + length])
        base = 8 + length
        for tensor, info in header.items():
            if tensor == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            raw = data[base + begin:base + end]
            dtype = info["dtype"]
            if dtype == "F32":
                a = np.frombuffer(raw, "<f4")
            elif dtype == "F16":
                a = np.frombuffer(raw, "<f2")
            elif dtype == "BF16":
                a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                raise ValueError(f"{name}: tensor {tensor} has dtype {dtype}")
            tensors[tensor] = a.astype(np.float64).reshape(info["shape"])
    return tensors


def rope_type(cfg):
    scaling = cfg.get("rope_scaling")
    if not scaling:
        return None, None
    return scaling.get("rope_type", scaling.get("type")), scaling


def inverse_frequencies(cfg, head_dim, seq_len, ablate):
    base = cfg.get("rope_theta", 10000.0)
    kind, scaling = rope_type(cfg)
    if ablate == "rope_scaling":
        kind = None
    if kind == "dynamic":
        m = cfg["max_position_embeddings"]
        factor = scaling["factor"]
        seq = max(seq_len, m)
        base = base * ((factor * seq / m) - (factor - 1)) ** (head_dim / (head_dim - 2))
    inv = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if kind == "linear":
        inv = inv / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    return inv


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate(x, cos, sin):
    """Rotate-half RoPE of x [heads, head_dim] by the angles of one position."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def forward(cfg, w, tokens, ablate=None):
    d = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or d // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    window = cfg.get("sliding_window") if cfg["model_type"] == "mistral" else None
    if ablate == "window":
        window = None
    n = len(tokens)
    angles = []
    for p in range(n):
        angles.append(p * inverse_frequencies(cfg, hd, p + 1, ablate))
    cos = [np.cos(a) for a in angles]
    sin = [np.sin(a) for a in angles]

    def bias(name):
        if ablate == "bias" or name not in w:
            return 0.0
        return w[name]

    h = w["model.embed_tokens.weight"][tokens]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = x @ w[p + "self_attn.q_proj.weight"].T + bias(p + "self_attn.q_proj.bias")
        k = x @ w[p + "self_attn.k_proj.weight"].T + bias(p + "self_attn.k_proj.bias")
        v = x @ w[p + "self_attn.v_proj.weight"].T + bias(p + "self_attn.v_proj.bias")
        q = q.reshape(n, nh, hd)
        k = k.reshape(n, nkv, hd)
        v = v.reshape(n, nkv, hd)
        q = np.stack([rotate(q[t], cos[t], sin[t]) for t in range(n)])
        k = np.stack([rotate(k[t], cos[t], sin[t]) for t in range(n)])
        out = np.zeros((n, nh, hd))
        for t in range(n):
            first = max(0, t - window + 1) if window else 0
            for head in range(nh):
                kvh = head // (nh // nkv)
                scores = k[first:t + 1, kvh] @ q[t, head] / math.sqrt(hd)
                e = np.exp(scores - scores.max())
                out[t, head] = (e / e.sum()) @ v[first:t + 1, kvh]
        o = out.reshape(n, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = h + o + bias(p + "self_attn.o_proj.bias")
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate = x @ w[p + "mlp.gate_proj.weight"].T
        up = x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return rms_norm(h, w["model.norm.weight"], eps) @ head.T


def main():
    model_dir, tokens_file, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ablate = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--ablate" else None
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(tokens_file) as f:
        tokens = json.load(f)
    logits = forward(cfg, load_tensors(model_dir), tokens, ablate)
    json.dump({"logits": logits[-rows:].tolist()}, sys.stdout)


if __name__ == "__main__":
    main()
