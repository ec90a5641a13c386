#!/usr/bin/env bash
# End to end on one CUDA GPU: the CUDA tests (ops, attention, every fixture through the whole
# model), the demo model's story, then the benchmarks of a random Llama-3.1-8B-shaped MLX
# 4-bit model made on the GPU (bench/make_llama8b_q4.py): decode at 1, 8, 64 and 256
# sequences against the copy bandwidth `mlxcel bench` measures in the same run, and a
# 2048-token prefill against the bf16 GEMM rate (torch.matmul 8192^3 on random data, median
# of ten) measured here too. Logs go to $OUT (default ./bench-out); a table is printed last.
#
#   bench/run_gpu.sh            # builds with CMake into build-gpu unless BIN_DIR holds
#                               # binaries this machine can load (BIN_DIR/bin, BIN_DIR/tests)
# Environment: MLXCEL_DEPS_PREFIX (unpacked jansson/pcre2/utf8proc, tools/device-deps.sh),
# MODEL (where the 8B model is written, default /tmp/llama8b-q4), BIN_DIR, OUT.
set -u
cd "$(dirname "$0")/.."
SRC=$PWD
OUT=${OUT:-$SRC/bench-out}
MODEL=${MODEL:-/tmp/llama8b-q4}
BIN_DIR=${BIN_DIR:-$SRC/build-gpu}
DEPS=${MLXCEL_DEPS_PREFIX:-}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }

