"""cuDNN SDPA decode peer for bench/bench_attention: the same shapes (32 q heads, 8 kv heads,
head_dim 128, f16, one query per sequence) with contiguous K/V, timed with CUDA events
(median after warm-up). Prints one machine-readable `peer` line per shape.

Grouped-query decode is run as cuDNN sees it best: the 4 query heads of a kv head become 4
query rows of that head ([B, 8, 4, 128] against [B, 8, L, 128]), which is the same function
for a single decode position and reads K/V once."""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(1, 131072), (4, 16384), (16, 8192), (64, 4096), (256, 2048)]
NQ, NKV, HD = 32, 8, 128


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


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    dev = torch.device("cuda")
    print(f"peer device {torch.cuda.get_device_name(0)} torch {torch.__version__} "
          f"cudnn {torch.backends.cudnn.version()}")
    for batch, ctx in SHAPES:
        g = torch.Generator(device=dev).manual_seed(batch)
        q = torch.randn(batch, NKV, NQ // NKV, HD, device=dev, dtype=torch.float16, generator=g)
        k = torch.randn(batch, NKV, ctx, HD, device=dev, dtype=torch.float16, generator=g)
        v = torch.randn(batch, NKV, ctx, HD, device=dev, dtype=torch.float16, generator=g)
        kv_bytes = 2 * k.numel() * k.element_size()
        row = {}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    ms = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
                                   reps)
                row[name] = kv_bytes / (ms * 1e-3) / 1e12
            except RuntimeError as e:
                print(f"peer {name} {batch}x{ctx} failed: {str(e).splitlines()[0]}")
                row[name] = float("nan")
        print(f"peer shape {batch}x{ctx} cudnn_tbs {row['cudnn']:.4f} flash_tbs {row['flash']:.4f}",
              flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
