#!/usr/bin/env bash
# The paged decode attention benchmark and its SDPA peers (cuDNN, flash, efficient) in the
# same run. First each alone: bench_attention's chunking sweep and table, and every SDPA backend
# and call form (sdpa_peer.py); their TB/s are listed side by side, without ratios, since they
# were taken minutes apart. Then the ratio: ours and cuDNN in turns, several trials each, timed
# the same way (sdpa_peer.py --ours). $BENCH is the bench_attention binary (default
# build-gpu/bench/); $BENCH_S, $PEER_S and $FAIR_S bound each part in seconds; $TRIALS is the
# turns per side. Logs go to $OUT (or ./bench-out). bench/run_gpu.sh calls it; alone:
# bench/run_attention.sh [reps]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
REPS=${1:-50}
BENCH=${BENCH:-build-gpu/bench/bench_attention}

timeout "${BENCH_S:-240}" "$BENCH" "$REPS" > "$OUT/bench.txt" 2> "$OUT/bench.lines"
PYTHONUNBUFFERED=1 timeout "${PEER_S:-200}" python3 tools/reference/sdpa_peer.py "$REPS" > "$OUT/peer.txt" 2>&1
PYTHONUNBUFFERED=1 timeout "${FAIR_S:-200}" python3 tools/reference/sdpa_peer.py "$REPS" \
    --trials "${TRIALS:-7}" --ours "$BENCH" > "$OUT/fair.txt" 2>&1

echo "== benchmark"
cat "$OUT/bench.txt"
grep -v "^shape" "$OUT/bench.lines"
grep -v "^peer shape" "$OUT/peer.txt"
python3 - "$OUT/bench.lines" "$OUT/peer.txt" <<'PY'
import sys
ours, peer = {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if f and f[0] == "shape":
        ours[f[1]] = dict(zip(f[2::2], map(float, f[3::2])))
for line in open(sys.argv[2]):
    f = line.split()
    if f[:2] == ["peer", "shape"]:
        peer[f[2]] = dict(zip(f[3::2], f[4::2]))
nan = float("nan")
print("each alone (ratios below): v1, v2: F32 q/out (the backend's activations); v2 at the "
      "planner's chunking or twice it, the better; bf16: q/out BF16")
print(f"{'shape':<12} {'v1':>6} {'v2':>6} {'v1bf16':>6} {'v2bf16':>6} {'cudnn':>6} "
      f"{'call':<9} {'flash':>6} {'effic':>6} {'copy':>6} {'v2/copy':>7}")
for s, o in ours.items():
    p = peer.get(s, {})
    v2 = max(o["v2_tbs"], o["v2x2_tbs"])
    print(f"{s:<12} {o['v1_tbs']:6.3f} {v2:6.3f} {o['v1bf16_tbs']:6.3f} {o['v2bf16_tbs']:6.3f} "
          f"{float(p.get('cudnn_tbs', nan)):6.3f} {p.get('cudnn_call', '-'):<9} "
          f"{float(p.get('flash_tbs', nan)):6.3f} {float(p.get('efficient_tbs', nan)):6.3f} "
          f"{o['copy_tbs']:6.3f} {v2 / o['copy_tbs']:7.2f}")
PY
echo "== ours and cuDNN in turns"
grep -vE "^(device|copy|peer)" "$OUT/fair.txt"
