"""A random-weight checkpoint of a real model's shape (tools/make_random_model.py SHAPES: the
Llama-3.1-8B shape by default, Gemma-3-4B, Phi-4-mini, ...) in MLX's affine-quantized layout,
made on the GPU with PyTorch, for the GPU benchmarks (bench/run_gpu.sh). The tensor table and
config.json are the shape's family's (make_random_model.tensors and .config). Every linear
layer (a fused one as one tensor), the embedding table and the output head are quantized with
MLX's rule (float32 arithmetic; the larger-magnitude end of each group is the bias and is hit
exactly), codes packed as each row's little-endian bit stream, scales and biases stored in
bfloat16; norms are bfloat16 constants. Tensors are generated and written one at a time, so
host memory stays at one tensor. --dry-run prints the tensor table and the config and writes
nothing (no GPU or PyTorch needed).

    python3 bench/make_random_q4.py OUT_DIR [--shape llama-3.1-8b] [--bits 4] [--group-size 64]
    python3 bench/make_random_q4.py OUT_DIR --shape gemma-3-4b --dry-run
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

try:
    import torch
except ImportError:  # --dry-run needs none of it
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "reference"))
from make_fixtures import mlx_affine_quantize, pack_codes  # noqa: E402
from make_random_model import SHAPES, config, tensors  # noqa: E402


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


def self_check(bits, group_size, dev):
    """Compares the torch quantizer and packer with the numpy ones the fixtures (checked
    against transformers) were made with; prints the mismatches, which must be none."""
    w = torch.randn(96, 4 * group_size, device=dev) * 0.02
    q, sc, bi = quantize(w, bits, group_size)
    rq, rsc, rbi = mlx_affine_quantize(w.cpu().numpy(), bits, group_size)
    bad_q = int((q.cpu().numpy() != rq.astype(np.int64)).sum())
    bad_s = int((sc.cpu().numpy() != rsc).sum() + (bi.cpu().numpy() != rbi).sum())
    bad_p = int((pack(q, bits) != pack_codes(rq, bits)).sum())
    print(f"self-check against numpy: {bad_q} codes, {bad_s} scales/biases, {bad_p} words differ")


def bf16_numpy(x):
    return x.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)


def plan(s, bits, group_size, dev):
    """(name, dtype tag, shape, maker) for every tensor of shape s; makers run on device dev
    when called (the dry run never calls them)."""
    gens = []  # one generator, made by the first maker that runs
    entries = []

    def generator():
        if not gens:
            gens.append(torch.Generator(device=dev))
            gens[0].manual_seed(0)
        return gens[0]

    def linear(prefix, rows, cols):
        cache = {}

        def make(part):
            if not cache:
                w = torch.randn(rows, cols, device=dev, generator=generator()) * 0.02
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

    def const(name, n, fill):
        entries.append((name, "BF16", (n,),
                        lambda: bf16_numpy(torch.full((n,), fill, device=dev))))

    for name, shape, fill in tensors(s):
        if fill is None:
            if shape[1] % group_size:
                sys.exit(f"{name}: {shape[1]} columns are not a multiple of the group size "
                         f"{group_size}")
            linear(name, *shape)
        else:
            const(name, shape[0], fill)
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
    ap.add_argument("--bits", type=int, default=4, choices=(2, 3, 4, 5, 6, 8))
    ap.add_argument("--group-size", type=int, default=64, choices=(32, 64, 128))
    ap.add_argument("--dry-run", action="store_true",
                    help="print the tensor table and config.json, write nothing")
    ap.add_argument("--device", default="cuda",
                    help="where torch makes the tensors (cpu checks the script on a tiny shape)")
    a = ap.parse_args()
    s = SHAPES[a.shape]
    cfg = dict(config(s), quantization={"group_size": a.group_size, "bits": a.bits})
    entries = plan(s, a.bits, a.group_size, a.device)
    if a.dry_run:
        total = 0
        for name, tag, shape, _ in entries:
            n = int(np.prod(shape)) * ITEMSIZE[tag]
            total += n
            print(f"{name:48s} {tag:5s} {str(list(shape)):16s} {n:>12d}")
        print(f"{len(entries)} tensors, {total / 1e9:.2f} GB")
        print(json.dumps(cfg, indent=2))
        return
    if torch is None:
        sys.exit("make_random_q4.py: PyTorch is needed to make the tensors (--dry-run needs none)")
    self_check(a.bits, a.group_size, a.device)
    os.makedirs(a.out, exist_ok=True)
    n = write(os.path.join(a.out, "model.safetensors"), entries)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"wrote {a.out} ({a.shape}): {n / 1e9:.2f} GB of tensors, {a.bits}-bit group "
          f"{a.group_size}")


if __name__ == "__main__":
    main()
