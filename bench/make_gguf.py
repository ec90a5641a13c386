#!/usr/bin/env python3
"""A Llama checkpoint of ours as a GGUF v3 file for llama.cpp, the CPU benchmark's peer (numpy
only; runs anywhere).

    /usr/bin/python3 bench/make_gguf.py MODEL_DIR OUT.gguf --type q4_0|q8_0|f16|f32

MODEL_DIR is what tools/make_random_model.py writes (bf16 safetensors) or what `mlxcel quantize`
makes of it (MLX affine 4- or 8-bit: uint32 codes with scales and biases per group); a quantized
input is dequantized to f32 first (w = scale * q + bias), so a Q4_0 file made from a 4-bit
checkpoint holds those values requantized, not the bf16 originals.

The file is what llama.cpp's HF converter followed by llama-quantize --pure would write:
architecture `llama` with its hyperparameters, the tensor names `token_embd`, `blk.N.attn_q`
..., q and k rows permuted from the HF rotate-half order to the interleaved pairs that
llama.cpp's `llama` rope rotates, the norms (and the llama3 `rope_freqs` factors) in F32 and
every matrix, the embedding included, in the chosen type. Q4_0 and Q8_0 are ggml's blocks of
32 values: an fp16 scale d then the codes; Q4_0 stores q in 0..15 with x = d (q - 8), d = m /
-8 for m the block's value of largest magnitude, element j in the low nibble of byte j and
element j + 16 in its high nibble; Q8_0 stores int8 q with x = d q, d = max|x| / 127, q rounded
half away from zero. Both are 4.5 and 8.5 bits a weight, as MLX's 4- and 8-bit at group 64
with 16-bit scales and biases, so both engines read the same bytes a token.

The vocabulary is a placeholder of the checkpoint's size (the benchmark feeds token ids): a
`gpt2` BPE vocabulary, no merges, the 256 byte tokens, the checkpoint's BOS and EOS ids as
control tokens and `<|tok_N|>` for the rest.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

GGUF_VERSION = 3
ALIGN = 32
QK = 32  # values in a ggml Q4_0 / Q8_0 block

# gguf metadata value types
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
# ggml tensor types and the llama file types (general.file_type) they make
GGML = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}
FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7}
BLOCK_BYTES = {"q4_0": 2 + QK // 2, "q8_0": 2 + QK}

# HF name (after "model.layers.N.") -> GGUF name (after "blk.N.")
LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}

DENSE_WIDTH = {"BF16": 2, "F16": 2, "F32": 4}  # bytes a value
ROWS_PER_CHUNK = 4096  # rows converted at a time: bounds memory on the 128k-row embedding


def fail(msg):
    sys.exit(f"make_gguf: {msg}")


# --- reading the checkpoint -------------------------------------------------------------------

class Checkpoint:
    """The tensors of MODEL_DIR's safetensors files, mapped, read by name as f32 rows."""

    def __init__(self, model_dir):
        self.tensors = {}
        files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
        if not files:
            fail(f"{model_dir}: no .safetensors file")
        for name in files:
            path = os.path.join(model_dir, name)
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(n))
            mm = np.memmap(path, dtype=np.uint8, mode="r")
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                a, b = info["data_offsets"]
                self.tensors[key] = (info["dtype"], info["shape"], mm[8 + n + a:8 + n + b])

    def has(self, name):
        return name in self.tensors

    def raw(self, name):
        if name not in self.tensors:
            fail(f"tensor {name} missing from the checkpoint")
        return self.tensors[name]


def to_f32(dtype, raw, shape, name):
    if dtype == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype == "F16":
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if dtype == "F32":
        return raw.view(np.float32).reshape(shape).copy()
    fail(f"{name}: dtype {dtype} not supported (bf16, f16, f32 or MLX affine 4/8-bit)")


