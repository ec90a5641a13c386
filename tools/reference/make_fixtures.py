#!/usr/bin/env python3
"""Tiny random-weight checkpoints and the outputs Hugging Face transformers gives for them.

Each fixture is a folder holding an MLX-layout checkpoint (config.json written the way
transformers 4 and mlx-lm write it, model.safetensors with Hugging Face tensor names, dense or
MLX affine-quantized) and the reference outputs of transformers run in float64 on the CPU:
logits.npy (float32 [n_tokens, vocab], every position of one forward pass) and reference.json
(the prompt ids, a 16-token greedy continuation from generate(), its top-2 margins, notes).

    python3 tools/reference/make_fixtures.py OUT_DIR            # everything (torch, transformers)
    python3 tools/reference/make_fixtures.py OUT_DIR --weights-only   # checkpoints only (numpy)

Every checkpoint is read back with a reader and a bit-stream unpacker written independently of
the writer and the packer, and must decode to exactly the weights the reference model was given.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import time
import traceback

import numpy as np

N_PROMPT = 100
N_GREEDY = 16
# Greedy steps must win by at least this fraction of the logits row's RMS, so that a runtime
# within the 1e-3 relative-error tolerance cannot flip a choice.
MIN_REL_MARGIN = 0.02
MAX_PROMPT_TRIES = 64
# A continuation that repeats a few tokens would let a runtime with a broken KV cache pass.
MIN_DISTINCT_GREEDY = 8
FIRST_ORDINARY_ID = 4  # ids 0..3 are pad, bos and the eos ids

# --------------------------------------------------------------------------------------------
# Model specifications. Configs follow real checkpoints of each family (keys as transformers 4
# wrote them: rope_theta and rope_scaling at the top level, torch_dtype), scaled down.


def _llama_base(vocab, rope_theta, rope_scaling, max_pos, eos, tied):
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": eos,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 256,
        "max_position_embeddings": max_pos,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": rope_scaling,
        "rope_theta": rope_theta,
        "tie_word_embeddings": tied,
        "use_cache": True,
        "vocab_size": vocab,
    }


def _mistral_base(rope_scaling, max_pos):
    cfg = {
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 256,
        "max_position_embeddings": max_pos,
        "model_type": "mistral",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": 256,
    }
    # Real Mistral configs carry no rope_scaling key at all; only the dynamic variant adds one.
    if rope_scaling is not None:
        cfg["rope_scaling"] = rope_scaling
    return cfg


MODELS = {
    "llama": {
        "seed": 11,
        "config": _llama_base(
            256,
            500000.0,
            {
                "factor": 8.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 64,
                "rope_type": "llama3",
            },
            512,
            [2, 3],
            False,
        ),
    },
    # Tied like the small Llama 3.2 checkpoints.
    "llama_plain": {"seed": 12, "config": _llama_base(256, 10000.0, None, 256, 2, True)},
    "mistral": {"seed": 21, "config": _mistral_base(None, 4096)},
    # max_position_embeddings below the sequence length, so that dynamic NTK scaling engages.
    "mistral_dynamic": {
        "seed": 22,
        "config": _mistral_base({"factor": 2.0, "rope_type": "dynamic"}, 64),
    },
    "qwen2": {
        "seed": 31,
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": 128,
            "initializer_range": 0.02,
            "intermediate_size": 256,
            "max_position_embeddings": 128,
            "max_window_layers": 1,
            "model_type": "qwen2",
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            # The spelling Qwen2.5's model cards give for long context (the old "type" key).
            "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32, "type": "yarn"},
            "rope_theta": 1000000.0,
            # Shorter than the sequence but disabled by use_sliding_window: a runtime that
            # applies it anyway fails this fixture.
            "sliding_window": 32,
            "tie_word_embeddings": False,
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": 320,
        },
    },
    "qwen3": {
        "seed": 41,
        "config": {
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "head_dim": 64,
            "hidden_act": "silu",
            "hidden_size": 128,
            "initializer_range": 0.02,
            "intermediate_size": 256,
            "max_position_embeddings": 512,
            "max_window_layers": 2,
            "model_type": "qwen3",
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_scaling": {"factor": 2.0, "rope_type": "linear"},
            "rope_theta": 1000000.0,
            "sliding_window": None,
            "tie_word_embeddings": True,
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": 256,
        },
    },
}


def _q(bits, group_size, **overrides):
    return {"bits": bits, "group_size": group_size, "overrides": overrides}


FIXTURES = [
    {"name": "llama_bf16", "model": "llama", "dtype": "bfloat16"},
    {"name": "mistral_bf16", "model": "mistral", "dtype": "bfloat16"},
    {"name": "qwen2_bf16", "model": "qwen2", "dtype": "bfloat16"},
    {"name": "qwen3_bf16", "model": "qwen3", "dtype": "bfloat16"},
    {"name": "mistral_f16_dynamic", "model": "mistral_dynamic", "dtype": "float16"},
    {"name": "llama_f32", "model": "llama_plain", "dtype": "float32"},
    {"name": "llama_q4_g64", "model": "llama", "dtype": "bfloat16", "quant": _q(4, 64)},
    {"name": "llama_q8_g32", "model": "llama", "dtype": "bfloat16", "quant": _q(8, 32)},
    {
        "name": "llama_q4_g64_mixed",
        "model": "llama",
        "dtype": "bfloat16",
        "quant": _q(4, 64, **{"model.layers.1.mlp.down_proj": {"group_size": 128, "bits": 8}}),
    },
    {"name": "llama_q3_g64", "model": "llama", "dtype": "bfloat16", "quant": _q(3, 64)},
    {"name": "llama_q6_g32", "model": "llama", "dtype": "bfloat16", "quant": _q(6, 32)},
    {"name": "llama_q2_g32", "model": "llama", "dtype": "bfloat16", "quant": _q(2, 32)},
    {"name": "llama_q5_g64", "model": "llama", "dtype": "bfloat16", "quant": _q(5, 64)},
    {"name": "qwen3_q4_g64", "model": "qwen3", "dtype": "bfloat16", "quant": _q(4, 64)},
]


def head_dim_of(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def eos_ids(cfg):
    eos = cfg["eos_token_id"]
    return eos if isinstance(eos, list) else [eos]


# --------------------------------------------------------------------------------------------
# Weights. Drawn here rather than by transformers' init so that norm weights and biases are
# not the trivial ones (a runtime that skips them must fail) and logits come out sharp.


def master_weights(cfg, seed):
    """float32 weights by Hugging Face name, in a fixed draw order."""
    rng = np.random.default_rng(seed)
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nh, nkv = head_dim_of(cfg), cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = {}

    def normal(name, shape, std):
        w[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(
            np.float32
        )

    def norm(name, n):
        w[name] = (1.0 + 0.2 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    # A tied embedding is also the output matrix; at unit scale the token's own row would win
    # every step (the continuation repeats one token), so it is kept well below the layers'
    # contributions to the residual stream.
    normal("model.embed_tokens.weight", (vocab, h), 0.3 if cfg["tie_word_embeddings"] else 1.0)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        norm(p + "input_layernorm.weight", h)
        normal(p + "self_attn.q_proj.weight", (nh * hd, h), 1.5 / math.sqrt(h))
        normal(p + "self_attn.k_proj.weight", (nkv * hd, h), 1.5 / math.sqrt(h))
        normal(p + "self_attn.v_proj.weight", (nkv * hd, h), 1.0 / math.sqrt(h))
        normal(p + "self_attn.o_proj.weight", (h, nh * hd), 1.0 / math.sqrt(nh * hd))
        if cfg["model_type"] == "qwen2":
            normal(p + "self_attn.q_proj.bias", (nh * hd,), 0.5)
            normal(p + "self_attn.k_proj.bias", (nkv * hd,), 0.5)
            normal(p + "self_attn.v_proj.bias", (nkv * hd,), 0.5)
        if cfg["model_type"] == "qwen3":
            norm(p + "self_attn.q_norm.weight", hd)
            norm(p + "self_attn.k_norm.weight", hd)
        norm(p + "post_attention_layernorm.weight", h)
        normal(p + "mlp.gate_proj.weight", (inter, h), 1.5 / math.sqrt(h))
        normal(p + "mlp.up_proj.weight", (inter, h), 1.5 / math.sqrt(h))
        normal(p + "mlp.down_proj.weight", (h, inter), 1.0 / math.sqrt(inter))
    norm("model.norm.weight", h)
    if not cfg["tie_word_embeddings"]:
        normal("lm_head.weight", (vocab, h), 4.0 / math.sqrt(h))
    return w


# --------------------------------------------------------------------------------------------
# Number formats and MLX affine quantization.


def bf16_bits(x):
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((b + ((b >> 16) & 1) + np.uint32(0x7FFF)) >> 16).astype(np.uint16)


def bf16_to_f64(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def mlx_affine_quantize(w, bits, group_size):
    """Quantize float32 w [out, in] as MLX's CPU kernel does (mlx/backend/cpu/quantized.cpp).

    All arithmetic is float32, as there. The larger-magnitude end of each group becomes the
    bias, and the scale is adjusted so that end is hit exactly; the scale is therefore negative
    where the group's maximum has the larger magnitude. Returns the integer codes (uint32
    [out, in]) and the float32 scales and biases [out, in / group_size]; MLX stores the latter
    rounded to the model dtype, after the codes were computed from the unrounded ones.
    """
    out, inn = w.shape
    g = w.reshape(out, inn // group_size, group_size).astype(np.float32)
    n_bins = np.float32((1 << bits) - 1)
    w_min, w_max = g.min(axis=-1), g.max(axis=-1)
    min_is_edge = np.abs(w_min) > np.abs(w_max)
    scale = np.maximum((w_max - w_min) / n_bins, np.float32(1e-7)).astype(np.float32)
    scale = np.where(min_is_edge, scale, -scale).astype(np.float32)
    edge = np.where(min_is_edge, w_min, w_max).astype(np.float32)
    q0 = np.rint(edge / scale).astype(np.float32)
    nonzero = q0 != 0
    scale = np.where(nonzero, edge / np.where(nonzero, q0, np.float32(1)), scale).astype(np.float32)
    bias = np.where(nonzero, edge, np.float32(0)).astype(np.float32)
    q = np.rint((g - bias[..., None]) / scale[..., None]).astype(np.float32)
    q = np.clip(q, np.float32(0), n_bins).astype(np.uint32).reshape(out, inn)
    return q, scale, bias


def quantize_stored(w, bits, group_size):
    """An MLX affine-quantized module from float32 w [..., in] (leading dims, stacked experts
    say, kept): MLX quantizes the bf16 checkpoint, so the input is the bf16-rounded weight.
    Returns the packed weight (uint32 [..., in * bits / 32]), the bf16 scale and bias bits
    [..., in / group_size], and the float64 weight the runtime dequantizes from them."""
    lead = w.shape[:-1]
    flat = w.reshape(-1, w.shape[-1])
    codes, scale, bias = mlx_affine_quantize(
        bf16_to_f64(bf16_bits(flat)).astype(np.float32), bits, group_size
    )
    s_bits, b_bits = bf16_bits(scale), bf16_bits(bias)
    deq = np.repeat(bf16_to_f64(s_bits), group_size, 1) * codes + np.repeat(
        bf16_to_f64(b_bits), group_size, 1
    )
    return (
        pack_codes(codes, bits).reshape(*lead, -1),
        s_bits.reshape(*lead, -1),
        b_bits.reshape(*lead, -1),
        deq.reshape(w.shape),
    )


def pack_codes(q, bits):
    """Codes [out, in] -> uint32 [out, in * bits / 32]: each row a little-endian bit stream,
    code k at bits [k * bits, (k + 1) * bits)."""
    out, inn = q.shape
    assert (inn * bits) % 32 == 0, (inn, bits)
    bit_planes = (q[:, :, None] >> np.arange(bits, dtype=np.uint32)) & np.uint32(1)
    stream = bit_planes.astype(np.uint8).reshape(out, inn * bits)
    packed = np.packbits(stream, axis=1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u4")


# --------------------------------------------------------------------------------------------
# safetensors writer. Tensors are stored largest element first, so that with the 8-byte padded
# header every tensor starts at a multiple of its element size (as the reference writer does).

ST_ITEMSIZE = {"F32": 4, "U32": 4, "BF16": 2, "F16": 2}


def write_safetensors(path, tensors):
    """tensors: name -> (safetensors dtype tag, numpy array holding the raw elements)."""
    order = sorted(tensors, key=lambda n: (-ST_ITEMSIZE[tensors[n][0]], n))
    header = {"__metadata__": {"format": "mlx"}}
    blobs, offset = [], 0
    for name in order:
        tag, arr = tensors[name]
        assert arr.dtype.itemsize == ST_ITEMSIZE[tag], (name, tag, arr.dtype)
        data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": tag,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


# --------------------------------------------------------------------------------------------
# Independent reader: parses the file from its bytes, decodes bf16 by byte placement and
# unpacks codes with 64-bit windows over the uint32 words, sharing nothing with the writer.


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    tensors, covered = {}, 0
    for name, h in header.items():
        start, end = h["data_offsets"]
        tensors[name] = (h["dtype"], tuple(h["shape"]), raw[8 + n + start : 8 + n + end])
        covered += end - start
    assert covered == len(raw) - 8 - n, f"{path}: tensor data does not cover the file"
    return meta, tensors


def decode_float(tag, shape, data):
    if tag == "BF16":
        halves = np.zeros((len(data) // 2, 2), dtype="<u2")
        halves[:, 1] = np.frombuffer(data, dtype="<u2")
        values = halves.reshape(-1).view("<f4")
    elif tag == "F16":
        values = np.frombuffer(data, dtype="<f2")
    elif tag == "F32":
        values = np.frombuffer(data, dtype="<f4")
    else:
        raise ValueError(f"unexpected float dtype {tag}")
    return values.astype(np.float64).reshape(shape)


def unpack_codes(words, bits, n_in):
    """uint32 [out, n_words] -> codes [out, n_in] (value k at stream bits [k*bits, (k+1)*bits))."""
    w64 = np.concatenate([words.astype(np.uint64), np.zeros((words.shape[0], 1), np.uint64)], 1)
    pos = np.arange(n_in, dtype=np.uint64) * np.uint64(bits)
    word = (pos >> np.uint64(5)).astype(np.int64)
    shift = pos & np.uint64(31)
    window = w64[:, word] | (w64[:, word + 1] << np.uint64(32))
    return (window >> shift) & np.uint64((1 << bits) - 1)


def decode_checkpoint(path, quant_of):
    """Hugging Face name -> float64 weight, dequantizing quantized modules.

    quant_of(module) gives (bits, group_size) or None; the bits are needed because the packed
    width alone does not determine them."""
    meta, raw = read_safetensors(path)
    assert meta == {"format": "mlx"}, f"{path}: metadata {meta}"
    out = {}
    for name, (tag, shape, data) in raw.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        spec = quant_of(module) if module else None
        if spec is None:
            out[name] = decode_float(tag, shape, data)
            continue
        bits, group = spec
        assert tag == "U32", f"{name}: quantized weight stored as {tag}"
        words = np.frombuffer(data, dtype="<u4").reshape(shape)
        n_in = shape[1] * 32 // bits
        codes = unpack_codes(words, bits, n_in).astype(np.float64)
        scales = decode_float(*raw[module + ".scales"])
        biases = decode_float(*raw[module + ".biases"])
        assert raw[module + ".scales"][0] == "BF16" and raw[module + ".biases"][0] == "BF16"
        assert scales.shape == (shape[0], n_in // group), f"{module}.scales shape {scales.shape}"
        assert biases.shape == scales.shape, f"{module}.biases shape {biases.shape}"
        out[name] = np.repeat(scales, group, axis=1) * codes + np.repeat(biases, group, axis=1)
    return out


# --------------------------------------------------------------------------------------------
# Building one checkpoint.


def is_quantizable(name):
    return (
        name == "model.embed_tokens.weight"
        or name == "lm_head.weight"
        or (name.startswith("model.layers.") and name.endswith("_proj.weight"))
    )


def quant_lookup(quant):
    def quant_of(module):
        if quant is None or not is_quantizable(module + ".weight"):
            return None
        o = quant["overrides"].get(module)
        return (o["bits"], o["group_size"]) if o else (quant["bits"], quant["group_size"])

    return quant_of


def config_json(fx):
    cfg = json.loads(json.dumps(MODELS[fx["model"]]["config"]))
    cfg["torch_dtype"] = fx["dtype"]
    q = fx.get("quant")
    if q:
        qcfg = {"group_size": q["group_size"], "bits": q["bits"]}
        qcfg.update(q["overrides"])
        cfg["quantization"] = qcfg
        cfg["quantization_config"] = json.loads(json.dumps(qcfg))
    return dict(sorted(cfg.items()))


def build_checkpoint(fx, fx_dir):
    """Writes config.json and model.safetensors; returns the float64 weights (Hugging Face
    names) that the file decodes to, which are the weights the reference model is given."""
    model = MODELS[fx["model"]]
    cfg = config_json(fx)
    master = master_weights(model["config"], model["seed"])
    quant_of = quant_lookup(fx.get("quant"))
    stored, ref = {}, {}
    for name, w in master.items():
        spec = quant_of(name[: -len(".weight")]) if name.endswith(".weight") else None
        if fx["dtype"] == "float32":
            stored[name] = ("F32", w)
            ref[name] = w.astype(np.float64)
        elif fx["dtype"] == "float16":
            h = w.astype(np.float16)
            stored[name] = ("F16", h)
            ref[name] = h.astype(np.float64)
        elif spec is None:
            b = bf16_bits(w)
            stored[name] = ("BF16", b)
            ref[name] = bf16_to_f64(b)
        else:
            bits, group = spec
            module = name[: -len(".weight")]
            packed, s_bits, b_bits, ref[name] = quantize_stored(w, bits, group)
            stored[name] = ("U32", packed)
            stored[module + ".scales"] = ("BF16", s_bits)
            stored[module + ".biases"] = ("BF16", b_bits)
    os.makedirs(fx_dir, exist_ok=True)
    with open(os.path.join(fx_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    path = os.path.join(fx_dir, "model.safetensors")
    write_safetensors(path, stored)

    _, raw = read_safetensors(path)
    assert set(raw) == set(stored), f"stored names differ: {set(raw) ^ set(stored)}"
    for name, (tag, arr) in stored.items():
        assert raw[name][:2] == (tag, arr.shape), f"{name}: {raw[name][:2]}"
    decoded = decode_checkpoint(path, quant_of)
    assert set(decoded) == set(ref), f"tensor names differ: {set(decoded) ^ set(ref)}"
    for name in ref:
        assert decoded[name].shape == ref[name].shape, name
        assert np.array_equal(
            decoded[name], ref[name]
        ), f"{name}: file does not decode to the reference weight"
        assert np.all(np.isfinite(ref[name])), name
    return cfg, ref, stored


# --------------------------------------------------------------------------------------------
# RoPE frequencies, recomputed from the formulas, to check transformers read the config as meant.


def expected_rope(cfg, seq_len=None):
    """(inv_freq [head_dim / 2], attention scaling) for the config's rope type."""
    d = head_dim_of(cfg)
    theta = cfg["rope_theta"]
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    exps = np.arange(0, d, 2, dtype=np.float64) / d
    inv = 1.0 / theta**exps
    if kind == "default":
        return inv, 1.0
    f = rs["factor"]
    if kind == "linear":
        return inv / f, 1.0
    if kind == "dynamic":
        mp = cfg["max_position_embeddings"]
        s = max(seq_len or mp, mp)
        base = theta * ((f * s / mp) - (f - 1)) ** (d / (d - 2))
        return 1.0 / base**exps, 1.0
    om = rs["original_max_position_embeddings"]
    if kind == "llama3":
        lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
        wl = 2 * math.pi / inv
        s = (om / wl - lo) / (hi - lo)
        mid = (1 - s) * inv / f + s * inv
        return np.where(wl > om / lo, inv / f, np.where(wl < om / hi, inv, mid)), 1.0
    if kind == "yarn":

        def corr(rot):
            return d * math.log(om / (rot * 2 * math.pi)) / (2 * math.log(theta))

        low, high = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extra = 1 - ramp
        return inv / f * (1 - extra) + inv * extra, 0.1 * math.log(f) + 1.0
    raise ValueError(kind)


