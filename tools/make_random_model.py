#!/usr/bin/env python3
"""A random-weight bf16 checkpoint shaped like a real model, for benchmarks (numpy only; runs
anywhere). Quantize it with `mlxcel quantize` for the MLX 4-bit benchmarks.

    /usr/bin/python3 tools/make_random_model.py llama-3.2-1b /tmp/llama1b-bf16
    build/bin/mlxcel quantize -m /tmp/llama1b-bf16 -o /tmp/llama1b-q4 --bits 4 --group-size 64
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))
from make_fixtures import bf16_bits, write_safetensors  # noqa: E402

SHAPES = {
    "llama-3.2-1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, inter=8192,
                         vocab=128256, tied=True, theta=500000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}),
    "llama-3.1-8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, inter=14336,
                         vocab=128256, tied=False, theta=500000.0,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}),
}


def main():
    name, out = sys.argv[1], sys.argv[2]
    s = SHAPES[name]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    h, hd = s["hidden"], s["head_dim"]

    def mat(rows, cols):
        return "BF16", bf16_bits(rng.standard_normal((rows, cols), dtype=np.float32) * 0.02)

    def ones(n):
        return "BF16", bf16_bits(np.ones(n, dtype=np.float32))

    t = {"model.embed_tokens.weight": mat(s["vocab"], h), "model.norm.weight": ones(h)}
    if not s["tied"]:
        t["lm_head.weight"] = mat(s["vocab"], h)
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = mat(s["heads"] * hd, h)
        t[p + "self_attn.k_proj.weight"] = mat(s["kv_heads"] * hd, h)
        t[p + "self_attn.v_proj.weight"] = mat(s["kv_heads"] * hd, h)
        t[p + "self_attn.o_proj.weight"] = mat(h, s["heads"] * hd)
        t[p + "mlp.gate_proj.weight"] = mat(s["inter"], h)
        t[p + "mlp.up_proj.weight"] = mat(s["inter"], h)
        t[p + "mlp.down_proj.weight"] = mat(h, s["inter"])
        t[p + "input_layernorm.weight"] = ones(h)
        t[p + "post_attention_layernorm.weight"] = ones(h)
    write_safetensors(os.path.join(out, "model.safetensors"), t)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": s["inter"], "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"], "head_dim": hd,
        "vocab_size": s["vocab"], "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": s["theta"], "rope_scaling": s["rope_scaling"],
        "tie_word_embeddings": s["tied"], "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


if __name__ == "__main__":
    main()
