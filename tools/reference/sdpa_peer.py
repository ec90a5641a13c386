"""PyTorch SDPA decode peers for bench/bench_attention: the same shapes (32 q heads, 8 kv heads,
head_dim 128, one query per sequence) with contiguous K/V, timed with CUDA events around each
call, the calls queued behind a spin so that none waits on the host (median after warm-up).
TB/s counts the K/V bytes once, whatever the call reads.

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

With --ours BENCH it instead runs `BENCH serve` (bench_attention) beside it and times the two
in turns, several trials each, and prints the ratio of figures taken the same way
(alternate() says how).
Usage: sdpa_peer.py [reps] [--ours BENCH [--vs BENCH2] [--trials N] [--ab NAME=V1,V2]]
       [--shapes BxL,...]"""
import argparse
import subprocess
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


def queued_ms(fn, reps):
    """Milliseconds of each of reps calls, ascending, after three warm-up calls: an event pair
    around every call, all queued behind a spin of 200000 clocks per call, so that no call
    waits on the host's launch (bench_cuda.h's bench_times_ms does the same)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    torch.cuda._sleep(200000 * reps)
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in ev)


def median_ms(fn, reps):
    times = queued_ms(fn, reps)
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


def survey(reps, shapes, dev):
    """Every backend and call form at every shape, once each."""
    for batch, ctx in shapes:
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


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def alternate(ours_cmds, reps, trials, shapes, dev, ab=None):
    """Ours (bench_attention serve, the planner's plan) against cuDNN at its best call form,
    in turns: each trial times reps calls of one side, then of the other (the order flips
    every trial), so that both meet the same clocks, temperature and neighbours. A trial's
    figure is the median of its calls (and, as `best`, its fastest call); each side reports
    the median over trials of both, so that the ratios compare figures taken the same way.
    A second command in ours_cmds (`vs`, e.g. main's build) joins the turns as a side of its
    own; with ab = (NAME, [values]) each binary runs once per value of that environment
    variable in each trial. The turn rotates over all sides, one ratio to cuDNN each."""
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              bufsize=1) for cmd in ours_cmds]

    # a value V+NAME2=W also sets NAME2 (to 0 for the values that do not name it)
    extra = sorted({a.split("=")[0] for v in (ab[1] if ab else []) for a in v.split("+")[1:]})

    def ours_ms(k, shape, env=None):
        ours = procs[k]
        if env:
            parts = env[1].split("+")
            ours.stdin.write(f"env {env[0]} {parts[0]}\n")
            named = dict(a.split("=", 1) for a in parts[1:])
            for n in extra:
                ours.stdin.write(f"env {n} {named.get(n, '0')}\n")
        ours.stdin.write(f"{shape} {reps}\n")
        ours.stdin.flush()
        while True:
            line = ours.stdout.readline()
            if not line:
                sys.exit(f"sdpa_peer.py: {ours_cmds[k][0]} ended before answering {shape}")
            f = line.split()
            if f[:2] == ["ours", shape]:
                return [float(x) for x in f[2:]]
            if f[:1] == ["env"]:
                continue
            print(line.rstrip(), flush=True)

    # (label, binary, environment value)
    sides = []
    for k in range(len(procs)):
        name = "ours" if k == 0 else "vs"
        for v in (ab[1] if ab else [None]):
            sides.append((name if v is None else f"{name}:{v}", k, v))

    print(f"fair: ours (planner's plan, F32 q/out) and cuDNN SDPA (its fastest call form, "
          f"contiguous K/V) in turns, {trials} trials x {reps} calls each; TB/s of K+V; med: "
          f"median over trials of each trial's median call, best: of each trial's fastest call; "
          f"range: the trials' medians", flush=True)
    print(f"{'shape':<10} {'call':<9} {'ours':>6} {'cudnn':>6} {'ratio':>6} | {'best':>6} "
          f"{'cudnn':>6} {'ratio':>6} | {'ours range':>11} {'cudnn range':>11}", flush=True)
    for batch, ctx in shapes:
        shape = f"{batch}x{ctx}"
        # the peer's call form: the fastest cuDNN form on a first pass
        pick = None
        for dtype in (torch.float16, torch.bfloat16):
            forms, kv_bytes = calls(batch, ctx, dtype, dev)
            for form, fn in forms:
                try:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        ms = median_ms(fn, max(3, reps // 4))
                except RuntimeError:
                    continue
                if pick is None or ms < pick[0]:
                    pick = (ms, dtype, form)
            del forms
            torch.cuda.empty_cache()
        if pick is None:
            print(f"fair {shape}: cuDNN took no call form", flush=True)
            continue
        forms, kv_bytes = calls(batch, ctx, pick[1], dev)
        fn = dict(forms)[pick[2]]
        call = f"{pick[2]}/{'f16' if pick[1] == torch.float16 else 'bf16'}"
        fig = {label: [] for label, _, _ in sides}
        fig["cudnn"] = []

        def peer_ms():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return queued_ms(fn, reps)

        turn = sides + [("cudnn", -1, None)]
        for t in range(trials):
            for label, k, v in turn[t % len(turn):] + turn[:t % len(turn)]:
                if k < 0:
                    ms = peer_ms()
                else:
                    ms = ours_ms(k, shape, (ab[0], v) if v is not None else None)
                fig[label].append((median(ms), ms[0]))
        def tb(ms):
            return kv_bytes / (ms * 1e-3) / 1e12

        tbs = {side: (tb(median(m for m, _ in v)), tb(median(b for _, b in v)),
                      tb(max(m for m, _ in v)), tb(min(m for m, _ in v)))
               for side, v in fig.items()}
        for side in fig:
            per_trial = " ".join(f"{tb(m):.3f}" for m, _ in fig[side])
            print(f"trials {shape} {side} {per_trial}", flush=True)
        c = tbs["cudnn"]
        for side, _, _ in sides:
            o = tbs[side]
            label = shape if side == "ours" else f"{shape} {side}"
            print(f"{label:<10} {call:<9} {o[0]:6.3f} {c[0]:6.3f} {o[0] / c[0]:6.3f} | "
                  f"{o[1]:6.3f} {c[1]:6.3f} {o[1] / c[1]:6.3f} | {o[2]:5.3f}-{o[3]:5.3f} "
                  f"{c[2]:5.3f}-{c[3]:5.3f}", flush=True)
        del forms, fn
        torch.cuda.empty_cache()
    for ours in procs:
        ours.stdin.close()
        ours.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reps", nargs="?", type=int, default=50, help="timed calls per figure")
    ap.add_argument("--ours", help="bench_attention binary: alternate it with cuDNN")
    ap.add_argument("--trials", type=int, default=7, help="turns per side with --ours")
    ap.add_argument("--shapes", help="BxL,... (default: all five)")
    ap.add_argument("--vs", help="with --ours, a second bench_attention (e.g. main's) in the "
                    "same turns")
    ap.add_argument("--ab", help="NAME=V1,V2,...: with --ours, each binary at each value of that "
                    "environment variable, in turns; a value V+NAME2=W also sets NAME2 to W (and "
                    "the values that do not name NAME2 set it to 0)")
    a = ap.parse_args()
    shapes = SHAPES
    if a.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    # a backend that declines a call form says why at length; the `unsupported` line suffices
    warnings.filterwarnings("ignore", category=UserWarning)
    dev = torch.device("cuda")
    print(f"peer device {torch.cuda.get_device_name(0)} torch {torch.__version__} "
          f"cudnn {torch.backends.cudnn.version()}", flush=True)
    if a.ours:
        ab = None
        if a.ab:
            name, values = a.ab.split("=", 1)
            ab = (name, values.split(","))
        cmds = [[a.ours, "serve"]] + ([[a.vs, "serve"]] if a.vs else [])
        alternate(cmds, a.reps, a.trials, shapes, dev, ab)
    else:
        survey(a.reps, shapes, dev)


if __name__ == "__main__":
    main()