# --------------------------------------------------------------------------------------------
# transformers side. torch and transformers are imported here, not at the top, so that the
# checkpoint half above runs (--weights-only) where they are not installed.


def load_hf(fx_dir, cfg, ref, quantized, torch_dtype):
    """A fresh transformers model holding exactly the reference weights, eager attention.

    Dense checkpoints are loaded by from_pretrained from the fixture folder itself; quantized
    ones (which transformers cannot read) are built from the same config.json, minus the
    quantization keys, and given the dequantized weights."""
    import torch
    import transformers

    if not quantized:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            fx_dir, dtype=torch_dtype, attn_implementation="eager"
        )
    else:
        with tempfile.TemporaryDirectory() as tmp:
            plain = {
                k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config")
            }
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(plain, f)
            hf_cfg = transformers.AutoConfig.from_pretrained(tmp)
        model = transformers.AutoModelForCausalLM.from_config(
            hf_cfg, dtype=torch_dtype, attn_implementation="eager"
        )
        state = {k: torch.from_numpy(v).to(torch_dtype) for k, v in ref.items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        allowed_missing = {"lm_head.weight"} if cfg["tie_word_embeddings"] else set()
        assert not unexpected, f"unexpected tensors {unexpected}"
        assert set(missing) <= allowed_missing, f"missing tensors {missing}"
    return model.eval()


def check_with_safetensors_library(path, stored):
    """The reference safetensors reader must see the same tensors, bit for bit."""
    import torch
    from safetensors import safe_open

    dtypes = {
        "BF16": torch.bfloat16,
        "F16": torch.float16,
        "F32": torch.float32,
        "U32": torch.uint32,
    }
    same_width = {"BF16": torch.int16, "F16": torch.int16, "F32": torch.int32, "U32": torch.int32}
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "mlx"}, f.metadata()
        assert set(f.keys()) == set(stored), "safetensors sees other tensor names"
        for name in f.keys():
            tag, arr = stored[name]
            t = f.get_tensor(name)
            assert (
                t.dtype == dtypes[tag] and tuple(t.shape) == arr.shape
            ), f"{name}: {t.dtype} {t.shape}"
            got = t.contiguous().view(same_width[tag]).numpy().view(arr.dtype)
            assert np.array_equal(got.view(np.uint8), arr.view(np.uint8)), f"{name}: bytes differ"


