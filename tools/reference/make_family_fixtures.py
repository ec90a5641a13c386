#!/usr/bin/env python3
"""Tiny random-weight checkpoints of the families past Llama (Gemma 2, Gemma 3, Phi-3, OLMo 2,
Granite) and the outputs Hugging Face transformers gives for them.

The same contract as make_fixtures.py (whose writer, quantizer, independent reader and greedy
checks this script reuses): each fixture is a folder with config.json as the family's real
checkpoints write it, model.safetensors (Hugging Face names, or mlx-vlm's for the Gemma 3
vision-language layout), logits.npy and reference.json from transformers in float64 on the CPU.
Each family's fixture has a prompt (100 tokens) longer than its sliding window, so a runtime that
ignores the window, or clamps the whole context to it, fails.

    python3 tools/reference/make_family_fixtures.py OUT_DIR [--only NAME ...] [--weights-only]
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

# --------------------------------------------------------------------------------------------
# Configs, as the family's checkpoints write them (transformers 4 keys), scaled down. Token ids
# 0..3 are pad, bos and two eos ids in all of them.


def _gemma2():
    return {
        "architectures": ["Gemma2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        # Small caps, so that tanh bends the scores and the logits instead of passing them.
        "attn_logit_softcapping": 8.0,
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "final_logit_softcapping": 15.0,
        "head_dim": 64,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 256,
        "max_position_embeddings": 8192,
        "model_type": "gemma2",
        "num_attention_heads": 4,
        "num_hidden_layers": 4,
        "num_key_value_heads": 2,
        "pad_token_id": 0,
        # Not head_dim, so that a runtime scaling by 1/sqrt(head_dim) fails.
        "query_pre_attn_scalar": 48,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "sliding_window": 24,
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": 256,
    }


def _gemma3_text():
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "final_logit_softcapping": None,
        # Gemma 3's real head size, which the fast kernels must take.
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 256,
        "max_position_embeddings": 32768,
        "model_type": "gemma3_text",
        "num_attention_heads": 2,
        "num_hidden_layers": 4,
        "num_key_value_heads": 1,
        "pad_token_id": 0,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "rope_theta": 1000000.0,
        "sliding_window": 16,
        # Layers 0, 1 local, 2 global, 3 local.
        "sliding_window_pattern": 3,
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": 256,
    }


def _gemma3_vlm_text():
    """text_config of a Gemma 3 vision-language checkpoint, as sparse as Google's: what it
    leaves out (head_dim 256, query_pre_attn_scalar 256, rope_theta 1e6, rope_local_base_freq
    1e4, sliding_window_pattern 6, rms_norm_eps 1e-6, gelu_pytorch_tanh) takes
    Gemma3TextConfig's defaults, which a runtime must know."""
    return {
        "hidden_size": 128,
        "intermediate_size": 256,
        "model_type": "gemma3_text",
        "num_attention_heads": 2,
        "num_hidden_layers": 7,
        "num_key_value_heads": 1,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 20,
        "vocab_size": 256,
    }


