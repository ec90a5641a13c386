"""A random-weight Llama-3.1-8B-shaped checkpoint in MLX's affine-quantized layout, made on the
GPU with PyTorch, for the GPU benchmarks (bench/run_gpu.sh). Every linear layer, the embedding
table and the output head are quantized with MLX's rule (float32 arithmetic; the larger-
magnitude end of each group is the bias and is hit exactly), codes packed as each row's
little-endian bit stream, scales and biases stored in bfloat16; norms are bfloat16 ones.
Tensors are generated and written one at a time, so host memory stays at one tensor.

    python3 bench/make_llama8b_q4.py OUT_DIR [--bits 4] [--group-size 64]
"""

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "reference"))
from make_fixtures import mlx_affine_quantize, pack_codes  # noqa: E402
from make_random_model import SHAPES  # noqa: E402


def quantize(w, bits, group_size):
    """w float32 [out, in] on the GPU -> codes (int64 [out, in]), scales, biases (float32
    [out, in / group_size]); the same arithmetic as mlx_affine_quantize in
    tools/reference/make_fixtures.py, in torch."""
    out, inn = w.shape
    g = w.reshape(out, inn // group_size, group_size)
    n_bins = float((1 << bits) - 1)
    w_min, w_max = g.amin(dim=-1), g.amax(dim=-1)
    min_is_edge = w_min.abs() > w_max.abs()
    scale = torch.clamp((w_max - w_min) / n_bins, min=1e-7)
    scale = torch.where(min_is_edge, scale, -scale)
    edge = torch.where(min_is_edge, w_min, w_max)
    q0 = torch.round(edge / scale)
    nonzero = q0 != 0
    scale = torch.where(nonzero, edge / torch.where(nonzero, q0, torch.ones_like(q0)), scale)
    bias = torch.where(nonzero, edge, torch.zeros_like(edge))
    q = torch.round((g - bias[..., None]) / scale[..., None])
    q = torch.clamp(q, 0, n_bins).to(torch.int64).reshape(out, inn)
    return q, scale, bias


def pack(q, bits):
    """Codes int64 [out, in] -> uint32 words [out, in * bits / 32] as numpy: each row one
    little-endian bit stream, code k at bits [k * bits, (k + 1) * bits)."""
    out, inn = q.shape
    planes = (q[:, :, None] >> torch.arange(bits, device=q.device)) & 1
    stream = planes.reshape(out, inn * bits // 32, 32)
    words = (stream << torch.arange(32, device=q.device)).sum(dim=-1)
    return words.to(torch.int64).cpu().numpy().astype(np.uint32)


def self_check(bits, group_size):
    """Compares the torch quantizer and packer with the numpy ones the fixtures (checked
    against transformers) were made with; prints the mismatches, which must be none."""
    w = torch.randn(96, 4 * group_size, device="cuda") * 0.02
    q, sc, bi = quantize(w, bits, group_size)
    rq, rsc, rbi = mlx_affine_quantize(w.cpu().numpy(), bits, group_size)
    bad_q = int((q.cpu().numpy() != rq.astype(np.int64)).sum())
    bad_s = int((sc.cpu().numpy() != rsc).sum() + (bi.cpu().numpy() != rbi).sum())
    bad_p = int((pack(q, bits) != pack_codes(rq, bits)).sum())
    print(f"self-check against numpy: {bad_q} codes, {bad_s} scales/biases, {bad_p} words differ")


def bf16_numpy(x):
    return x.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)


def plan(s, bits, group_size):
    """(name, dtype tag, shape, maker) for every tensor; makers run on the GPU when called."""
    h, hd = s["hidden"], s["head_dim"]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    entries = []

    def linear(prefix, rows, cols):
        cache = {}

        def make(part):
            if not cache:
                w = torch.randn(rows, cols, device="cuda", generator=gen) * 0.02
                q, sc, bi = quantize(w, bits, group_size)
                cache["weight"] = pack(q, bits)
                cache["scales"] = bf16_numpy(sc)
                cache["biases"] = bf16_numpy(bi)
            return cache.pop(part)

        entries.append((prefix + ".weight", "U32", (rows, cols * bits // 32),
                        lambda: make("weight")))
        entries.append((prefix + ".scales", "BF16", (rows, cols // group_size),
                        lambda: make("scales")))
        entries.append((prefix + ".biases", "BF16", (rows, cols // group_size),
                        lambda: make("biases")))

    def ones(name, n):
        entries.append((name, "BF16", (n,), lambda: bf16_numpy(torch.ones(n, device="cuda"))))

    linear("model.embed_tokens", s["vocab"], h)
    ones("model.norm.weight", h)
    if not s["tied"]:
        linear("lm_head", s["vocab"], h)
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        linear(p + "self_attn.q_proj", s["heads"] * hd, h)
        linear(p + "self_attn.k_proj", s["kv_heads"] * hd, h)
        linear(p + "self_attn.v_proj", s["kv_heads"] * hd, h)
        linear(p + "self_attn.o_proj", h, s["heads"] * hd)
        linear(p + "mlp.gate_proj", s["inter"], h)
        linear(p + "mlp.up_proj", s["inter"], h)
        linear(p + "mlp.down_proj", h, s["inter"])
        ones(p + "input_layernorm.weight", h)
        ones(p + "post_attention_layernorm.weight", h)
    return entries


ITEMSIZE = {"U32": 4, "BF16": 2}


def write(path, entries):
    """safetensors, tensors in plan order (weight before its scales and biases, so each
    tensor is made once); every offset is a multiple of 4 since sizes are even counts of
    2-byte values or 4-byte words."""
    header, off = {"__metadata__": {"format": "mlx"}}, 0
    for name, tag, shape, _ in entries:
        n = int(np.prod(shape)) * ITEMSIZE[tag]
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, tag, shape, make in entries:
            a = make()
            assert a.shape == tuple(shape) and a.itemsize == ITEMSIZE[tag], name
            f.write(np.ascontiguousarray(a).tobytes())
    return off


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    a = ap.parse_args()
    s = SHAPES[a.shape]
    self_check(a.bits, a.group_size)
    os.makedirs(a.out, exist_ok=True)
    n = write(os.path.join(a.out, "model.safetensors"), plan(s, a.bits, a.group_size))
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s["hidden"],
        "intermediate_size": s["inter"], "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"], "vocab_size": s["vocab"], "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": s["theta"], "rope_scaling": s["rope_scaling"],
        "tie_word_embeddings": s["tied"], "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
        "quantization": {"group_size": a.group_size, "bits": a.bits},
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"wrote {a.out}: {n / 1e9:.2f} GB of tensors, {a.bits}-bit group {a.group_size}")


if __name__ == "__main__":
    main()
