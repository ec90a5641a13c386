"""PyTorch SDPA decode peers for bench/bench_attention: the same shapes (32 q heads, 8 kv heads,
head_dim 128, one query per sequence) with contiguous K/V, timed with CUDA events (median
after warm-up). TB/s counts the K/V bytes once, whatever the call reads.

Grouped-query decode can be put to SDPA in several ways, and backends differ in which they
take and how fast they run; each is tried with each backend and the best figure per backend
is reported with the call that gave it:
  rows    the 4 query heads of a kv head as 4 query rows: q [B, 8, 4, 128] against
          K/V [B, 8, L, 128] (the same function for a single decode position);
  gqa     q [B, 32, 1, 128] against K/V [B, 8, L, 128] with enable_gqa=True.
K/V repeated to 32 heads is left out: no 4-D view can hold it without a copy, and the copy
would read 4 times the bytes of a real cache.
Dtypes: f16 (the benchmark's pool), and bf16 for cuDNN (REFERENCES.md's figures are bf16).
Prints one machine-readable `peer shape` line per shape and one `peer call` line per timing.
Usage: sdpa_peer.py [reps]"""
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(1, 131072), (4, 16384), (16, 8192), (64, 4096), (256, 2048)]
NQ, NKV, HD = 32, 8, 128
GROUP = NQ // NKV
BACKENDS = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION))


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def calls(batch, ctx, dtype, dev):
    """(name, thunk) for each way of putting the decode step to SDPA."""
    g = torch.Generator(device=dev).manual_seed(batch)
    k = torch.randn(batch, NKV, ctx, HD, device=dev, dtype=dtype, generator=g)
    v = torch.randn(batch, NKV, ctx, HD, device=dev, dtype=dtype, generator=g)
    q_rows = torch.randn(batch, NKV, GROUP, HD, device=dev, dtype=dtype, generator=g)
    q_heads = q_rows.reshape(batch, NQ, 1, HD)
    return [("rows", lambda: F.scaled_dot_product_attention(q_rows, k, v)),
            ("gqa", lambda: F.scaled_dot_product_attention(q_heads, k, v, enable_gqa=True))
            ], 2 * k.numel() * k.element_size()


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    # a backend that declines a call form says why at length; the `unsupported` line suffices
    warnings.filterwarnings("ignore", category=UserWarning)
    dev = torch.device("cuda")
    print(f"peer device {torch.cuda.get_device_name(0)} torch {torch.__version__} "
          f"cudnn {torch.backends.cudnn.version()}", flush=True)
    for batch, ctx in SHAPES:
        best = {name: (float("nan"), "none") for name, _ in BACKENDS}
        for dtype in (torch.float16, torch.bfloat16):
            dname = "f16" if dtype == torch.float16 else "bf16"
            forms, kv_bytes = calls(batch, ctx, dtype, dev)
            for form, fn in forms:
                for name, backend in BACKENDS:
                    if dtype == torch.bfloat16 and name != "cudnn":
                        continue
                    try:
                        with sdpa_kernel(backend):
                            ms = median_ms(fn, reps)
                    except RuntimeError as e:
                        print(f"peer call {batch}x{ctx} {name} {form} {dname} unsupported: "
                              f"{str(e).splitlines()[0][:100]}", flush=True)
                        continue
                    tbs = kv_bytes / (ms * 1e-3) / 1e12
                    print(f"peer call {batch}x{ctx} {name} {form} {dname} {tbs:.4f} TB/s",
                          flush=True)
                    if not best[name][0] >= tbs:
                        best[name] = (tbs, f"{form}/{dname}")
            del forms
            torch.cuda.empty_cache()
        fields = " ".join(f"{name}_tbs {best[name][0]:.4f} {name}_call {best[name][1]}"
                          for name, _ in BACKENDS)
        print(f"peer shape {batch}x{ctx} {fields}", flush=True)


if __name__ == "__main__":
    main()
