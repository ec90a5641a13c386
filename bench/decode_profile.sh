#!/usr/bin/env bash
# Where one batch-1 decode step's time goes, kernel by kernel, on CUDA:
#   1. the step's wall time: `mlxcel bench -n 128 -d 512 -b 1` (replayed recorded steps,
#      sampling and the host's work between steps included);
#   2. under ncu, `mlxcel generate` of a few tokens after a KV-token prompt (so attention
#      sees a context as long as in the middle of the benchmark's 128 steps): the recorded step
#      as one whole (--graph-profiling graph), GPU time from its first kernel's start to its
#      last kernel's end, gaps between kernels included;
#   3. the same with every kernel of one replayed step timed alone (--graph-profiling node): a
#      table of kernel, launches per step, total us, share of the step.
# ncu adds time of its own to both (on the H200 the sum of 3 and the time of 2 both exceed the
# wall time of 1), so they tell where the time goes, not the gaps between kernels; the gaps
# show as the wall time with MLXCEL_PDL=1 against MLXCEL_PDL=0.
#
#   bench/decode_profile.sh MODEL
# Environment: MLX (default build/bin/mlxcel), TOKS (tg128 tok/s already measured: skips 1),
# KV (prompt tokens, default 576: the middle of the benchmark's contexts, 512 to 640), OUT (folder for the ncu logs, default a temporary one), NCU
# (default ncu), MODES (ncu runs, default "node graph"; "graph" alone gives the step's GPU
# time without the table).
set -u
MODEL=${1:?usage: bench/decode_profile.sh MODEL}
MLX=${MLX:-build/bin/mlxcel}
NCU=${NCU:-ncu}
OUT=${OUT:-$(mktemp -d)}
KV=${KV:-576}
mkdir -p "$OUT"

if [ -z "${TOKS:-}" ]; then
    TOKS=$(timeout 60 "$MLX" bench -m "$MODEL" -p 0 -n 128 -d 512 -b 1 -r 2 --device cuda 2>&1 |
        grep -E '\| *tg128@d512 *\| *1 *\|' | awk -F'|' '{gsub(/ /, "", $7); print $7}')
fi

# The prompt's prefill, then decode steps: the first runs directly, the second is recorded and
# replayed, the later ones replay it (the context stays in one bucket of pages).
run_ncu() {
    timeout 90 "$NCU" --clock-control none --cache-control none --graph-profiling "$1" \
        --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu_$1.csv" \
        "$MLX" generate -m "$MODEL" --tokens "$(seq -s, 1 "$KV")" -n 5 -c $((KV + 8)) --seed 1 \
        --device cuda > "$OUT/ncu_$1.app.log" 2>&1 ||
        { echo "ncu --graph-profiling $1 failed:"; tail -n 5 "$OUT/ncu_$1.app.log" "$OUT/ncu_$1.csv"; }
}
for m in ${MODES:-node graph}; do run_ncu "$m"; done

python3 - "$OUT" "${TOKS:-0}" <<'EOF'
import collections, csv, re, sys

out, toks = sys.argv[1], float(sys.argv[2] or 0)
SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "s": 1e6, "second": 1e6}


def results(path):
    """(name, grid, block, us) per profiled launch, in launch order."""
    try:
        rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    except OSError:
        return []
    if not rows or "Kernel Name" not in rows[0]:
        return []
    h = rows[0]
    ki, gi, bi = h.index("Kernel Name"), h.index("Grid Size"), h.index("Block Size")
    mi, vi, ui = h.index("Metric Name"), h.index("Metric Value"), h.index("Metric Unit")
    res = []
    for r in rows[1:]:
        if r[mi] != "gpu__time_duration.sum":
            continue
        name = re.sub(r"^void ", "", r[ki]).split("(")[0]
        res.append((name, r[gi], r[bi], float(r[vi].replace(",", "")) * SCALE.get(r[ui], 1.0)))
    return res


wall = 1e6 / toks if toks > 0 else 0.0
# Under --graph-profiling graph a recorded step is one result, far longer than any kernel;
# the kernels profiled after the first of them are those launched outside the recording.
gres = results(f"{out}/ncu_graph.csv")
big = [i for i, r in enumerate(gres) if r[3] > 1000.0]
if gres:
    print(f"graph mode: {len(gres)} results; those over 1 ms: "
          + ", ".join(f"#{i} {gres[i][0][:24] or '(graph)'} {gres[i][3]:.1f} us" for i in big[:6]))
gpu = min(gres[i][3] for i in big) if big else 0.0
outside = {r[:3] for r in gres[big[0] + 1:] if r[3] <= 1000.0} if big else set()
node = results(f"{out}/ncu_node.csv")
# Steps start with the embedding: the prompt's, then one per decode step; the second to last
# complete one is a replay.
starts = [i for i, r in enumerate(node) if r[0].startswith("embedding_kernel")]
if len(starts) < 4:
    print(f"decode step, batch 1: wall {wall:.1f} us ({toks:.1f} tok/s); recorded step on the GPU "
          f"{gpu:.1f} us; no replayed step profiled kernel by kernel ({len(node)} kernels)")
    sys.exit(0)
step = node[starts[-2]:starts[-1]]
inside = [r for r in step if r[:3] not in outside]
kern = sum(r[3] for r in inside)
ref = wall or gpu or kern
print(f"decode step, batch 1: wall {wall:.1f} us ({toks:.1f} tok/s); under ncu, the recorded "
      f"step {gpu:.1f} us as one whole, its {len(inside)} kernels {kern:.1f} us one by one, "
      f"{sum(r[3] for r in step) - kern:.1f} us in {len(step) - len(inside)} kernels after it")
# "first" is the kernel's first place in the step: it tells the GEMVs of one shape apart.
agg = collections.OrderedDict()
for i, (name, grid, block, us) in enumerate(step):
    a = agg.setdefault((name, grid, block), [0, 0.0, i])
    a[0] += 1
    a[1] += us
print("| kernel | grid | block | first | per step | total us | mean us | share of the step |")
print("|---|---|---|---|---|---|---|---|")
for (name, grid, block), (n, t, first) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| {name[:60]} | {grid} | {block} | {first} | {n} | {t:.1f} | {t / n:.2f} | "
          f"{100 * t / ref:.1f}% |")
EOF
