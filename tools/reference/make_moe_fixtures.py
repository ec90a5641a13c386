#!/usr/bin/env python3
"""Tiny random-weight mixture-of-experts checkpoints (Qwen3-MoE, Mixtral, GPT-OSS) in mlx-lm's
layout and the outputs Hugging Face transformers gives for them.

The contract of make_fixtures.py: each fixture folder holds config.json as the family's
checkpoints write it, model.safetensors in mlx-lm's layout (experts stacked per layer as one
[experts, out, in] tensor, quantized along the last axis, the router quantized at 8 bits as
mlx-lm writes it), logits.npy and reference.json from transformers in float64 on the CPU. The
reference model is loaded by from_pretrained from the same weights written in the Hugging Face
per-expert layout (experts.N.gate_proj, or Mixtral's w1/w2/w3; GPT-OSS's fused, interleaved
gate_up_proj), so transformers' own loading maps them, as it does for a downloaded checkpoint.
The GPT-OSS fixtures exercise attention sinks, alternating sliding and full layers, YaRN with
truncate false, biases everywhere, the clamped SwiGLU, and (mxfp4) experts in MXFP4 with the
rest at 8 bits, as mlx-community's gpt-oss checkpoints are.

    python3 tools/reference/make_moe_fixtures.py OUT_DIR [--only NAME ...] [--weights-only]
"""

import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

# MXFP4's scales are one byte each.
mf.ST_ITEMSIZE.setdefault("U8", 1)

E, TOP_K = 4, 2


def _qwen3_moe():
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "decoder_sparse_step": 1,
        "eos_token_id": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 256,
        "max_position_embeddings": 512,
        "max_window_layers": 3,
        # Layer 1 is a dense MLP among MoE layers.
        "mlp_only_layers": [1],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 64,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts": E,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": 3,
        "num_key_value_heads": 2,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 256,
    }