def check_hf_config(fx_dir, cfg):
    """transformers 5 must read the transformers-4 style config.json as intended."""
    import transformers

    hc = transformers.AutoConfig.from_pretrained(fx_dir)
    assert hc.model_type == cfg["model_type"], hc.model_type
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "rms_norm_eps",
        "max_position_embeddings",
        "tie_word_embeddings",
        "hidden_act",
    ):
        assert getattr(hc, key) == cfg[key], f"config {key}: {getattr(hc, key)} != {cfg[key]}"
    hd = getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads
    assert hd == head_dim_of(cfg), f"head_dim {hd}"
    rp = dict(hc.rope_parameters)
    rs = cfg.get("rope_scaling") or {}
    want_type = rs.get("rope_type", rs.get("type", "default"))
    assert rp["rope_type"] == want_type, f"rope_type {rp['rope_type']} != {want_type}"
    assert rp["rope_theta"] == cfg["rope_theta"], f"rope_theta {rp['rope_theta']}"
    for key, value in rs.items():
        if key not in ("type", "rope_type"):
            assert rp.get(key) == value, f"rope {key}: {rp.get(key)} != {value}"
    layer_types = getattr(hc, "layer_types", None)
    if layer_types:
        assert all(t == "full_attention" for t in layer_types), f"layer_types {layer_types}"
    else:
        assert getattr(hc, "sliding_window", None) is None, f"sliding_window {hc.sliding_window}"
    return rp


