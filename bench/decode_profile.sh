#!/usr/bin/env bash
# Where one batch-1 decode step's time goes, kernel by kernel, on CUDA:
#   1. the step's wall time: `mlxcel bench -n 128 -b 1` (replayed recorded steps, sampling and
#      the host's work between steps included);
#   2. the recorded step as one whole under ncu (--graph-profiling graph): GPU time from its
#      first kernel's start to its last kernel's end, gaps between kernels included;
#   3. every kernel of one replayed step under ncu (--graph-profiling node), each timed alone:
#      a table of kernel, launches per step, total us, share of the step.
# The sum of 3 against 2 is the time between kernels inside the recorded step (launch
# latency, ramp-up, tails); 2 against 1 is what happens outside the recording (sampling,
# uploads, the host).
#
#   bench/decode_profile.sh MODEL
# Environment: MLX (default build/bin/mlxcel), TOKS (tg128 tok/s already measured: skips 1),
# OUT (folder for the ncu logs, default a temporary one), NCU (default ncu), MODES (ncu
# runs, default "node graph"; "graph" alone gives the step's GPU time without the table).
set -u
MODEL=${1:?usage: bench/decode_profile.sh MODEL}
MLX=${MLX:-build/bin/mlxcel}
NCU=${NCU:-ncu}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

if [ -z "${TOKS:-}" ]; then
    TOKS=$(timeout 60 "$MLX" bench -m "$MODEL" -p 0 -n 128 -b 1 -r 2 --device cuda 2>&1 |
        grep -E '\| *tg128 *\| *1 *\|' | awk -F'|' '{gsub(/ /, "", $7); print $7}')
fi

# Steps 0 (a 1-token prefill, run directly), 1 (recorded, then replayed) and 2 (replayed).
run_ncu() {
    timeout 90 "$NCU" --clock-control none --cache-control none --graph-profiling "$1" \
        --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu_$1.csv" \
        "$MLX" bench -m "$MODEL" -p 0 -n 2 -b 1 -r 1 --device cuda > "$OUT/ncu_$1.app.log" 2>&1 ||
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
# Under --graph-profiling graph a recorded step is one result (far longer than any kernel);
# the kernels profiled after the first of them are those launched outside the recording.
gres = results(f"{out}/ncu_graph.csv")
big = [i for i, r in enumerate(gres) if r[3] > 500.0]
gpu = min(gres[i][3] for i in big) if big else 0.0
node = results(f"{out}/ncu_node.csv")
starts = [i for i, r in enumerate(node) if r[0].startswith("embedding_kernel")]
if len(starts) < 3:
    print(f"decode step, batch 1: wall {wall:.1f} us ({toks:.1f} tok/s); recorded step on the GPU "
          f"{gpu:.1f} us; no complete replayed step profiled kernel by kernel")
    sys.exit(0)
step = node[starts[1]:starts[2]]
outside = {r[:3] for r in gres[big[0] + 1:] if r[3] <= 500.0} if big else set()
inside = [r for r in step if r[:3] not in outside]
kern = sum(r[3] for r in inside)
ref = wall or gpu or kern
print(f"decode step, batch 1: wall {wall:.1f} us ({toks:.1f} tok/s); recorded step on the GPU "
      f"{gpu:.1f} us; its {len(inside)} kernels alone {kern:.1f} us; "
      f"{len(step) - len(inside)} kernels outside it")
if gpu:
    print(f"  between kernels inside the recorded step: {gpu - kern:.1f} us "
          f"({(gpu - kern) / max(len(inside), 1):.2f} us a kernel); outside it (sampling, "
          f"uploads, host): {wall - gpu:.1f} us")
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
if gpu:
    print(f"| (between kernels) | | | | | {gpu - kern:.1f} | | {100 * (gpu - kern) / ref:.1f}% |")
if wall and gpu:
    print(f"| (outside the recorded step) | | | | | {wall - gpu:.1f} | | {100 * (wall - gpu) / ref:.1f}% |")
EOF