def _mixtral():
    return {
        "architectures": ["MixtralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 4096,
        "model_type": "mixtral",
        "num_attention_heads": 4,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "num_local_experts": E,
        "output_router_logits": False,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.02,
        "router_jitter_noise": 0.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": 256,
    }


def _gpt_oss():
    return {
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "experts_per_token": TOP_K,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initial_context_length": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "layer_types": ["sliding_attention", "full_attention"],
        "max_position_embeddings": 128,
        "model_type": "gpt_oss",
        "num_attention_heads": 4,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "num_local_experts": E,
        "output_router_logits": False,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": 16,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": 256,
    }


MODELS = {
    "qwen3_moe": {"seed": 101, "config": _qwen3_moe()},
    "mixtral": {"seed": 111, "config": _mixtral()},
    "gpt_oss": {"seed": 121, "config": _gpt_oss()},
}


def _router8(cfg, quant):
    """mlx-lm quantizes the routers at 8 bits, written as one override per layer. quant is
    (bits, group_size) for affine, or (4, 32, "mxfp4"): what mlx-lm's convert --q-mode mxfp4
    writes, everything MXFP4 but the routers, whose entries carry no mode (affine to mlx-lm)."""
    over = {}
    mode = quant[2] if len(quant) > 2 else "affine"
    for layer in range(cfg["num_hidden_layers"]):
        if is_moe_layer(cfg, layer):
            m = f"model.layers.{layer}.{moe_prefix(cfg)}"
            over[m + router_name(cfg)] = {"bits": 8, "group_size": 64}
            if cfg["model_type"] == "gpt_oss" and mode == "affine":
                # mlx-community's MXFP4-Q8: the experts in MXFP4, everything else 8-bit.
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    over[m + "experts." + proj] = {"bits": 4, "group_size": 32, "mode": "mxfp4"}
    return {"bits": quant[0], "group_size": quant[1], "mode": mode, "overrides": over}


FIXTURES = [
    {"name": "qwen3_moe_bf16", "model": "qwen3_moe", "dtype": "bfloat16"},
    {"name": "qwen3_moe_q4_g64", "model": "qwen3_moe", "dtype": "bfloat16", "quant": (4, 64)},
    {"name": "mixtral_bf16", "model": "mixtral", "dtype": "bfloat16"},
    {"name": "gpt_oss_bf16", "model": "gpt_oss", "dtype": "bfloat16"},
    {"name": "gpt_oss_mxfp4_q8", "model": "gpt_oss", "dtype": "bfloat16", "quant": (8, 64)},
    # What `mlxcel quantize --mode mxfp4` must write from gpt_oss_bf16, byte for byte (MXFP4 by
    # MLX's GPU kernel; committed without reference outputs, as the quantizer's expected output).
    {"name": "gpt_oss_mxfp4", "model": "gpt_oss", "dtype": "bfloat16", "quant": (4, 32, "mxfp4"),
     "mxfp4": "mlx"},
]


def moe_prefix(cfg):
    return "block_sparse_moe." if cfg["model_type"] == "mixtral" else "mlp."


def router_name(cfg):
    return "router" if cfg["model_type"] == "gpt_oss" else "gate"


def experts_name(cfg):
    return "experts" if cfg["model_type"] == "gpt_oss" else "switch_mlp"


def is_moe_layer(cfg, layer):
    if cfg["model_type"] == "mixtral":
        return True
    step = cfg.get("decoder_sparse_step", 1)
    return layer not in cfg.get("mlp_only_layers", []) and (layer + 1) % step == 0


def expert_size(cfg):
    if cfg["model_type"] == "qwen3_moe":
        return cfg["moe_intermediate_size"]
    return cfg["intermediate_size"]


# --------------------------------------------------------------------------------------------
# Weights by mlx-lm name.


def master_weights(cfg, seed):
    rng = np.random.default_rng(seed)
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = {}

    def normal(name, shape, std):
        w[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def norm(name, n):
        w[name] = (1.0 + 0.2 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    oss = cfg["model_type"] == "gpt_oss"
    normal("model.embed_tokens.weight", (vocab, h), 1.0)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        norm(p + "input_layernorm.weight", h)
        normal(p + "self_attn.q_proj.weight", (nh * hd, h), 1.5 / math.sqrt(h))
        normal(p + "self_attn.k_proj.weight", (nkv * hd, h), 1.5 / math.sqrt(h))
        normal(p + "self_attn.v_proj.weight", (nkv * hd, h), 1.0 / math.sqrt(h))
        normal(p + "self_attn.o_proj.weight", (h, nh * hd), 1.0 / math.sqrt(nh * hd))
        if oss:
            for proj, n in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd), ("o", h)):
                normal(p + f"self_attn.{proj}_proj.bias", (n,), 0.3)
            # Sinks near the scores' scale, so that they take a visible share of the softmax.
            normal(p + "self_attn.sinks", (nh,), 1.0)
        if cfg["model_type"] == "qwen3_moe":
            norm(p + "self_attn.q_norm.weight", hd)
            norm(p + "self_attn.k_norm.weight", hd)
        norm(p + "post_attention_layernorm.weight", h)
        if is_moe_layer(cfg, layer):
            inter = expert_size(cfg)
            m = p + moe_prefix(cfg)
            # A wide router so that the choice of experts differs from token to token.
            r, x = m + router_name(cfg), m + experts_name(cfg)
            normal(r + ".weight", (E, h), 3.0 / math.sqrt(h))
            if oss:
                normal(r + ".bias", (E,), 0.5)
            # GPT-OSS clamps gate at 7 and up at +-7: scales that reach the clamps.
            gs = 4.0 if oss else 1.5
            normal(x + ".gate_proj.weight", (E, inter, h), gs / math.sqrt(h))
            normal(x + ".up_proj.weight", (E, inter, h), gs / math.sqrt(h))
            normal(x + ".down_proj.weight", (E, h, inter), 2.0 / math.sqrt(inter))
            if oss:
                normal(x + ".gate_proj.bias", (E, inter), 0.5)
                normal(x + ".up_proj.bias", (E, inter), 0.5)
                normal(x + ".down_proj.bias", (E, h), 0.2)
        else:
            inter = cfg["intermediate_size"]
            normal(p + "mlp.gate_proj.weight", (inter, h), 1.5 / math.sqrt(h))
            normal(p + "mlp.up_proj.weight", (inter, h), 1.5 / math.sqrt(h))
            normal(p + "mlp.down_proj.weight", (h, inter), 1.0 / math.sqrt(inter))
    norm("model.norm.weight", h)
    normal("lm_head.weight", (vocab, h), 4.0 / math.sqrt(h))
    return w


def hf_weights(cfg, ref):
    """The reference weights under Hugging Face's per-expert names (GPT-OSS: its fused
    gate_up_proj [experts, in, 2 * inter] with gate and up interleaved, down_proj [experts,
    inter, out], and their biases)."""
    out = {}
    if cfg["model_type"] == "gpt_oss":
        for name, w in ref.items():
            if ".experts." not in name:
                out[name] = w
        for layer in range(cfg["num_hidden_layers"]):
            x = f"model.layers.{layer}.mlp.experts."
            g, u = ref[x + "gate_proj.weight"], ref[x + "up_proj.weight"]
            gu = np.empty((g.shape[0], g.shape[2], 2 * g.shape[1]))
            gu[:, :, 0::2], gu[:, :, 1::2] = g.transpose(0, 2, 1), u.transpose(0, 2, 1)
            gub = np.empty((g.shape[0], 2 * g.shape[1]))
            gub[:, 0::2], gub[:, 1::2] = ref[x + "gate_proj.bias"], ref[x + "up_proj.bias"]
            out[x + "gate_up_proj"], out[x + "gate_up_proj_bias"] = gu, gub
            out[x + "down_proj"] = ref[x + "down_proj.weight"].transpose(0, 2, 1)
            out[x + "down_proj_bias"] = ref[x + "down_proj.bias"]
        return out
    for name, w in ref.items():
        if ".switch_mlp." not in name:
            out[name] = w
            continue
        head, proj = name.split(".switch_mlp.")
        proj = proj[: -len(".weight")]
        if cfg["model_type"] == "mixtral":
            proj = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}[proj]
        for e in range(w.shape[0]):
            out[f"{head}.experts.{e}.{proj}.weight"] = w[e]
    return out