class Matrix:
    """One weight matrix, dense or MLX affine-quantized, read as f32 rows."""

    def __init__(self, ck, prefix, quant):
        self.name = prefix + ".weight"
        dtype, shape, raw = ck.raw(self.name)
        self.quant = quant if ck.has(prefix + ".scales") else None
        if self.quant is None:
            if dtype not in DENSE_WIDTH:
                fail(f"{self.name}: dtype {dtype} not supported (bf16, f16 or f32)")
            self.dtype, self.raw = dtype, raw
            self.rows, self.cols = shape
            return
        bits, group = quant["bits"], quant["group_size"]
        if bits not in (4, 8):
            fail(f"{self.name}: {bits}-bit weights not supported (4 or 8)")
        if dtype != "U32":
            fail(f"{self.name}: quantized codes must be U32, found {dtype}")
        self.codes = raw.view(np.uint32).reshape(shape)
        self.rows, self.cols = shape[0], shape[1] * 32 // bits
        sd, ss, sraw = ck.raw(prefix + ".scales")
        bd, bs, braw = ck.raw(prefix + ".biases")
        if ss != [self.rows, self.cols // group] or bs != ss:
            fail(f"{self.name}: scales {ss} / biases {bs} do not fit {self.rows} x {self.cols} "
                 f"at group {group}")
        self.scales = (sd, sraw, ss)
        self.biases = (bd, braw, bs)

    def read(self, r0, r1):
        if self.quant is None:
            width = DENSE_WIDTH[self.dtype]
            raw = self.raw[r0 * self.cols * width:r1 * self.cols * width]
            return to_f32(self.dtype, raw, (r1 - r0, self.cols), self.name)
        bits, group = self.quant["bits"], self.quant["group_size"]
        per_word = 32 // bits
        words = self.codes[r0:r1]
        shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, None, :]
        q = ((words[:, :, None] >> shifts) & np.uint32((1 << bits) - 1)).reshape(r1 - r0, -1)
        ng = self.cols // group

        def part(spec):
            d, raw, _ = spec
            w = DENSE_WIDTH.get(d, 0)
            return to_f32(d, raw[r0 * ng * w:r1 * ng * w], (r1 - r0, ng), self.name)

        s, b = part(self.scales), part(self.biases)
        q = q.astype(np.float32).reshape(r1 - r0, ng, group)
        return (q * s[:, :, None] + b[:, :, None]).reshape(r1 - r0, self.cols)


# --- ggml block formats -----------------------------------------------------------------------