# Shared libraries: the unpacked dependencies, then cuBLAS/cudart from the toolkit or from
# PyTorch's CUDA wheels, whichever this machine has.
libs=()
[ -n "$DEPS" ] && libs+=("$DEPS/usr/lib/x86_64-linux-gnu")
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublas.so.13" ] && libs+=("$d")
done
while read -r d; do [ -n "$d" ] && libs+=("$d"); done < <(python3 - <<'EOF' 2>/dev/null
import glob, os, site
seen = set()
for s in site.getsitepackages():
    for p in glob.glob(s + "/nvidia/**/libcublas*.so*", recursive=True):
        seen.add(os.path.dirname(p))
print("\n".join(sorted(seen)))
EOF
)
LD_LIBRARY_PATH=$(IFS=:; echo "${libs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH

commit=$(git rev-parse --short=12 HEAD 2>/dev/null || cat COMMIT 2>/dev/null || echo unknown)
log "commit $commit, $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem \
    --format=csv,noheader | tee -a "$OUT/summary.txt"

if [ ! -x "$BIN_DIR/bin/mlxcel" ] || ldd "$BIN_DIR/bin/mlxcel" | grep -q "not found"; then
    log "building with CMake into build-gpu"
    BIN_DIR=$SRC/build-gpu
    # CMake's FindPkgConfig needs a pkg-config binary; a carried one (PKGCONF_DIR) will do.
    if [ -n "${PKGCONF_DIR:-}" ] && ! command -v pkg-config > /dev/null; then
        export PATH=$PKGCONF_DIR:$PATH LD_LIBRARY_PATH=$PKGCONF_DIR:$LD_LIBRARY_PATH
    fi
    { cmake -S . -B "$BIN_DIR" -DCMAKE_BUILD_TYPE=Release ${DEPS:+-DMLXCEL_DEPS_PREFIX=$DEPS} &&
        cmake --build "$BIN_DIR" -j "$(nproc)" --target mlxcel test_cuda_ops test_cuda_attention \
            test_cuda_pool64 test_fixtures_cuda; } > "$OUT/build.log" 2>&1 ||
        { tail -40 "$OUT/build.log"; exit 1; }
fi
MLX=$BIN_DIR/bin/mlxcel

declare -A res
for t in test_cuda_ops test_cuda_attention test_cuda_pool64 test_fixtures_cuda; do
    MLXCEL_SOURCE_DIR=$SRC MLXCEL_BIN_DIR=$BIN_DIR/bin timeout 300 "$BIN_DIR/tests/$t" \
        > "$OUT/$t.log" 2>&1
    res[$t]="rc $? ($(grep -Eo '[0-9]+ passed, [0-9]+ failed' "$OUT/$t.log" | tail -1))"
    log "$t: ${res[$t]}"
done
grep -E "max rel err|FAIL" "$OUT/test_fixtures_cuda.log" | head -40

for dev in cuda cpu; do
    log "demo, --device $dev, greedy:"
    timeout 120 "$MLX" run -m models/demo -p "Once upon a time" -n 40 --temp 0 --device $dev \
        2>&1 | tee "$OUT/demo_$dev.txt" | tee -a "$OUT/summary.txt"
done

if [ ! -f "$MODEL/model.safetensors" ]; then
    t0=$(date +%s)
    PYTHONUNBUFFERED=1 python3 bench/make_llama8b_q4.py "$MODEL" 2>&1 | tee "$OUT/make_model.log"
    log "model made in $(($(date +%s) - t0)) s"
fi

log "GEMM ceiling: torch.matmul 8192^3 bf16, random data"
PYTHONUNBUFFERED=1 python3 - <<'EOF' 2>&1 | tee "$OUT/gemm.txt" | tee -a "$OUT/summary.txt"
import statistics, torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    torch.matmul(a, b)
times = []
for _ in range(10):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    torch.matmul(a, b)
    e.record()
    torch.cuda.synchronize()
    times.append(s.elapsed_time(e) / 1e3)
print(f"gemm_tflops {2 * n**3 / statistics.median(times) / 1e12:.1f}")
EOF

log "decode: mlxcel bench -p 512 -n 128 -b 1,8,64,256"
timeout 400 "$MLX" bench -m "$MODEL" -p 512 -n 128 -b 1,8,64,256 -r 2 --device cuda 2>&1 |
    tee "$OUT/bench_decode.txt" | tee -a "$OUT/summary.txt"
log "prefill: mlxcel bench -p 2048 -n 0"
timeout 200 "$MLX" bench -m "$MODEL" -p 2048 -n 0 -r 3 --device cuda 2>&1 |
    tee "$OUT/bench_prefill.txt" | tee -a "$OUT/summary.txt"

# One decode step's kernels, for where the time goes (Nsight Compute, where it can read the
# counters): skip the first steps' launches, profile about one step's worth. NCU=0 skips it.
if [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
    timeout 150 ncu --clock-control none --launch-skip 2000 --launch-count 540 --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        "$MLX" bench -m "$MODEL" -p 0 -n 8 -b 1 -r 1 --device cuda > "$OUT/ncu_decode.csv" 2>&1
    log "ncu rc $?"
    python3 bench/ncu_summary.py "$OUT/ncu_decode.csv" 2>&1 | tee -a "$OUT/summary.txt"
fi

MODEL_CONFIG=$MODEL/config.json python3 - "$OUT" <<'EOF' | tee -a "$OUT/summary.txt"
import json, os, re, sys
out = sys.argv[1]
cfg = json.load(open(os.environ["MODEL_CONFIG"]))
h, L, H, KV = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
hd, inter = cfg["head_dim"], cfg["intermediate_size"]
layer_params = h * H * hd * 2 + 2 * h * KV * hd + 3 * h * inter
gemm = float(re.search(r"gemm_tflops ([\d.]+)", open(f"{out}/gemm.txt").read()).group(1))
text = open(f"{out}/bench_decode.txt").read()
bw = float(re.search(r"copy bandwidth ([\d.]+) GB/s", text).group(1))
print(f"\nceilings: copy bandwidth {bw:.0f} GB/s (read + write), bf16 GEMM {gemm:.0f} TFLOP/s")
print("| test | batch | tok/s | figure | share of ceiling |")
print("|---|---|---|---|---|")
for m in re.finditer(r"\|\s*(tg\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)%", text):
    print(f"| {m[1]} | {m[2]} | {m[3]} | {m[4]} GB/s of weights | {m[5]}% of copy bw |")
for f in ("bench_decode.txt", "bench_prefill.txt"):
    for m in re.finditer(r"\|\s*pp(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)", open(f"{out}/{f}").read()):
        n, tps = int(m[1]), float(m[3])
        flop = 2 * n * layer_params * L + 2 * n * n * hd * H * L
        tf = flop / (n / tps) / 1e12
        print(f"| pp{n} | 1 | {tps:.0f} | {tf:.1f} TFLOP/s | {100 * tf / gemm:.1f}% of GEMM |")
EOF