def quantizable(name):
    return (
        name in ("model.embed_tokens.weight", "lm_head.weight")
        or (name.startswith("model.layers.") and name.endswith("_proj.weight"))
        or name.endswith((".gate.weight", ".router.weight"))
    )


def quant_spec(fx, cfg, name):
    """(bits, group_size, mode) of a weight, or None when it stays bf16."""
    q = fx.get("quant")
    if not q or not quantizable(name):
        return None
    spec = _router8(cfg, q)
    o = spec["overrides"].get(name[: -len(".weight")])
    if o:
        return o["bits"], o["group_size"], o.get("mode", "affine")
    return spec["bits"], spec["group_size"], spec["mode"]


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def mxfp4_quantize(w):
    """w [rows, in] -> codes [rows, in] (E2M1: bit 3 the sign, bits 0-2 an index into E2M1)
    and E8M0 scale bytes [rows, in / 32]: each group of 32 shares the power of two that brings
    its largest magnitude to at most 6, each value rounded to the nearest E2M1 magnitude.
    A tie goes to the smaller magnitude, where MLX's GPU kernel (mlx_mxfp4_quantize) goes to
    the even code: gpt_oss_mxfp4_q8 was made with this one and keeps it, its reference logits
    having been computed from these weights; a loader reads either."""
    rows, n = w.shape
    g = w.reshape(rows, n // 32, 32).astype(np.float64)
    amax = np.abs(g).max(axis=-1)
    e = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)), -127)
    e = np.clip(e, -127, 127)
    v = g / np.exp2(e)[..., None]
    idx = np.abs(np.abs(v)[..., None] - E2M1).argmin(axis=-1)
    codes = (idx | np.where(v < 0, 8, 0)).astype(np.uint32).reshape(rows, n)
    return codes, (e + 127).astype(np.uint8)