def check_hf_model(model, cfg, ref):
    """The built model has the intended class, attention, RoPE and exactly the weights."""
    import torch

    assert type(model).__name__ == cfg["architectures"][0], type(model).__name__
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    params = dict(model.named_parameters())
    tied = cfg["tie_word_embeddings"]
    want = set(ref) - ({"lm_head.weight"} if tied else set())
    assert set(params) == want, f"parameters differ: {set(params) ^ want}"
    for name, p in params.items():
        assert torch.equal(
            p.detach().to(torch.float64), torch.from_numpy(ref[name])
        ), f"weight {name}"
    lm, emb = model.lm_head.weight, model.model.embed_tokens.weight
    assert (lm.data_ptr() == emb.data_ptr()) == tied, "lm_head tying"
    rot = model.model.rotary_emb
    inv, scaling = expected_rope(cfg)
    got = rot.inv_freq.detach().to(torch.float64).cpu().numpy()
    assert np.allclose(got, inv, rtol=1e-5, atol=0), f"inv_freq {got} != {inv}"
    assert abs(rot.attention_scaling - scaling) < 1e-9, f"attention_scaling {rot.attention_scaling}"


def forward_logits(model, ids):
    import torch

    with torch.no_grad():
        t = torch.tensor([ids])
        out = model(input_ids=t, attention_mask=torch.ones_like(t), use_cache=False)
    return out.logits[0].to(torch.float64).numpy()


