"""Random-weight mixture-of-experts checkpoints for the GPU benchmarks (bench/run_gpu.sh), in
the layout and quantization of the mlx-community checkpoints they stand for, made with
PyTorch on the GPU:

  qwen3-30b-a3b  Qwen3-30B-A3B-4bit: 48 layers, hidden 2048, 32 heads / 4 KV heads of 128, q/k
                 norm, 128 experts (top 8) of intermediate 768 stacked per layer, vocab 151936;
                 everything affine 4-bit group 64 but the routers (mlp.gate), 8-bit group 64.
  gpt-oss-20b    gpt-oss-20b-MXFP4-Q8: 24 layers, hidden 2880, 64 heads / 8 KV heads of 64,
                 sliding window 128 on every other layer, attention sinks, biases on q/k/v/o,
                 router and experts, 32 experts (top 4) of intermediate 2880, vocab 201088; the
                 experts MXFP4, everything else affine 8-bit group 64.

Affine codes follow MLX's rule (tools/reference/make_fixtures.py), MXFP4 MLX's GPU kernel
(tools/reference/make_moe_fixtures.py); both are checked against those numpy references
first. Weights are normal(0, 0.02), norms ones; routers are random too, so tokens spread over
the experts about evenly. Tensors are made and written one at a time (host memory stays at
one stacked expert tensor). --tiny writes the same structure at a few MB, to try the script
and the loader on any machine (--device cpu without a GPU).

    python3 bench/make_moe_q4.py OUT_DIR --shape qwen3-30b-a3b|gpt-oss-20b [--tiny] [--device cuda]
"""

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "reference"))
from make_fixtures import mlx_affine_quantize, pack_codes  # noqa: E402
from make_moe_fixtures import mlx_mxfp4_quantize  # noqa: E402

sys.path.insert(0, HERE)
# The affine rule in torch and the bf16 view: the dense generator's.
from make_random_q4 import bf16_numpy  # noqa: E402
from make_random_q4 import quantize as affine  # noqa: E402

SHAPES = {
    "qwen3-30b-a3b": dict(family="qwen3_moe", hidden=2048, layers=48, heads=32, kv_heads=4,
                          head_dim=128, experts=128, top_k=8, inter=768, vocab=151936),
    "gpt-oss-20b": dict(family="gpt_oss", hidden=2880, layers=24, heads=64, kv_heads=8,
                        head_dim=64, experts=32, top_k=4, inter=2880, vocab=201088),
}
# The same structure at a few MB: every input size a multiple of 64 (affine group) and 32.
TINY = dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, experts=8, top_k=2,
            inter=128, vocab=1024)