def _phi3(longrope, partial, tied, window, hidden=128, heads=4, kv_heads=2):
    cfg = {
        "architectures": ["Phi3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "embd_pdrop": 0.0,
        "eos_token_id": [2, 3],
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 256,
        "max_position_embeddings": 4096,
        "model_type": "phi3",
        "num_attention_heads": heads,
        "num_hidden_layers": 2,
        "num_key_value_heads": kv_heads,
        "original_max_position_embeddings": 4096,
        "pad_token_id": 0,
        "partial_rotary_factor": partial,
        "resid_pdrop": 0.0,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "sliding_window": window,
        "tie_word_embeddings": tied,
        "use_cache": True,
        "vocab_size": 256,
    }
    if longrope:
        rot = int(hidden // heads * partial) // 2
        rng = np.random.default_rng(7)
        # Long context past original_max_position_embeddings (64 < the 100-token prompt), so
        # transformers uses long_factor for every position; short_factor differs so that a
        # runtime taking the wrong list fails.
        cfg["original_max_position_embeddings"] = 64
        cfg["max_position_embeddings"] = 1024
        cfg["rope_scaling"] = {
            "long_factor": [round(float(x), 4) for x in 1.0 + 3.0 * rng.random(rot)],
            "short_factor": [round(float(x), 4) for x in 1.0 + 0.2 * rng.random(rot)],
            "type": "longrope",
        }
    return cfg


def _olmo2():
    return {
        "architectures": ["Olmo2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 256,
        "max_position_embeddings": 4096,
        "model_type": "olmo2",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": 256,
    }


def _granite():
    return {
        "architectures": ["GraniteForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        # Each multiplier away from what a Llama runtime would do by default.
        "attention_multiplier": 0.05,
        "bos_token_id": 1,
        "embedding_multiplier": 12.0,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 256,
        "logits_scaling": 2.0,
        "max_position_embeddings": 4096,
        "mlp_bias": False,
        "model_type": "granite",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pad_token_id": 0,
        "residual_multiplier": 0.22,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": 256,
    }


MODELS = {
    "gemma2": {"seed": 51, "config": _gemma2()},
    "gemma3_text": {"seed": 61, "config": _gemma3_text()},
    "gemma3_vlm": {"seed": 62, "config": _gemma3_vlm_text(), "vlm": True},
    "phi3_long": {"seed": 71, "config": _phi3(True, 0.75, True, None)},
    "phi3_window": {"seed": 72, "config": _phi3(False, 1.0, False, 40)},
    # Phi-3-mini-4k's head_dim 96, no GQA, and its window on every layer (no rope scaling:
    # longrope switching tables at original_max_position_embeddings gives token-by-token decode
    # other keys than one forward over the prompt, and test_fixtures_window compares the two).
    "phi3_hd96": {
        "seed": 73,
        "config": _phi3(False, 1.0, False, 40, hidden=192, heads=2, kv_heads=2),
    },
    "olmo2": {"seed": 81, "config": _olmo2()},
    "granite": {"seed": 91, "config": _granite()},
}

FIXTURES = [
    {"name": "gemma2_bf16", "model": "gemma2", "dtype": "bfloat16"},
    {"name": "gemma3_text_bf16", "model": "gemma3_text", "dtype": "bfloat16"},
    {"name": "gemma3_vlm_q4_g64", "model": "gemma3_vlm", "dtype": "bfloat16", "quant": mf._q(4, 64)},
    {"name": "phi3_long_bf16", "model": "phi3_long", "dtype": "bfloat16"},
    {"name": "phi3_window_q4_g64", "model": "phi3_window", "dtype": "bfloat16", "quant": mf._q(4, 64)},
    {"name": "phi3_hd96_q4_g64", "model": "phi3_hd96", "dtype": "bfloat16", "quant": mf._q(4, 64)},
    {"name": "olmo2_bf16", "model": "olmo2", "dtype": "bfloat16"},
    {"name": "granite_bf16", "model": "granite", "dtype": "bfloat16"},
]

GEMMA3_DEFAULTS = {
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "sliding_window_pattern": 6,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
}


def full_text_config(model):
    """The text model's config with every default filled in (what transformers sees)."""
    cfg = dict(model["config"])
    if model.get("vlm"):
        for k, v in GEMMA3_DEFAULTS.items():
            cfg.setdefault(k, v)
        cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    return cfg


def family(cfg):
    return cfg["model_type"]


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def expected_layer_types(cfg):
    """What the config means to us; reference.json records what transformers made of it, which
    the runtime's tests compare against."""
    n = cfg["num_hidden_layers"]
    fam = family(cfg)
    if fam == "gemma2":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if fam == "gemma3_text":
        p = cfg.get("sliding_window_pattern", 6)
        return ["sliding_attention" if (i + 1) % p else "full_attention" for i in range(n)]
    if fam == "phi3" and cfg.get("sliding_window"):
        return ["sliding_attention"] * n
    return ["full_attention"] * n


# --------------------------------------------------------------------------------------------
# Weights by Hugging Face (text) name, drawn in a fixed order.


def master_weights(cfg, seed):
    rng = np.random.default_rng(seed)
    fam = family(cfg)
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nh, nkv = head_dim(cfg), cfg["num_attention_heads"], cfg["num_key_value_heads"]
    gemma = fam in ("gemma2", "gemma3_text")
    w = {}

    def normal(name, shape, std):
        w[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(
            np.float32
        )

    def norm(name, n):
        # Gemma stores w for a (1 + w) scale: small values around 0; the others store the
        # scale itself, around 1. Either way the effective scale is 1 +- 0.2.
        base = 0.0 if gemma else 1.0
        w[name] = (base + 0.2 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    tied = cfg.get("tie_word_embeddings", True)
    # Gemma scales the embedding by sqrt(hidden) (11.3 here), granite by its multiplier (12):
    # granite's is drawn smaller so that the residual stream stays near unit scale.
    emb_std = 0.1 if fam == "granite" else 0.3 if tied else 1.0
    if gemma:
        # Tied and scaled by sqrt(hidden): at the usual 0.3 each token's own row would win
        # every step. Small rows here, and a final norm scale near 3 (below) to keep the
        # logits sharp.
        emb_std = 0.05 if fam == "gemma2" else 0.03
    normal("model.embed_tokens.weight", (vocab, h), emb_std)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        if fam != "olmo2":
            norm(p + "input_layernorm.weight", h)
        if fam == "phi3":
            normal(p + "self_attn.qkv_proj.weight", ((nh + 2 * nkv) * hd, h), 1.5 / math.sqrt(h))
        else:
            normal(p + "self_attn.q_proj.weight", (nh * hd, h), 1.5 / math.sqrt(h))
            normal(p + "self_attn.k_proj.weight", (nkv * hd, h), 1.5 / math.sqrt(h))
            normal(p + "self_attn.v_proj.weight", (nkv * hd, h), 1.0 / math.sqrt(h))
        normal(p + "self_attn.o_proj.weight", (h, nh * hd), 1.0 / math.sqrt(nh * hd))
        if fam == "gemma3_text":
            norm(p + "self_attn.q_norm.weight", hd)
            norm(p + "self_attn.k_norm.weight", hd)
        if fam == "olmo2":
            norm(p + "self_attn.q_norm.weight", nh * hd)
            norm(p + "self_attn.k_norm.weight", nkv * hd)
        norm(p + "post_attention_layernorm.weight", h)
        if gemma:
            norm(p + "pre_feedforward_layernorm.weight", h)
        if gemma or fam == "olmo2":
            norm(p + "post_feedforward_layernorm.weight", h)
        if fam == "phi3":
            normal(p + "mlp.gate_up_proj.weight", (2 * inter, h), 1.5 / math.sqrt(h))
        else:
            normal(p + "mlp.gate_proj.weight", (inter, h), 1.5 / math.sqrt(h))
            normal(p + "mlp.up_proj.weight", (inter, h), 1.5 / math.sqrt(h))
        normal(p + "mlp.down_proj.weight", (h, inter), 1.0 / math.sqrt(inter))
    norm("model.norm.weight", h)
    if fam == "gemma3_text":
        # Gemma 3's q/k norms flatten the scores, so the next token depends mostly on the
        # current one and greedy falls into a loop; larger post-norm scales give the context
        # more weight (found by trying a few scales; 2 is the first that passes the checks).
        for name in w:
            if name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
                w[name] += np.float32(1.0)
    if gemma:
        w["model.norm.weight"] += np.float32(2.0 if fam == "gemma2" else 4.0)
    if not tied:
        normal("lm_head.weight", (vocab, h), 4.0 / math.sqrt(h))
    return w


# mlx-vlm's names for a Gemma 3 vision-language checkpoint: the text model under
# language_model., a vision tower and projector the text runtime must ignore.
VLM_PREFIX = "language_model."
VLM_EXTRA = {
    "vision_tower.vision_model.embeddings.patch_embedding.weight": (16, 2, 2, 3),
    "vision_tower.vision_model.post_layernorm.weight": (16,),
    "multi_modal_projector.mm_input_projection_weight": (16, 128),
    "multi_modal_projector.mm_soft_emb_norm.weight": (16,),
}


def stored_name(model, name):
    return VLM_PREFIX + name if model.get("vlm") else name


def config_json(fx):
    model = MODELS[fx["model"]]
    text = json.loads(json.dumps(model["config"]))
    q = fx.get("quant")
    qcfg = None
    if q:
        qcfg = {"group_size": q["group_size"], "bits": q["bits"]}
        qcfg.update(q["overrides"])
    if not model.get("vlm"):
        cfg = text
        cfg["torch_dtype"] = fx["dtype"]
    else:
        cfg = {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "boi_token_index": 250,
            "eoi_token_index": 251,
            "eos_token_id": [2, 3],
            "image_token_index": 252,
            "initializer_range": 0.02,
            "mm_tokens_per_image": 4,
            "model_type": "gemma3",
            "text_config": text,
            "torch_dtype": fx["dtype"],
            "vision_config": {
                "hidden_size": 16,
                "image_size": 8,
                "intermediate_size": 32,
                "model_type": "siglip_vision_model",
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
                "patch_size": 2,
            },
        }
    if qcfg:
        cfg["quantization"] = qcfg
        cfg["quantization_config"] = json.loads(json.dumps(qcfg))
    return dict(sorted(cfg.items()))


def build_checkpoint(fx, fx_dir):
    model = MODELS[fx["model"]]
    text_cfg = full_text_config(model)
    cfg = config_json(fx)
    master = master_weights(text_cfg, model["seed"])
    quant_of = mf.quant_lookup(fx.get("quant"))
    stored, ref = {}, {}
    for name, w in master.items():
        spec = quant_of(name[: -len(".weight")]) if name.endswith(".weight") else None
        sname = stored_name(model, name)
        if spec is None:
            b = mf.bf16_bits(w)
            stored[sname] = ("BF16", b)
            ref[name] = mf.bf16_to_f64(b)
        else:
            bits, group = spec
            module = sname[: -len(".weight")]
            packed, s_bits, b_bits, ref[name] = mf.quantize_stored(w, bits, group)
            stored[sname] = ("U32", packed)
            stored[module + ".scales"] = ("BF16", s_bits)
            stored[module + ".biases"] = ("BF16", b_bits)
    if model.get("vlm"):
        rng = np.random.default_rng(model["seed"] + 1)
        for name, shape in VLM_EXTRA.items():
            stored[name] = ("BF16", mf.bf16_bits(rng.standard_normal(shape, dtype=np.float32)))
    os.makedirs(fx_dir, exist_ok=True)
    with open(os.path.join(fx_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    path = os.path.join(fx_dir, "model.safetensors")
    mf.write_safetensors(path, stored)

    # Read back independently: the text tensors decode to the reference weights.
    def stored_quant_of(module):
        if model.get("vlm"):
            if not module.startswith(VLM_PREFIX):
                return None
            module = module[len(VLM_PREFIX) :]
        return quant_of(module)

    decoded = mf.decode_checkpoint(path, stored_quant_of)
    if model.get("vlm"):
        for name in VLM_EXTRA:
            decoded.pop(name)
        decoded = {k[len(VLM_PREFIX) :]: v for k, v in decoded.items()}
    assert set(decoded) == set(ref), f"tensor names differ: {set(decoded) ^ set(ref)}"
    for name in ref:
        assert np.array_equal(decoded[name], ref[name]), f"{name}: does not decode to the reference"
    return cfg, text_cfg, ref, stored


# --------------------------------------------------------------------------------------------
# transformers side.


def load_hf(text_cfg, ref, torch_dtype):
    """The text model built from its config and given exactly the reference weights."""
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(dict(text_cfg, architectures=[hf_class(text_cfg)]), f)
        hf_cfg = transformers.AutoConfig.from_pretrained(tmp)
    model = transformers.AutoModelForCausalLM.from_config(
        hf_cfg, dtype=torch_dtype, attn_implementation="eager"
    )
    state = {k: torch.from_numpy(v).to(torch_dtype) for k, v in ref.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = text_cfg.get("tie_word_embeddings", True)
    assert not unexpected, f"unexpected tensors {unexpected}"
    assert set(missing) <= ({"lm_head.weight"} if tied else set()), f"missing tensors {missing}"
    return model.eval(), hf_cfg


def hf_class(cfg):
    return {
        "gemma2": "Gemma2ForCausalLM",
        "gemma3_text": "Gemma3ForCausalLM",
        "phi3": "Phi3ForCausalLM",
        "olmo2": "Olmo2ForCausalLM",
        "granite": "GraniteForCausalLM",
    }[family(cfg)]


def check_hf(model, hf_cfg, text_cfg, ref):
    import torch

    assert type(model).__name__ == hf_class(text_cfg), type(model).__name__
    assert model.config._attn_implementation == "eager"
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        assert getattr(hf_cfg, key) == text_cfg[key], key
    hd = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
    assert hd == head_dim(text_cfg), f"head_dim {hd}"
    params = dict(model.named_parameters())
    tied = text_cfg.get("tie_word_embeddings", True)
    want = set(ref) - ({"lm_head.weight"} if tied else set())
    assert set(params) == want, f"parameters differ: {set(params) ^ want}"
    for name, p in params.items():
        assert torch.equal(p.detach().to(torch.float64), torch.from_numpy(ref[name])), name


def rope_tables(model):
    """Every inverse-frequency table the model holds, with its attention scaling, by name."""
    import torch

    out = {}
    for name, buf in model.named_buffers():
        if "inv_freq" in name and "original" not in name:
            out[name] = buf.detach().to(torch.float64).cpu().numpy().tolist()
    for name, mod in model.named_modules():
        s = getattr(mod, "attention_scaling", None)
        if s is not None and not callable(s):
            out[name + ".attention_scaling"] = s if isinstance(s, (int, float)) else str(s)
    return out


def reference_outputs(fx, text_cfg, ref):
    import torch

    f64 = torch.float64
    model, hf_cfg = load_hf(text_cfg, ref, f64)
    check_hf(model, hf_cfg, text_cfg, ref)
    eos = text_cfg.get("eos_token_id", [2, 3])
    specials = {0, 1, *(eos if isinstance(eos, list) else [eos])}
    seed0 = MODELS[fx["model"]]["seed"] * 1000
    for attempt in range(mf.MAX_PROMPT_TRIES):
        rng = np.random.default_rng(seed0 + attempt)
        tokens = [1] + rng.integers(
            mf.FIRST_ORDINARY_ID, text_cfg["vocab_size"], mf.N_PROMPT - 1
        ).tolist()
        new, step_logits = mf.greedy(model, tokens)
        if (
            len(new) != mf.N_GREEDY
            or specials & set(new)
            or len(set(new)) < mf.MIN_DISTINCT_GREEDY
        ):
            continue
        raw, rel = mf.margins(step_logits)
        if rel.min() >= mf.MIN_REL_MARGIN:
            break
    else:
        raise AssertionError(
            f"no prompt gives a usable continuation; the last: {new}, min margin "
            f"{mf.margins(step_logits)[1].min():.4f}"
        )
    assert np.argmax(step_logits, axis=1).tolist() == new
    logits = mf.forward_logits(model, tokens)
    assert logits.shape == (mf.N_PROMPT, text_cfg["vocab_size"])
    assert np.all(np.isfinite(logits))
    rms = float(np.sqrt(np.mean(logits**2)))
    assert 1.0 <= rms and np.abs(logits).max() < 1e3, f"logits RMS {rms}"
    full = mf.forward_logits(model, tokens + new[:-1])[mf.N_PROMPT - 1 :]
    cached_vs_full = mf.rel_err(step_logits, full)
    assert mf.rel_err(step_logits[0], logits[-1]) < 1e-6, "generate's first step vs forward"
    assert np.argmax(full, axis=1).tolist() == new, "uncached forward disagrees with generate"
    assert cached_vs_full < 1e-6, f"cached vs uncached logits: {cached_vs_full}"
    model32, _ = load_hf(text_cfg, ref, torch.float32)
    logits32 = mf.forward_logits(model32, tokens)
    return {
        "tokens": tokens,
        "logits": logits,
        "greedy": new,
        "margin_raw": raw.tolist(),
        "margin_rel": rel.tolist(),
        "prompt_seed": seed0 + attempt,
        "rel_err_float32_model": mf.rel_err(logits32, logits),
        "cached_vs_uncached_rel_err": cached_vs_full,
        "layer_types": list(getattr(hf_cfg, "layer_types", None) or expected_layer_types(text_cfg)),
        "rope_tables": rope_tables(model),
    }


def make_fixture(fx, out_dir, weights_only):
    fx_dir = os.path.join(out_dir, fx["name"])
    if os.path.exists(fx_dir):
        shutil.rmtree(fx_dir)
    cfg, text_cfg, ref, stored = build_checkpoint(fx, fx_dir)
    summary = {"name": fx["name"], "bytes": os.path.getsize(os.path.join(fx_dir, "model.safetensors"))}
    if weights_only:
        return summary
    import torch
    import transformers

    mf.check_with_safetensors_library(os.path.join(fx_dir, "model.safetensors"), stored)
    r = reference_outputs(fx, text_cfg, ref)
    np.save(os.path.join(fx_dir, "logits.npy"), r["logits"].astype(np.float32))
    eos = text_cfg.get("eos_token_id", cfg.get("eos_token_id"))
    doc = {
        "family": family(text_cfg),
        "variant": fx["name"],
        "tokens": r["tokens"],
        "greedy": r["greedy"],
        "greedy_top2_margin": r["margin_raw"],
        "greedy_top2_margin_rel": r["margin_rel"],
        "dtype": fx["dtype"],
        "quantization": cfg.get("quantization"),
        "logits_shape": list(r["logits"].shape),
        "logits_rms": float(np.sqrt(np.mean(r["logits"] ** 2))),
        "eos_token_ids": eos if isinstance(eos, list) else [eos],
        "layer_types": r["layer_types"],
        "rope_tables_transformers": r["rope_tables"],
        "weights_seed": MODELS[fx["model"]]["seed"],
        "prompt_seed": r["prompt_seed"],
        "rel_err_float32_model": r["rel_err_float32_model"],
        "cached_vs_uncached_rel_err": r["cached_vs_uncached_rel_err"],
        "notes": "reference: transformers in float64 on the CPU, eager attention; see "
        "tools/reference/make_family_fixtures.py for what each config exercises",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    with open(os.path.join(fx_dir, "reference.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    summary.update(
        min_margin_rel=round(min(r["margin_rel"]), 4),
        rel_err_f32=f"{r['rel_err_float32_model']:.2e}",
        greedy=r["greedy"],
    )
    return summary


def main():
    return mf.run_fixtures(__doc__.split("\n")[0], FIXTURES, make_fixture)


if __name__ == "__main__":
    sys.exit(main())