def greedy(model, ids):
    import torch

    t = torch.tensor([ids])
    with torch.no_grad():
        g = model.generate(
            input_ids=t,
            attention_mask=torch.ones_like(t),
            max_new_tokens=N_GREEDY,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    new = g.sequences[0, len(ids) :].tolist()
    step_logits = torch.stack([x[0] for x in g.logits]).to(torch.float64).numpy()
    return new, step_logits


def margins(rows):
    top = np.sort(rows, axis=1)
    raw = top[:, -1] - top[:, -2]
    rms = np.sqrt(np.mean(rows**2, axis=1))
    return raw, raw / rms


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def reference_outputs(fx, fx_dir, cfg, ref):
    import torch

    quantized = fx.get("quant") is not None
    dynamic = (cfg.get("rope_scaling") or {}).get("rope_type") == "dynamic"
    f64 = torch.float64

    def fresh():
        # A new model for every run: dynamic RoPE keeps state (the longest length seen) in the
        # model, which would leak from one call into the next.
        return load_hf(fx_dir, cfg, ref, quantized, f64)

    rope_params = check_hf_config(fx_dir, cfg)
    check_hf_model(fresh(), cfg, ref)

    specials = {0, cfg["bos_token_id"], *eos_ids(cfg)}
    seed0 = MODELS[fx["model"]]["seed"] * 1000
    stateless = None if dynamic else fresh()
    for attempt in range(MAX_PROMPT_TRIES):
        rng = np.random.default_rng(seed0 + attempt)
        tokens = [cfg["bos_token_id"]] + rng.integers(
            FIRST_ORDINARY_ID, cfg["vocab_size"], N_PROMPT - 1
        ).tolist()
        new, step_logits = greedy(stateless if stateless is not None else fresh(), tokens)
        if len(new) != N_GREEDY or specials & set(new) or len(set(new)) < MIN_DISTINCT_GREEDY:
            continue
        raw, rel = margins(step_logits)
        if rel.min() >= MIN_REL_MARGIN:
            break
    else:
        raise AssertionError(f"no prompt in {MAX_PROMPT_TRIES} tries gives a usable continuation")
    assert np.argmax(step_logits, axis=1).tolist() == new, "generate() did not pick the argmax"

    model = fresh()
    logits = forward_logits(model, tokens)
    assert logits.shape == (N_PROMPT, cfg["vocab_size"]), logits.shape
    assert np.all(np.isfinite(logits)), "non-finite logits"
    rms = float(np.sqrt(np.mean(logits**2)))
    assert (
        1.0 <= rms and np.abs(logits).max() < 1e3
    ), f"logits RMS {rms}, max {np.abs(logits).max()}"
    if dynamic:
        inv, _ = expected_rope(cfg, seq_len=N_PROMPT)
        got = model.model.rotary_emb.inv_freq.detach().to(f64).numpy()
        assert np.allclose(got, inv, rtol=1e-5, atol=0), f"dynamic inv_freq {got} != {inv}"

    # Greedy against one uncached forward over prompt + continuation: same choices and the same
    # logits (generate() hands its logits back as float32). Dynamic NTK differs by design.
    full = forward_logits(fresh(), tokens + new[:-1])[N_PROMPT - 1 :]
    cached_vs_full = rel_err(step_logits, full)
    prefill_vs_logits = rel_err(step_logits[0], logits[-1])
    assert prefill_vs_logits < 1e-6, f"generate's first step vs forward: {prefill_vs_logits}"
    if not dynamic:
        assert np.argmax(full, axis=1).tolist() == new, "uncached forward disagrees with generate"
        assert cached_vs_full < 1e-6, f"cached vs uncached logits: {cached_vs_full}"

    logits32 = forward_logits(load_hf(fx_dir, cfg, ref, quantized, torch.float32), tokens)
    return {
        "tokens": tokens,
        "logits": logits,
        "greedy": new,
        "margin_raw": raw.tolist(),
        "margin_rel": rel.tolist(),
        "prompt_seed": seed0 + attempt,
        "prompt_tries": attempt + 1,
        "rel_err_float32_model": rel_err(logits32, logits),
        "cached_vs_uncached_rel_err": cached_vs_full,
        "rope_parameters": {k: v for k, v in rope_params.items()},
    }


# --------------------------------------------------------------------------------------------
# Notes written into each reference.json.

ROPE_NOTES = {
    "default": "plain RoPE (rotate-half), no scaling",
    "linear": "linear RoPE scaling: inv_freq divided by factor",
    "llama3": (
        "llama3 RoPE scaling (smooth blend between inv_freq and inv_freq / factor by wavelength)"
    ),
    "yarn": (
        "YaRN (config uses the old key 'type'): inv_freq blended by a linear ramp between "
        "floor/ceil correction dims for beta_fast 32 and beta_slow 1 over "
        "original_max_position_embeddings; cos and sin multiplied by 0.1 * ln(factor) + 1"
    ),
    "dynamic": (
        "dynamic NTK RoPE with max_position_embeddings 64 < 100 prompt tokens. transformers "
        "recomputes inv_freq per forward call from seq_len = max(position) + 1 when that exceeds "
        "every length seen before: base' = theta * (factor * seq_len / max_pos - (factor - 1)) ^ "
        "(d / (d - 2)). logits.npy is one forward of the 100-token prompt (seq_len 100 for every "
        "position). In generate(), the prompt uses seq_len 100 and decode step i (position "
        "100 + i) uses seq_len 101 + i for the new token's q and k only; cached keys keep the "
        "rotation they were stored with. The greedy continuation follows those semantics"
    ),
}


def fixture_notes(fx, cfg):
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    parts = [
        f"{cfg['model_type']} family, {cfg['num_hidden_layers']} layers, "
        f"hidden {cfg['hidden_size']}, "
        f"{cfg['num_attention_heads']} q heads / {cfg['num_key_value_heads']} kv heads of dim "
        f"{head_dim_of(cfg)}, intermediate {cfg['intermediate_size']}, vocab {cfg['vocab_size']}",
        ROPE_NOTES[kind],
    ]
    if cfg["model_type"] == "qwen2":
        parts.append(
            "q/k/v projections have biases; sliding_window 32 is disabled by "
            "use_sliding_window false"
        )
    if cfg["model_type"] == "qwen3":
        parts.append(
            "per-head RMSNorm q_norm and k_norm before RoPE; head_dim 64 != hidden / heads"
        )
    if cfg["tie_word_embeddings"]:
        parts.append("tie_word_embeddings: no lm_head tensor, logits use model.embed_tokens")
    q = fx.get("quant")
    if q:
        parts.append(
            f"MLX affine {q['bits']}-bit, group {q['group_size']}, on every *_proj in the layers, "
            "model.embed_tokens and lm_head (if untied); norms bf16. weight uint32 "
            "[out, in*bits/32] (little-endian bit stream per row), scales and biases bf16 "
            "[out, in/group], w = scales * q + biases; scales are negative in groups whose "
            "maximum has the larger magnitude"
        )
        for module, o in q["overrides"].items():
            parts.append(f"override: {module} at {o['bits']}-bit, group {o['group_size']}")
        parts.append("the reference model holds the exact float64 values of scales * q + biases")
    parts.append(
        "reference: transformers in float64 on the CPU, eager attention; transformers itself "
        "computes RMSNorm, softmax and the RoPE tables in float32 within that"
    )
    return "; ".join(parts)


# --------------------------------------------------------------------------------------------


def make_fixture(fx, out_dir, weights_only):
    fx_dir = os.path.join(out_dir, fx["name"])
    if os.path.exists(fx_dir):
        shutil.rmtree(fx_dir)
    cfg, ref, stored = build_checkpoint(fx, fx_dir)
    size = os.path.getsize(os.path.join(fx_dir, "model.safetensors"))
    summary = {"name": fx["name"], "safetensors_bytes": size}
    if weights_only:
        return summary
    import torch
    import transformers

    check_with_safetensors_library(os.path.join(fx_dir, "model.safetensors"), stored)
    r = reference_outputs(fx, fx_dir, cfg, ref)
    np.save(os.path.join(fx_dir, "logits.npy"), r["logits"].astype(np.float32))
    rms = float(np.sqrt(np.mean(r["logits"] ** 2)))
    doc = {
        "family": cfg["model_type"],
        "variant": fx["name"],
        "tokens": r["tokens"],
        "greedy": r["greedy"],
        "greedy_top2_margin": r["margin_raw"],
        "greedy_top2_margin_rel": r["margin_rel"],
        "notes": fixture_notes(fx, cfg),
        "dtype": fx["dtype"],
        "quantization": cfg.get("quantization"),
        "logits_shape": list(r["logits"].shape),
        "logits_rms": rms,
        "eos_token_ids": eos_ids(cfg),
        "weights_seed": MODELS[fx["model"]]["seed"],
        "prompt_seed": r["prompt_seed"],
        "rel_err_float32_model": r["rel_err_float32_model"],
        "cached_vs_uncached_rel_err": r["cached_vs_uncached_rel_err"],
        "rope_parameters_transformers": r["rope_parameters"],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    with open(os.path.join(fx_dir, "reference.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    summary.update(
        logits_rms=round(rms, 3),
        min_margin_rel=round(min(r["margin_rel"]), 4),
        prompt_tries=r["prompt_tries"],
        rel_err_f32=f"{r['rel_err_float32_model']:.2e}",
        cached_vs_uncached=f"{r['cached_vs_uncached_rel_err']:.2e}",
        greedy=r["greedy"],
    )
    return summary


def run_fixtures(description, fixtures, make_one):
    """The command line every fixture script shares: OUT_DIR [--only NAME ...] [--weights-only];
    make_one(fx, out_dir, weights_only) writes one fixture and returns its summary. A failing
    fixture is reported and removed, and the others still run. Returns the exit status."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("out_dir")
    ap.add_argument("--only", nargs="*", help="fixture names (default: all)")
    ap.add_argument("--weights-only", action="store_true", help="write and check checkpoints only")
    args = ap.parse_args()
    wanted = [fx for fx in fixtures if not args.only or fx["name"] in args.only]
    if not args.weights_only:
        import torch
        import transformers

        torch.set_num_threads(min(8, os.cpu_count() or 1))
        print(
            f"torch {torch.__version__}, transformers {transformers.__version__}, "
            f"numpy {np.__version__}"
        )
    os.makedirs(args.out_dir, exist_ok=True)
    failed = []
    for fx in wanted:
        t0 = time.time()
        try:
            s = make_one(fx, args.out_dir, args.weights_only)
            print(f"ok   {fx['name']} ({time.time() - t0:.1f} s) {json.dumps(s)}", flush=True)
        except Exception:
            failed.append(fx["name"])
            print(f"FAIL {fx['name']}\n{traceback.format_exc()}", flush=True)
            shutil.rmtree(os.path.join(args.out_dir, fx["name"]), ignore_errors=True)
    print(f"{len(wanted) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main():
    return run_fixtures(__doc__.split("\n")[0], FIXTURES, make_fixture)


if __name__ == "__main__":
    sys.exit(main())