E2M1_MIDS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def mxfp4(w):
    """w float32 [rows, in] -> E2M1 codes (int64 [rows, in]) and E8M0 scale bytes (uint8 numpy
    [rows, in / 32]): mlx_mxfp4_quantize's rule, in torch."""
    rows, n = w.shape
    g = w.reshape(rows, n // 32, 32)
    x = g.abs().amax(dim=-1) / 6.0
    frac, exp = torch.frexp(x)
    e = torch.where(frac == 0.5, exp - 1, exp)
    e = torch.where(x > 0, e, torch.full_like(e, -127)).clamp(-127, 127)
    v = g * torch.exp2(-e.to(torch.float32))[..., None]
    a = v.abs().contiguous()
    mids = torch.tensor(E2M1_MIDS, device=w.device)
    idx = torch.searchsorted(mids, a)  # the midpoints below a: the nearest, ties low
    tie = (idx < 7) & (a == mids[idx.clamp(max=6)])
    idx = torch.where(tie & (idx % 2 == 1), idx + 1, idx)
    codes = (idx | torch.signbit(v).to(torch.int64) * 8).reshape(rows, n)
    return codes, (e + 127).to(torch.uint8).cpu().numpy()


def pack(q, bits):
    """Codes int64 [rows, in] (bits 4 or 8) -> uint32 numpy [rows, in * bits / 32]: code k of
    a word at bits [k * bits, (k + 1) * bits), the first lowest."""
    rows, n = q.shape
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, device=q.device)
    words = (q.reshape(rows, n // per, per) << shifts).sum(dim=-1)
    return words.cpu().numpy().astype(np.uint32)


def self_check(device):
    """The torch quantizers and packer against the numpy references the fixtures were made
    with; every count printed must be 0."""
    w = torch.randn(96, 256, device=device) * 0.02
    w[0, :32] = 0  # an all-zero MXFP4 group
    # A group whose scale is 2^-6 exactly (largest 6 * 2^-6), with the E2M1 ties 0.75, 1.75
    # and 3.5 (times 2^-6) and a small negative value (-0).
    w[1, :32] = 0
    w[1, :6] = torch.tensor([0.09375, 0.01171875, -0.02734375, 0.0546875, -1e-4, 0.0390625])
    bad = {}
    for bits in (4, 8):
        q, sc, bi = affine(w, bits, 64)
        rq, rsc, rbi = mlx_affine_quantize(w.cpu().numpy(), bits, 64)
        bad[f"affine{bits} codes"] = int((q.cpu().numpy() != rq.astype(np.int64)).sum())
        bad_sc = (sc.cpu().numpy() != rsc).sum() + (bi.cpu().numpy() != rbi).sum()
        bad[f"affine{bits} scales"] = int(bad_sc)
        bad[f"affine{bits} words"] = int((pack(q, bits) != pack_codes(rq, bits)).sum())
    codes, sbytes = mxfp4(w)
    rcodes, rsbytes = mlx_mxfp4_quantize(w.cpu().numpy())
    bad["mxfp4 codes"] = int((codes.cpu().numpy() != rcodes.astype(np.int64)).sum())
    bad["mxfp4 scales"] = int((sbytes != rsbytes).sum())
    bad["mxfp4 words"] = int((pack(codes, 4) != pack_codes(rcodes, 4)).sum())
    print("self-check against numpy:", json.dumps(bad))
    if any(bad.values()):
        sys.exit("make_moe_q4: the torch quantizers disagree with tools/reference")


class Plan:
    """(name, dtype tag, shape, maker) for every tensor; makers run on the device when
    called, in plan order."""

    def __init__(self, device):
        self.device = device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(0)
        self.entries = []

    def randn(self, *shape):
        return torch.randn(*shape, device=self.device, generator=self.gen) * 0.02

    def add(self, name, tag, shape, make):
        self.entries.append((name, tag, tuple(shape), make))

    def dense(self, name, *shape, ones=False):
        def make():
            x = torch.ones(*shape, device=self.device) if ones else self.randn(*shape)
            return bf16_numpy(x)

        self.add(name, "BF16", shape, make)

    def linear(self, module, lead, rows, cols, spec):
        """module.weight [*lead, rows, cols] quantized by spec (bits, group, mode), with its
        scales (and biases): made once, on the first of its tensors asked for."""
        bits, group, mode = spec
        shape = (*lead, rows)
        cache = {}

        def make(part):
            if not cache:
                w = self.randn(int(np.prod(shape)), cols)
                if mode == "mxfp4":
                    q, sbytes = mxfp4(w)
                    cache["scales"] = sbytes.reshape(*shape, -1)
                else:
                    q, sc, bi = affine(w, bits, group)
                    cache["scales"] = bf16_numpy(sc).reshape(*shape, -1)
                    cache["biases"] = bf16_numpy(bi).reshape(*shape, -1)
                cache["weight"] = pack(q, bits).reshape(*shape, -1)
            return cache.pop(part)

        self.add(module + ".weight", "U32", (*shape, cols * bits // 32), lambda: make("weight"))
        stag = "U8" if mode == "mxfp4" else "BF16"
        self.add(module + ".scales", stag, (*shape, cols // group), lambda: make("scales"))
        if mode != "mxfp4":
            self.add(module + ".biases", "BF16", (*shape, cols // group), lambda: make("biases"))


def plan(s, device):
    """The tensors of shape s, and config.json's quantization block."""
    oss = s["family"] == "gpt_oss"
    base = (8, 64, "affine") if oss else (4, 64, "affine")
    router = (8, 64, "affine")
    experts = (4, 32, "mxfp4") if oss else base
    h, hd, E, inter = s["hidden"], s["head_dim"], s["experts"], s["inter"]
    nq, nkv = s["heads"] * hd, s["kv_heads"] * hd
    p = Plan(device)
    quant = {"group_size": base[1], "bits": base[0]}
    p.linear("model.embed_tokens", (), s["vocab"], h, base)
    p.dense("model.norm.weight", h, ones=True)
    p.linear("lm_head", (), s["vocab"], h, base)
    for i in range(s["layers"]):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        p.dense(f"model.layers.{i}.input_layernorm.weight", h, ones=True)
        p.dense(f"model.layers.{i}.post_attention_layernorm.weight", h, ones=True)
        for proj, rows, cols in (("q", nq, h), ("k", nkv, h), ("v", nkv, h), ("o", h, nq)):
            p.linear(a + proj + "_proj", (), rows, cols, base)
            if oss:
                p.dense(a + proj + "_proj.bias", rows)
        if oss:
            p.dense(a + "sinks", s["heads"])
        else:
            p.dense(a + "q_norm.weight", hd, ones=True)
            p.dense(a + "k_norm.weight", hd, ones=True)
        r = m + ("router" if oss else "gate")
        p.linear(r, (), E, h, router)
        quant[r] = {"group_size": router[1], "bits": router[0]}
        if oss:
            p.dense(r + ".bias", E)
        x = m + ("experts." if oss else "switch_mlp.")
        for proj, rows, cols in (("gate", inter, h), ("up", inter, h), ("down", h, inter)):
            p.linear(x + proj + "_proj", (E,), rows, cols, experts)
            if oss:
                p.dense(x + proj + "_proj.bias", E, rows)
                quant[x + proj + "_proj"] = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    return p.entries, quant


def config(s, quant):
    common = {
        "hidden_size": s["hidden"], "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"], "vocab_size": s["vocab"], "num_experts_per_tok": s["top_k"],
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization": quant, "quantization_config": quant,
    }
    if s["family"] == "qwen3_moe":
        return {
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **common,
            "num_experts": s["experts"], "moe_intermediate_size": s["inter"],
            "intermediate_size": 6144, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "norm_topk_prob": True, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "rope_scaling": None, "use_sliding_window": False,
            "sliding_window": None, "bos_token_id": 151643, "eos_token_id": 151645,
        }
    layers = s["layers"]
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", **common,
        "num_local_experts": s["experts"], "experts_per_token": s["top_k"],
        "intermediate_size": s["inter"], "attention_bias": True, "swiglu_limit": 7.0,
        "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
        "sliding_window": 128, "max_position_embeddings": 131072, "initial_context_length": 4096,
        "rms_norm_eps": 1e-5, "rope_theta": 150000,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                         "truncate": False},
        "bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012],
        "pad_token_id": 199999,
    }


ITEMSIZE = {"U32": 4, "BF16": 2, "U8": 1}


def write(path, entries):
    """safetensors in plan order (a weight before its scales and biases, so each is made
    once). Every tensor's size is a multiple of 4 bytes in these shapes (even counts of bf16,
    scale bytes of rows that come in fours), so every U32 tensor starts aligned."""
    header, off = {"__metadata__": {"format": "mlx"}}, 0
    for name, tag, shape, _ in entries:
        n = int(np.prod(shape)) * ITEMSIZE[tag]
        assert n % 4 == 0, (name, shape)
        header[name] = {"dtype": tag, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, tag, shape, make in entries:
            a = make()
            assert a.shape == shape and a.itemsize == ITEMSIZE[tag], (name, a.shape, shape)
            f.write(np.ascontiguousarray(a).tobytes())
    return off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--tiny", action="store_true", help="the same structure at a few MB")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    s = dict(SHAPES[a.shape], **(TINY if a.tiny else {}))
    self_check(a.device)
    os.makedirs(a.out, exist_ok=True)
    entries, quant = plan(s, a.device)
    n = write(os.path.join(a.out, "model.safetensors"), entries)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(s, quant), f, indent=2)
    print(f"wrote {a.out}: {a.shape}{' (tiny)' if a.tiny else ''}, {n / 1e9:.3f} GB of tensors")


if __name__ == "__main__":
    main()