def mlx_mxfp4_quantize(w):
    """As mxfp4_quantize, the way MLX's GPU kernels write MXFP4 (fp_quantize, Metal and CUDA),
    in float32 as there: the scale is the smallest power of two at or above the group's
    largest magnitude / 6 (exponent within [-127, 127]; an all-zero group gets byte 0), and
    each value / scale rounds to the nearest E2M1 magnitude, a tie to the even code, with the
    value's sign bit (a small negative value becomes code 8, -0)."""
    rows, n = w.shape
    g = w.reshape(rows, n // 32, 32).astype(np.float32)
    x = (np.abs(g).max(axis=-1) / np.float32(6.0)).astype(np.float32)
    frac, exp = np.frexp(x)  # x = frac * 2^exp, frac in [0.5, 1)
    e = np.where(x > 0, np.where(frac == 0.5, exp - 1, exp), -127)
    e = np.clip(e, -127, 127)
    v = g.astype(np.float64) * np.exp2(-e.astype(np.float64))[..., None]
    a = np.abs(v)
    mids = (E2M1[:-1] + E2M1[1:]) / 2
    idx = np.searchsorted(mids, a, side="left")  # midpoints below a: the nearest, ties low
    tie = (idx < 7) & (a == mids[np.minimum(idx, 6)])
    idx = np.where(tie & (idx % 2 == 1), idx + 1, idx)
    codes = (idx | np.where(np.signbit(v), 8, 0)).astype(np.uint32).reshape(rows, n)
    return codes, (e + 127).astype(np.uint8)


def mxfp4_decode(codes, scale_bytes):
    rows, n = codes.shape
    mag = E2M1[codes & 7] * np.where(codes & 8, -1.0, 1.0)
    s = np.exp2(scale_bytes.astype(np.float64) - 127)
    return (mag.reshape(rows, n // 32, 32) * s[..., None]).reshape(rows, n)


def config_json(fx):
    cfg = json.loads(json.dumps(MODELS[fx["model"]]["config"]))
    cfg["torch_dtype"] = fx["dtype"]
    q = fx.get("quant")
    if q:
        spec = _router8(cfg, q)
        qcfg = {"group_size": spec["group_size"], "bits": spec["bits"]}
        if len(q) > 2:
            qcfg["mode"] = spec["mode"]
        qcfg.update(spec["overrides"])
        cfg["quantization"] = qcfg
        cfg["quantization_config"] = json.loads(json.dumps(qcfg))
    return dict(sorted(cfg.items()))


def build_checkpoint(fx, fx_dir):
    model = MODELS[fx["model"]]
    cfg = model["config"]
    master = master_weights(cfg, model["seed"])
    stored, ref = {}, {}
    for name, w in master.items():
        spec = quant_spec(fx, cfg, name)
        if spec is None:
            b = mf.bf16_bits(w)
            stored[name] = ("BF16", b)
            ref[name] = mf.bf16_to_f64(b)
            continue
        bits, group, mode = spec
        module = name[: -len(".weight")]
        flat = w.reshape(-1, w.shape[-1])
        lead = w.shape[:-1]
        if mode == "mxfp4":
            quantize = mlx_mxfp4_quantize if fx.get("mxfp4") == "mlx" else mxfp4_quantize
            codes, sbytes = quantize(mf.bf16_to_f64(mf.bf16_bits(flat)))
            stored[name] = ("U32", mf.pack_codes(codes, 4).reshape(*lead, -1))
            stored[module + ".scales"] = ("U8", sbytes.reshape(*lead, -1))
            ref[name] = mxfp4_decode(codes, sbytes).reshape(w.shape)
            continue
        packed, s_bits, b_bits, ref[name] = mf.quantize_stored(w, bits, group)
        stored[name] = ("U32", packed)
        stored[module + ".scales"] = ("BF16", s_bits)
        stored[module + ".biases"] = ("BF16", b_bits)
    os.makedirs(fx_dir, exist_ok=True)
    cj = config_json(fx)
    with open(os.path.join(fx_dir, "config.json"), "w") as f:
        json.dump(cj, f, indent=2)
        f.write("\n")
    path = os.path.join(fx_dir, "model.safetensors")
    mf.write_safetensors(path, stored)
    # Read back independently (stacked tensors as their 2-D [experts * out, in] rows).
    _, raw = mf.read_safetensors(path)
    assert set(raw) == set(stored)
    for name, want in ref.items():
        tag, shape, data = raw[name]
        spec = quant_spec(fx, cfg, name)
        if spec is None:
            got = mf.decode_float(tag, shape, data)
        elif spec[2] == "mxfp4":
            words = np.frombuffer(data, dtype="<u4").reshape(-1, shape[-1])
            codes = mf.unpack_codes(words, 4, shape[-1] * 8).astype(np.uint32)
            st, ss, sd = raw[name[: -len(".weight")] + ".scales"]
            assert st == "U8", f"{name}: MXFP4 scales stored as {st}"
            sbytes = np.frombuffer(sd, dtype=np.uint8).reshape(-1, shape[-1] * 8 // 32)
            got = mxfp4_decode(codes, sbytes).reshape(want.shape)
        else:
            bits, group, _ = spec
            module = name[: -len(".weight")]
            words = np.frombuffer(data, dtype="<u4").reshape(-1, shape[-1])
            n_in = shape[-1] * 32 // bits
            codes = mf.unpack_codes(words, bits, n_in).astype(np.float64)
            st, ss, sd = raw[module + ".scales"]
            bt, bs, bd = raw[module + ".biases"]
            scales = mf.decode_float(st, ss, sd).reshape(-1, n_in // group)
            biases = mf.decode_float(bt, bs, bd).reshape(-1, n_in // group)
            got = (np.repeat(scales, group, 1) * codes + np.repeat(biases, group, 1)).reshape(
                want.shape
            )
        assert np.array_equal(got, want), f"{name}: does not decode to the reference"
    return cj, ref, stored


# --------------------------------------------------------------------------------------------
# transformers side.


def check_with_safetensors_library(path, stored):
    """make_fixtures.py's check, with MXFP4's uint8 scales."""
    import torch
    from safetensors import safe_open

    dtypes = {"BF16": torch.bfloat16, "U32": torch.uint32, "U8": torch.uint8}
    width = {"BF16": torch.int16, "U32": torch.int32, "U8": torch.uint8}
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "mlx"}, f.metadata()
        assert set(f.keys()) == set(stored), "safetensors sees other tensor names"
        for name in f.keys():
            tag, arr = stored[name]
            t = f.get_tensor(name)
            assert t.dtype == dtypes[tag] and tuple(t.shape) == arr.shape, name
            got = t.contiguous().view(width[tag]).numpy().view(arr.dtype)
            assert np.array_equal(got.view(np.uint8), arr.view(np.uint8)), f"{name}: bytes differ"


def load_hf(cfg, ref, torch_dtype):
    import transformers
    from safetensors.numpy import save_file

    with tempfile.TemporaryDirectory() as tmp:
        plain = dict(cfg)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(plain, f)
        save_file(
            {k: np.ascontiguousarray(v, dtype=np.float64) for k, v in hf_weights(cfg, ref).items()},
            os.path.join(tmp, "model.safetensors"),
            metadata={"format": "pt"},
        )
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            tmp, dtype=torch_dtype, attn_implementation="eager", output_loading_info=True
        )
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"} or (
        info.get("error_msgs") or None
    )
    assert not bad, f"loading the per-expert checkpoint: {bad}"
    # The grouped-GEMM experts take no float64; the eager loop over experts is the reference.
    model.set_experts_implementation("eager")
    assert type(model).__name__ == cfg["architectures"][0], type(model).__name__
    if cfg["model_type"] == "gpt_oss":
        assert model.config.layer_types == cfg["layer_types"], model.config.layer_types
    n_ref = sum(v.size for v in ref.values())
    n_model = sum(p.numel() for p in model.parameters())
    assert n_model == n_ref, f"{n_model} parameters in the model, {n_ref} in the checkpoint"
    return model.eval()


def reference_outputs(fx, cfg, ref):
    import torch

    model = load_hf(cfg, ref, torch.float64)
    specials = {0, 1, 2, 3}
    seed0 = MODELS[fx["model"]]["seed"] * 1000
    for attempt in range(mf.MAX_PROMPT_TRIES):
        rng = np.random.default_rng(seed0 + attempt)
        tokens = [1] + rng.integers(mf.FIRST_ORDINARY_ID, cfg["vocab_size"], mf.N_PROMPT - 1).tolist()
        new, step_logits = mf.greedy(model, tokens)
        if len(new) != mf.N_GREEDY or specials & set(new) or len(set(new)) < mf.MIN_DISTINCT_GREEDY:
            continue
        raw, rel = mf.margins(step_logits)
        if rel.min() >= mf.MIN_REL_MARGIN:
            break
    else:
        raise AssertionError(f"no prompt gives a usable continuation; the last: {new}")
    logits = mf.forward_logits(model, tokens)
    rms = float(np.sqrt(np.mean(logits**2)))
    assert 1.0 <= rms and np.abs(logits).max() < 1e3, f"logits RMS {rms}"
    full = mf.forward_logits(model, tokens + new[:-1])[mf.N_PROMPT - 1 :]
    assert np.argmax(full, axis=1).tolist() == new, "uncached forward disagrees with generate"
    cached_vs_full = mf.rel_err(step_logits, full)
    assert cached_vs_full < 1e-6, f"cached vs uncached logits: {cached_vs_full}"
    logits32 = mf.forward_logits(load_hf(cfg, ref, torch.float32), tokens)
    return {
        "tokens": tokens,
        "logits": logits,
        "greedy": new,
        "margin_raw": raw.tolist(),
        "margin_rel": rel.tolist(),
        "prompt_seed": seed0 + attempt,
        "rel_err_float32_model": mf.rel_err(logits32, logits),
        "cached_vs_uncached_rel_err": cached_vs_full,
    }


def make_fixture(fx, out_dir, weights_only):
    fx_dir = os.path.join(out_dir, fx["name"])
    if os.path.exists(fx_dir):
        shutil.rmtree(fx_dir)
    cj, ref, stored = build_checkpoint(fx, fx_dir)
    summary = {"name": fx["name"], "bytes": os.path.getsize(os.path.join(fx_dir, "model.safetensors"))}
    if weights_only:
        return summary
    import torch
    import transformers

    check_with_safetensors_library(os.path.join(fx_dir, "model.safetensors"), stored)
    cfg = MODELS[fx["model"]]["config"]
    r = reference_outputs(fx, cfg, ref)
    np.save(os.path.join(fx_dir, "logits.npy"), r["logits"].astype(np.float32))
    doc = {
        "family": cfg["model_type"],
        "variant": fx["name"],
        "tokens": r["tokens"],
        "greedy": r["greedy"],
        "greedy_top2_margin": r["margin_raw"],
        "greedy_top2_margin_rel": r["margin_rel"],
        "dtype": fx["dtype"],
        "quantization": cj.get("quantization"),
        "logits_shape": list(r["logits"].shape),
        "logits_rms": float(np.sqrt(np.mean(r["logits"] ** 2))),
        "eos_token_ids": [cfg["eos_token_id"]],
        "weights_seed": MODELS[fx["model"]]["seed"],
        "prompt_seed": r["prompt_seed"],
        "rel_err_float32_model": r["rel_err_float32_model"],
        "cached_vs_uncached_rel_err": r["cached_vs_uncached_rel_err"],
        "notes": f"{E} experts, top {TOP_K}, stacked in mlx-lm's layout; reference: transformers "
        "in float64 on the CPU from the per-expert Hugging Face layout; see "
        "tools/reference/make_moe_fixtures.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    with open(os.path.join(fx_dir, "reference.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    summary.update(min_margin_rel=round(min(r["margin_rel"]), 4), greedy=r["greedy"],
                   rel_err_f32=f"{r['rel_err_float32_model']:.2e}")
    return summary


def main():
    return mf.run_fixtures(__doc__.split("\n")[0], FIXTURES, make_fixture)


if __name__ == "__main__":
    sys.exit(main())
