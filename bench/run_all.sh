#!/usr/bin/env bash
# Runs the CUDA backend's tests, the attention benchmark and the SDPA peers, and prints one
# table. The binaries come from $BENCH (bench_attention) and $TESTS (test binaries, space
# separated) when set, e.g. from a CMake build; otherwise they are built here with nvcc alone
# (no CMake, none of the CLI's libraries). $TEST_S, $BENCH_S and $PEER_S bound each part in
# seconds. Logs go to $OUT (or ./bench-out). Run from a checkout: bench/run_all.sh [reps]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
REPS=${1:-50}
NVCC=${NVCC:-nvcc}
BIN=${BIN:-build-cuda}
FLAGS=(-std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90 -Isrc)

build() {
    mkdir -p "$BIN/obj"
    local pids=()
    for f in src/backend/cuda/*.cu; do
        "$NVCC" "${FLAGS[@]}" -c "$f" -o "$BIN/obj/$(basename "$f").o" & pids+=($!)
    done
    for f in src/base/*.c; do
        gcc -std=c11 -O2 -D_GNU_SOURCE -Isrc -c "$f" -o "$BIN/obj/$(basename "$f").o" & pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || return 1; done
    for t in tests/backend/test_cuda_*.c; do
        "$NVCC" "${FLAGS[@]}" -Itests -x c -c "$t" -o "$BIN/obj/t_$(basename "$t" .c).o" || return 1
        "$NVCC" -o "$BIN/$(basename "$t" .c)" "$BIN/obj/t_$(basename "$t" .c).o" \
            "$BIN"/obj/cuda_*.o "$BIN"/obj/base_*.o -lm -lpthread || return 1
    done
    "$NVCC" "${FLAGS[@]}" -o "$BIN/bench_attention" bench/bench_attention.cu "$BIN"/obj/cuda_*.o \
        "$BIN"/obj/base_*.o -lm -lpthread
}

if [ -z "${BENCH:-}" ]; then
    # Binaries built elsewhere are used when this machine's libraries can load them.
    if [ ! -x "$BIN/bench_attention" ] || ldd "$BIN/bench_attention" | grep -q "not found"; then
        BIN=$BIN-local
        build > "$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; exit 1; }
    fi
    BENCH=$BIN/bench_attention
    TESTS=$(echo "$BIN"/test_cuda_*)
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/gpu.txt" 2>&1

declare -A result
for t in $TESTS; do
    name=$(basename "$t")
    timeout "${TEST_S:-300}" "$t" > "$OUT/$name.log" 2>&1
    rc=$?
    result[$name]="rc=$rc $(tail -n 1 "$OUT/$name.log")"
done

timeout "${BENCH_S:-240}" "$BENCH" "$REPS" > "$OUT/bench.txt" 2> "$OUT/bench.lines"
PYTHONUNBUFFERED=1 timeout "${PEER_S:-200}" python3 tools/reference/sdpa_peer.py "$REPS" > "$OUT/peer.txt" 2>&1

echo "== tests"
for k in "${!result[@]}"; do echo "$k: ${result[$k]}"; done | sort
for t in $TESTS; do grep -h "CHECK failed" "$OUT/$(basename "$t").log" | head -5; done
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
print("v1, v2: F32 q/out (the backend's activations); v2 at the planner's chunking or twice it,"
      " the better; bf16: q/out BF16")
print(f"{'shape':<12} {'v1':>6} {'v2':>6} {'v1bf16':>6} {'v2bf16':>6} {'cudnn':>6} "
      f"{'call':<9} {'flash':>6} {'effic':>6} {'copy':>6} {'v1/cud':>6} {'v2/cud':>6} "
      f"{'v2/copy':>7}")
for s, o in ours.items():
    p = peer.get(s, {})
    c = float(p.get("cudnn_tbs", nan))
    v2 = max(o["v2_tbs"], o["v2x2_tbs"])
    print(f"{s:<12} {o['v1_tbs']:6.3f} {v2:6.3f} {o['v1bf16_tbs']:6.3f} {o['v2bf16_tbs']:6.3f} "
          f"{c:6.3f} {p.get('cudnn_call', '-'):<9} {float(p.get('flash_tbs', nan)):6.3f} "
          f"{float(p.get('efficient_tbs', nan)):6.3f} {o['copy_tbs']:6.3f} "
          f"{o['v1_tbs'] / c:6.2f} {v2 / c:6.2f} {v2 / o['copy_tbs']:7.2f}")
PY