def quantize_q4_0(x):
    """(rows, cols) f32 -> the rows' Q4_0 blocks as bytes."""
    blocks = x.reshape(-1, QK)
    n = blocks.shape[0]
    at = np.argmax(np.abs(blocks), axis=1)  # the first of equal magnitudes, as ggml keeps
    d = blocks[np.arange(n), at] / np.float32(-8.0)
    inv = np.zeros_like(d)
    np.divide(np.float32(1.0), d, out=inv, where=d != 0)
    # trunc(x / d + 8.5) is floor here (never negative), capped at 15 for x = m itself
    q = np.minimum(15, np.trunc(blocks * inv[:, None] + np.float32(8.5))).astype(np.uint8)
    out = np.empty((n, BLOCK_BYTES["q4_0"]), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(n, 2)
    out[:, 2:] = q[:, :QK // 2] | (q[:, QK // 2:] << 4)
    return out.tobytes()


def quantize_q8_0(x):
    """(rows, cols) f32 -> the rows' Q8_0 blocks as bytes."""
    blocks = x.reshape(-1, QK)
    n = blocks.shape[0]
    d = np.abs(blocks).max(axis=1) / np.float32(127.0)
    inv = np.zeros_like(d)
    np.divide(np.float32(1.0), d, out=inv, where=d != 0)
    v = (blocks * inv[:, None]).astype(np.float64)  # exact: rounding half away from zero
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)
    out = np.empty((n, BLOCK_BYTES["q8_0"]), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(n, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def encode(x, kind):
    if kind == "f32":
        return np.ascontiguousarray(x, dtype="<f4").tobytes()
    if kind == "f16":
        return x.astype("<f2").tobytes()
    return quantize_q4_0(x) if kind == "q4_0" else quantize_q8_0(x)


def nbytes(rows, cols, kind):
    if kind in BLOCK_BYTES:
        return rows * cols // QK * BLOCK_BYTES[kind]
    return rows * cols * (4 if kind == "f32" else 2)


# --- the llama conversion ---------------------------------------------------------------------

def rope_permute(w, n_head):
    """HF rotate-half rows (pairs i, i + d/2 in each head) -> interleaved pairs (2i, 2i + 1)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, -1).swapaxes(1, 2).reshape(rows, -1)


def llama3_rope_factors(cfg, head_dim, theta):
    """The per-frequency divisors llama.cpp reads from rope_freqs for rope_type llama3."""
    rs = cfg["rope_scaling"]
    factor, lo, hi = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def byte_tokens():
    """The 256 byte-level BPE tokens (GPT-2's printable stand-ins for the bytes)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary(vocab, bos, eos_ids):
    """Token strings and types (1 normal, 3 control) for a placeholder vocabulary."""
    tokens, types = [None] * vocab, [1] * vocab
    for i in [bos] + eos_ids:
        if not 0 <= i < vocab:
            fail(f"special token id {i} outside the vocabulary of {vocab}")
    tokens[bos], types[bos] = "<|bos|>", 3
    for k, i in enumerate(eos_ids):
        if i != bos:
            tokens[i], types[i] = f"<|eos_{k}|>", 3
    free = (i for i in range(vocab) if tokens[i] is None)
    for ch in byte_tokens():
        tokens[next(free)] = ch
    for i in free:
        tokens[i] = f"<|tok_{i}|>"
    return tokens, types


def plan(model_dir, kind):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "llama":
        fail(f"{model_dir}: model_type {cfg.get('model_type')!r}, only 'llama' is converted")
    ck = Checkpoint(model_dir)
    quant = cfg.get("quantization")
    if quant is not None and quant.get("mode", "affine") != "affine":
        fail(f"{model_dir}: quantization mode {quant.get('mode')!r}, only 'affine' is read")
    h, n_layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim", h // n_head)
    theta = cfg.get("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    vocab = cfg["vocab_size"]
    eos = cfg.get("eos_token_id", [])
    eos = eos if isinstance(eos, list) else [eos]
    bos = cfg.get("bos_token_id", 1)
    rope_type = (cfg.get("rope_scaling") or {}).get("rope_type", "default")
    if rope_type not in ("default", "llama3"):
        fail(f"{model_dir}: rope_type {rope_type!r} not converted (default or llama3)")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        fail(f"{model_dir}: attention or MLP biases are not converted")

    tokens, types = vocabulary(vocab, bos, eos)
    meta = [
        ("general.architecture", T_STRING, "llama"),
        ("general.name", T_STRING, os.path.basename(os.path.normpath(model_dir))),
        ("general.file_type", T_UINT32, FILE_TYPE[kind]),
        ("general.alignment", T_UINT32, ALIGN),
        ("llama.context_length", T_UINT32, cfg.get("max_position_embeddings", 4096)),
        ("llama.embedding_length", T_UINT32, h),
        ("llama.block_count", T_UINT32, n_layers),
        ("llama.feed_forward_length", T_UINT32, cfg["intermediate_size"]),
        ("llama.attention.head_count", T_UINT32, n_head),
        ("llama.attention.head_count_kv", T_UINT32, n_kv),
        ("llama.attention.key_length", T_UINT32, head_dim),
        ("llama.attention.value_length", T_UINT32, head_dim),
        ("llama.rope.dimension_count", T_UINT32, head_dim),
        ("llama.rope.freq_base", T_FLOAT32, float(theta)),
        ("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, float(cfg.get("rms_norm_eps", 1e-5))),
        ("llama.vocab_size", T_UINT32, vocab),
        ("tokenizer.ggml.model", T_STRING, "gpt2"),
        ("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, tokens)),
        ("tokenizer.ggml.token_type", T_ARRAY, (T_INT32, types)),
        ("tokenizer.ggml.merges", T_ARRAY, (T_STRING, [])),
        ("tokenizer.ggml.bos_token_id", T_UINT32, bos),
        ("tokenizer.ggml.add_bos_token", T_BOOL, False),
    ]
    if eos:
        meta.append(("tokenizer.ggml.eos_token_id", T_UINT32, eos[0]))

    # (gguf name, dims (ne0 = the row length first), ggml kind, reader of rows r0..r1 as f32)
    tensors = []

    def vector(gguf_name, hf_name):
        dtype, shape, raw = ck.raw(hf_name)
        v = to_f32(dtype, raw, shape, hf_name)
        tensors.append((gguf_name, [v.shape[0]], "f32", lambda r0, r1, v=v: v[None, :]))

    def matrix(gguf_name, hf_prefix, n_rope_heads=None):
        m = Matrix(ck, hf_prefix, quant)
        if m.cols % QK and kind in BLOCK_BYTES:
            fail(f"{m.name}: {m.cols} columns, not a multiple of {QK} for {kind}")
        if n_rope_heads is None:
            read = m.read
        else:
            # the permutation moves rows within a head: read whole heads
            def read(r0, r1, m=m, n=n_rope_heads):
                return rope_permute(m.read(0, m.rows), n)[r0:r1]
        tensors.append((gguf_name, [m.cols, m.rows], kind, read))

    matrix("token_embd.weight", "model.embed_tokens")
    if rope_type == "llama3":
        f = llama3_rope_factors(cfg, head_dim, theta)
        tensors.append(("rope_freqs.weight", [f.shape[0]], "f32", lambda r0, r1, f=f: f[None, :]))
    for i in range(n_layers):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        for src, dst in LAYER_NAMES.items():
            if dst.endswith("_norm"):
                vector(gg + dst + ".weight", hf + src + ".weight")
            else:
                heads = {"attn_q": n_head, "attn_k": n_kv}.get(dst)
                matrix(gg + dst + ".weight", hf + src, heads)
    vector("output_norm.weight", "model.norm.weight")
    if not cfg.get("tie_word_embeddings", False):
        matrix("output.weight", "lm_head")
    return meta, tensors


# --- writing GGUF -----------------------------------------------------------------------------

def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    if t == T_UINT32:
        return struct.pack("<I", v)
    if t == T_INT32:
        return struct.pack("<i", v)
    if t == T_FLOAT32:
        return struct.pack("<f", v)
    if t == T_BOOL:
        return struct.pack("<B", 1 if v else 0)
    if t == T_STRING:
        return gguf_string(v)
    et, items = v
    if et == T_INT32:
        return struct.pack("<IQ", et, len(items)) + np.asarray(items, dtype="<i4").tobytes()
    return struct.pack("<IQ", et, len(items)) + b"".join(gguf_value(et, x) for x in items)


def write(path, meta, tensors):
    head = [b"GGUF", struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(meta))]
    for key, t, v in meta:
        head += [gguf_string(key), struct.pack("<I", t), gguf_value(t, v)]
    offset = 0
    for name, dims, kind, _ in tensors:
        rows, cols = (dims[1] if len(dims) > 1 else 1), dims[0]
        head += [gguf_string(name), struct.pack("<I", len(dims)),
                 struct.pack(f"<{len(dims)}Q", *dims), struct.pack("<IQ", GGML[kind], offset)]
        offset += -(-nbytes(rows, cols, kind) // ALIGN) * ALIGN
    head = b"".join(head)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head + b"\0" * (-len(head) % ALIGN))
        for name, dims, kind, read in tensors:
            rows, cols = (dims[1] if len(dims) > 1 else 1), dims[0]
            size = 0
            for r0 in range(0, rows, ROWS_PER_CHUNK):
                chunk = encode(read(r0, min(rows, r0 + ROWS_PER_CHUNK)), kind)
                f.write(chunk)
                size += len(chunk)
            if size != nbytes(rows, cols, kind):
                fail(f"{name}: wrote {size} bytes, expected {nbytes(rows, cols, kind)}")
            f.write(b"\0" * (-size % ALIGN))
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--type", choices=sorted(GGML), required=True,
                    help="the matrices' type (norms are always f32)")
    args = ap.parse_args()
    meta, tensors = plan(args.model_dir, args.type)
    write(args.out, meta, tensors)
    print(f"{args.out}: {len(tensors)} tensors, {args.type}, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()
