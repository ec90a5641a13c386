#!/usr/bin/env python3
"""A random-weight bf16 checkpoint shaped like a real model, for benchmarks (numpy only; runs
anywhere). Quantize it with `mlxcel quantize` for the MLX 4-bit benchmarks, or make the 4-bit
checkpoint directly on a GPU with bench/make_random_q4.py. SHAPES are the real models' shapes
and configs; `tensors` and `config` are each shape's tensor table and config.json, which both
scripts write.

    /usr/bin/python3 tools/make_random_model.py llama-3.2-1b /tmp/llama1b-bf16
    build/bin/mlxcel quantize -m /tmp/llama1b-bf16 -o /tmp/llama1b-q4 --bits 4 --group-size 64
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))
from make_fixtures import bf16_bits, write_safetensors  # noqa: E402

LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}

SHAPES = {
    "llama-3.2-1b": dict(family="llama", hidden=2048, layers=16, heads=32, kv_heads=8,
                         head_dim=64, inter=8192, vocab=128256, tied=True, theta=500000.0,
                         rope_scaling=dict(LLAMA3_ROPE, factor=32.0)),
    "llama-3.1-8b": dict(family="llama", hidden=4096, layers=32, heads=32, kv_heads=8,
                         head_dim=128, inter=14336, vocab=128256, tied=False, theta=500000.0,
                         rope_scaling=dict(LLAMA3_ROPE, factor=8.0)),
    # Gemma 3 4B's text model: five local layers (window 1024, RoPE base 10000) to one global
    # (base 1e6, linear scaling 8), per-head q/k norms, norms stored as w of (1 + w).
    "gemma-3-4b": dict(family="gemma3_text", hidden=2560, layers=34, heads=8, kv_heads=4,
                       head_dim=256, inter=10240, vocab=262208, tied=True, theta=1000000.0,
                       rope_scaling={"rope_type": "linear", "factor": 8.0},
                       local_theta=10000.0, window=1024, pattern=6),
    # Phi-4-mini: fused qkv and gate_up, longrope over 3/4 of each head (48 factor pairs; the
    # factors here are 1, which changes the table's values, not the cost), a sliding_window
    # past the context (none), tied embeddings.
    "phi-4-mini": dict(family="phi3", hidden=3072, layers=32, heads=24, kv_heads=8,
                       head_dim=128, inter=8192, vocab=200064, tied=True, theta=10000.0,
                       rotary=0.75, window=262144,
                       rope_scaling={"type": "longrope", "long_factor": [1.0] * 48,
                                     "short_factor": [1.0] * 48}),
}

# Each family in miniature, for checking these scripts and the loaders on any machine (a CPU
# and torch's CPU device): the real shape's layout and config at a few MB.
SHAPES.update({
    f"tiny-{name}": dict(SHAPES[name], hidden=128, inter=256, vocab=512, **kw)
    for name, kw in [("llama-3.1-8b", dict(layers=2, heads=4, kv_heads=2, head_dim=32)),
                     ("gemma-3-4b", dict(layers=6, heads=2, kv_heads=1, window=16)),
                     ("phi-4-mini", dict(layers=2, heads=3, kv_heads=1))]
})


def tensors(s):
    """(name, shape, fill) for every tensor of shape s in its family's layout, in file order:
    fill None for a random matrix (a linear layer or the embedding), else the constant a norm
    holds (1, or 0 where the family scales by 1 + w)."""
    h, hd, fam = s["hidden"], s["head_dim"], s["family"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    one = 0.0 if fam == "gemma3_text" else 1.0
    t = [("model.embed_tokens", (s["vocab"], h), None), ("model.norm.weight", (h,), one)]
    if not s["tied"]:
        t.append(("lm_head", (s["vocab"], h), None))
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        if fam == "phi3":
            t.append((p + "self_attn.qkv_proj", (q + 2 * kv, h), None))
        else:
            t += [(p + "self_attn.q_proj", (q, h), None), (p + "self_attn.k_proj", (kv, h), None),
                  (p + "self_attn.v_proj", (kv, h), None)]
        t.append((p + "self_attn.o_proj", (h, q), None))
        if fam == "gemma3_text":
            t += [(p + "self_attn.q_norm.weight", (hd,), one),
                  (p + "self_attn.k_norm.weight", (hd,), one)]
        if fam == "phi3":
            t.append((p + "mlp.gate_up_proj", (2 * s["inter"], h), None))
        else:
            t += [(p + "mlp.gate_proj", (s["inter"], h), None),
                  (p + "mlp.up_proj", (s["inter"], h), None)]
        t.append((p + "mlp.down_proj", (h, s["inter"]), None))
        norms = ["input_layernorm", "post_attention_layernorm"]
        if fam == "gemma3_text":
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        t += [(p + n + ".weight", (h,), one) for n in norms]
    return t


def config(s):
    """config.json of shape s, as its family's checkpoints write it (quantization aside)."""
    fam = s["family"]
    c = {
        "model_type": fam, "hidden_size": s["hidden"], "intermediate_size": s["inter"],
        "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"], "head_dim": s["head_dim"],
        "vocab_size": s["vocab"], "max_position_embeddings": 131072, "rope_theta": s["theta"],
        "rope_scaling": s["rope_scaling"], "tie_word_embeddings": s["tied"],
        "torch_dtype": "bfloat16",
    }
    if fam == "llama":
        c.update(architectures=["LlamaForCausalLM"], rms_norm_eps=1e-5, bos_token_id=128000,
                 eos_token_id=[128001, 128008, 128009])
    elif fam == "gemma3_text":
        c.update(architectures=["Gemma3ForCausalLM"], rms_norm_eps=1e-6, bos_token_id=2,
                 eos_token_id=[1, 106], hidden_activation="gelu_pytorch_tanh",
                 query_pre_attn_scalar=256, sliding_window=s["window"],
                 sliding_window_pattern=s["pattern"], rope_local_base_freq=s["local_theta"])
    elif fam == "phi3":
        c.update(architectures=["Phi3ForCausalLM"], rms_norm_eps=1e-5, bos_token_id=199999,
                 eos_token_id=[200020, 199999], hidden_act="silu",
                 partial_rotary_factor=s["rotary"], sliding_window=s["window"],
                 original_max_position_embeddings=4096)
    return c


def main():
    name, out = sys.argv[1], sys.argv[2]
    s = SHAPES[name]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    t = {}
    for tname, shape, fill in tensors(s):
        if fill is None:
            x = rng.standard_normal(shape, dtype=np.float32) * 0.02
            tname += ".weight"
        else:
            x = np.full(shape, fill, dtype=np.float32)
        t[tname] = "BF16", bf16_bits(x)
    write_safetensors(os.path.join(out, "model.safetensors"), t)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config(s), f, indent=2)


if __name__ == "__main__":
    main()
