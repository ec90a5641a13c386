"""Causal prefill SDPA peer for bench/bench_prefill_attention: the same shapes (32 q heads,
8 kv heads, head_dim 128, f16, fresh prompts of 1 x 2048, 1 x 8192 and 4 x 4096 tokens) with
contiguous K/V through torch.nn.functional.scaled_dot_product_attention(is_causal=True), on
the cuDNN and the FlashAttention backends, timed with CUDA events (median after warm-up).
TFLOP/s count the causal half, 2 * 2 * B * H * N^2 * D / 2, as the benchmark does. Grouped
K/V heads are expanded to the 32 query heads (both backends then run plain multi-head
attention, the same function and FLOPs). Prints one machine-readable `peer` line per shape."""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(1, 2048), (1, 8192), (4, 4096)]
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
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    dev = torch.device("cuda")
    print(f"peer device {torch.cuda.get_device_name(0)} torch {torch.__version__} "
          f"cudnn {torch.backends.cudnn.version()}")
    for batch, n in SHAPES:
        g = torch.Generator(device=dev).manual_seed(n)
        q = torch.randn(batch, NQ, n, HD, device=dev, dtype=torch.float16, generator=g)
        k = torch.rand(batch, NKV, n, HD, device=dev, dtype=torch.float16, generator=g) * 2 - 1
        v = torch.rand(batch, NKV, n, HD, device=dev, dtype=torch.float16, generator=g) * 2 - 1
        k = k.repeat_interleave(NQ // NKV, dim=1)
        v = v.repeat_interleave(NQ // NKV, dim=1)
        flop = 2 * 2 * batch * NQ * n * n * HD / 2
        row = {}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    ms = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=True), reps)
                row[name] = flop / (ms * 1e-3) / 1e12
            except RuntimeError as e:
                print(f"peer {name} {batch}x{n} failed: {str(e).splitlines()[0]}")
                row[name] = float("nan")
        print(f"peer shape {batch}x{n} cudnn_tflops {row['cudnn']:.2f} "
              f"flash_tflops {row['flash']:.2f}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
