#!/usr/bin/env python3
"""make_gguf.py's Q4_0 and Q8_0 blocks against ggml's own reference quantizers
(quantize_row_q4_0_ref, quantize_row_q8_0_ref in the libggml-base that bench/node ships): the
same f32 rows must give the same bytes. Exits 1 naming the first differing block.

    /usr/bin/python3 bench/check_gguf_blocks.py LIBGGML_BASE.so
"""

import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_gguf  # noqa: E402


def rows():
    """Weights like the benchmark's, plus the edge cases of the block formats."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 2048)) * 0.02).astype(np.float32)
    x[0, :32] = 0  # an all-zero block: d = 0, codes 8 (Q4_0) and 0 (Q8_0)
    x[1, :32] = 1  # equal magnitudes: the first one sets d's sign
    x[2, 32:64] = -x[2, 32:64].max() * np.sign(x[2, 32:64])  # ties in magnitude, mixed signs
    x[3, :32] = np.linspace(-1, 1, 32, dtype=np.float32)  # codes at exact halves
    x[4, :32] = 0.5 * (np.arange(32) % 3 - 1)
    k = np.float32(2.0**-6)  # d = k exactly, so x / d lands on halves: the rounding shows
    x[5, :32] = k * np.concatenate([[127.0], np.arange(31) - 15.5])  # Q8_0
    x[6, :32] = k * np.concatenate([[-8.0], np.arange(31) / 4 - 7.5])  # Q4_0
    return x


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_gguf_blocks.py LIBGGML_BASE.so")
    lib = ctypes.CDLL(sys.argv[1])
    x = rows()
    bad = 0
    for kind, ours in (("q4_0", make_gguf.quantize_q4_0), ("q8_0", make_gguf.quantize_q8_0)):
        size = make_gguf.BLOCK_BYTES[kind]
        got = ours(x)
        ref = ctypes.create_string_buffer(x.size // make_gguf.QK * size)
        fn = getattr(lib, f"quantize_row_{kind}_ref")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        fn(x.ctypes.data, ref, x.size)
        diff = [i for i in range(0, len(got), size) if got[i:i + size] != ref.raw[i:i + size]]
        n = len(got) // size
        if diff:
            bad += 1
            print(f"{kind}: {len(diff)} of {n} blocks differ from ggml's, first block {diff[0] // size}")
        else:
            print(f"{kind}: {n} blocks identical to ggml's quantize_row_{kind}_ref")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
