#!/usr/bin/env bash
# Every CUDA check and benchmark in one go, on one GPU: builds with CMake, runs the CUDA tests
# (ops, attention, prefill attention, candidates, the past-2^32 pool, every fixture end to end,
# recorded decode steps), measures the ceilings (device-to-device copy bandwidth, bf16 GEMM rate
# through torch.matmul), then the benchmarks, each next to its ceiling and, where one exists,
# its peer measured in the same run:
#   a. paged decode attention (bench_attention) against cuDNN/flash SDPA (tools/reference/sdpa_peer.py);
#   b. the decode GEMV and the quantized GEMM per 8B matrix (bench_cuda_gemv), 1 to 512 rows,
#      against the copy bandwidth and the dequantize + cuBLAS path;
#   c. causal prefill attention (bench_prefill_attention) against SDPA (sdpa_prefill_peer.py);
#   d. a random Llama-3.1-8B-shaped MLX 4-bit model (bench/make_random_q4.py): decode at 1, 8, 16, 32,
#      64, 128 and 256 sequences (batch 1 also with recorded steps off), 2048-token prefill; the
#      Gemma-3-4B and Phi-4-mini shapes decoded at the same batches, each one's share of the
#      copy bandwidth beside the 8B's;
#   e. the scheduler the server uses (bench_server), 1 to 64 clients;
#   and llama.cpp decoding a Q4_0 GGUF of the 8B model's weights (bench/make_gguf.py) at d.'s
#   batches, built for CUDA beside our build from PEER_SRC (bench/peer_llama.sh pack makes it:
#   llama.cpp's source from node-llama-cpp's npm package; carry it), when that file is there;
# then the profiles behind the figures: one decode step kernel by kernel (bench/decode_profile.sh)
# and ncu of the 1-row GEMV, the tensor-core GEMV and decode attention.
# Logs go to $OUT (default ./bench-out); summary.txt holds what is printed.
#
#   bench/run_gpu.sh
# Environment: MLXCEL_DEPS_PREFIX (libraries unpacked by tools/device-deps.sh, for machines
# without the -dev packages), MODEL (where the 8B model is written, default /tmp/llama8b-q4),
# MODEL_GEMMA and MODEL_PHI (the Gemma-3-4B and Phi-4-mini shapes, default /tmp/gemma3-4b-q4 and
# /tmp/phi4-mini-q4), BUILD_DIR (default build-gpu), REPS (attention repetitions, default 20), MLXCEL_COMMIT (the
# commit to print, when the tree's .git is not its own), PEER_SRC (default
# bench/.peer/llama.cpp.tar.gz) and PEER_DIR (where llama.cpp is built, default /tmp/llama-peer).
set -u
cd "$(dirname "$0")/.."
SRC=$PWD
OUT=${OUT:-$SRC/bench-out}
MODEL=${MODEL:-/tmp/llama8b-q4}
MODEL_GEMMA=${MODEL_GEMMA:-/tmp/gemma3-4b-q4}
MODEL_PHI=${MODEL_PHI:-/tmp/phi4-mini-q4}
B=${BUILD_DIR:-$SRC/build-gpu}
REPS=${REPS:-20}
DEPS=${MLXCEL_DEPS_PREFIX:-}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
say() { tee -a "$OUT/summary.txt"; }

# Shared libraries: the unpacked dependencies (and their pkg-config), then cuBLAS from the
# toolkit or from PyTorch's CUDA wheels, whichever this machine has.
libs=()
if [ -n "$DEPS" ]; then
    libs+=("$DEPS/usr/lib/x86_64-linux-gnu")
    export PATH=$DEPS/usr/bin:$PATH
fi
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
export MLXCEL_SOURCE_DIR=$SRC MLXCEL_BIN_DIR=$B/bin

# A copy of the tree may carry an older .git than its files: MLXCEL_COMMIT names the real one.
commit=${MLXCEL_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
log "commit $commit, $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem \
    --format=csv,noheader | say

TESTS="$(cd tests && ls backend/test_cuda_*.c model/test_*_cuda.c | xargs -n1 basename | sed 's/\.c$//' | tr '\n' ' ')"
BENCHES="bench_server bench_attention bench_cuda_gemv bench_prefill_attention"
t0=$(date +%s)
# The models that are not there yet, one after another on the GPU while the build runs.
make_models() {
    local m
    for m in "llama-3.1-8b $MODEL" "gemma-3-4b $MODEL_GEMMA" "phi-4-mini $MODEL_PHI"; do
        set -- $m
        [ -f "$2/model.safetensors" ] || python3 bench/make_random_q4.py "$2" --shape "$1" || return 1
    done
}
(PYTHONUNBUFFERED=1 make_models > "$OUT/make_model.log" 2>&1) &
model_pid=$!
PEER_SRC=${PEER_SRC:-$SRC/bench/.peer/llama.cpp.tar.gz}
PEER_DIR=${PEER_DIR:-/tmp/llama-peer}
peer_pid=
if [ -f "$PEER_SRC" ]; then
    mkdir -p "$PEER_DIR"
    bench/peer_llama.sh build "$PEER_SRC" "$PEER_DIR" cuda > "$OUT/peer_build.log" 2>&1 &
    peer_pid=$!
fi
{ cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release ${DEPS:+-DMLXCEL_DEPS_PREFIX=$DEPS} &&
    cmake --build "$B" -j "$(nproc)" --target mlxcel $TESTS $BENCHES; } > "$OUT/build.log" 2>&1 ||
    { tail -40 "$OUT/build.log"; exit 1; }
log "built in $(($(date +%s) - t0)) s"
wait "$model_pid" || { tail -5 "$OUT/make_model.log"; exit 1; }
MLX=$B/bin/mlxcel
# the peer's GGUF of the 8B weights, on the CPU while the tests run
gguf_pid=
if [ -n "$peer_pid" ]; then
    python3 bench/make_gguf.py "$MODEL" "$PEER_DIR/8b-q4_0.gguf" --type q4_0 \
        > "$OUT/peer_gguf.log" 2>&1 &
    gguf_pid=$!
fi

for t in $TESTS; do
    timeout 200 "$B/tests/$t" > "$OUT/$t.log" 2>&1
    rc=$?
    log "$t: rc $rc ($(grep -Eo '[0-9]+ passed, [0-9]+ failed|skipped.*' "$OUT/$t.log" | tail -1))"
    grep -h "CHECK failed" "$OUT/$t.log" | head -5 | say
done
grep -E "max rel err" "$OUT/test_fixtures_cuda.log" | head -32 > "$OUT/fixture_errors.txt"
grep -E "recorded|unrecorded" "$OUT/test_graph_cuda.log" | head -8 | say

log "demo, greedy, --device cuda then cpu"
for dev in cuda cpu; do
    timeout 60 "$MLX" run -m models/demo -p "Once upon a time" -n 40 --temp 0 --device $dev \
        2> /dev/null | say
done

log "ceiling: bf16 GEMM, torch.matmul 8192^3 on random data, median of 10"
PYTHONUNBUFFERED=1 python3 - <<'EOF' 2>&1 | tee "$OUT/gemm.txt" | say
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

log "a. paged decode attention against SDPA"
OUT=$OUT/attention BENCH=$B/bench/bench_attention BENCH_S=90 PEER_S=90 \
    bench/run_attention.sh "$REPS" 2>&1 | tail -30 | say

log "b. decode GEMV and the quantized GEMM"
# The integer-dot GEMV ("rows") passes over W twice a row pair: timed to 32 rows only; the
# tensor-core GEMV, the cuBLAS path and the product's choice at every row count.
timeout 60 "$B/bench/bench_cuda_gemv" 7 all 0 rows 1,2,4,8,16,32 2>&1 | say
timeout 120 "$B/bench/bench_cuda_gemv" 7 all 0 mma,cublas,auto 2>&1 | say

log "c. prefill attention against SDPA"
timeout 60 "$B/bench/bench_prefill_attention" 10 2>&1 | tail -6 | say
PYTHONUNBUFFERED=1 timeout 60 python3 tools/reference/sdpa_prefill_peer.py 10 2>&1 | grep peer | say

log "d. the 8B model: decode, 128 steps after a 512-token prompt in each sequence's cache"
timeout 200 "$MLX" bench -m "$MODEL" -p 512 -n 128 -d 512 -b 1,8,16,32,64,128,256 -r 2 --device cuda 2>&1 |
    tee "$OUT/bench_decode.txt" | say
if [ -n "$peer_pid" ]; then
    log "d. the peer: llama.cpp, Q4_0 of the same weights, the same batches, 512-token prompts, 128 steps"
    if wait "$peer_pid" && wait "$gguf_pid"; then
        bench/peer_llama.sh decode "$PEER_DIR" "$PEER_DIR/8b-q4_0.gguf" 1,8,16,32,64,128,256 512 128 \
            2>&1 | tee "$OUT/peer_decode.txt" | say
        python3 - "$OUT" <<'EOF' | say
import re, sys
out = sys.argv[1]
ours = {int(m[1]): float(m[2]) for m in re.finditer(
    r"\|\s*tg128@d512\s*\|\s*(\d+)\s*\|\s*([\d.]+)", open(f"{out}/bench_decode.txt").read())}
peer = {int(m[1]): float(m[2]) for m in re.finditer(
    r"peer decode batch (\d+): ([\d.]+)", open(f"{out}/peer_decode.txt").read())}
print("| sequences | mlxcel tok/s | llama.cpp tok/s | ratio |")
print("|---|---|---|---|")
for b in sorted(set(ours) & set(peer)):
    print(f"| {b} | {ours[b]:.1f} | {peer[b]:.1f} | {ours[b] / peer[b]:.2f} |")
EOF
    else
        tail -5 "$OUT/peer_build.log" "$OUT/peer_gguf.log" | say
    fi
fi
log "d. batch 1 from an empty cache (llama-bench's tg128), and with recorded steps off"
timeout 60 "$MLX" bench -m "$MODEL" -p 0 -n 128 -b 1 -r 2 --device cuda 2>&1 | grep tg128 | say
MLXCEL_DECODE_GRAPHS=0 timeout 60 "$MLX" bench -m "$MODEL" -p 0 -n 128 -d 512 -b 1 -r 2 \
    --device cuda 2>&1 | grep tg128 | say
log "d. the Gemma-3-4B and Phi-4-mini shapes: decode at the 8B's batches, share of copy bandwidth"
for m in "gemma3-4b $MODEL_GEMMA" "phi4-mini $MODEL_PHI"; do
    set -- $m
    timeout 200 "$MLX" bench -m "$2" -p 512 -n 128 -d 512 -b 1,8,16,32,64,128,256 -r 2 \
        --device cuda > "$OUT/bench_decode_$1.txt" 2>&1 || tail -3 "$OUT/bench_decode_$1.txt" | say
done
python3 - "$OUT" <<'EOF' | tee "$OUT/families_decode.txt" | say
import re, sys
out = sys.argv[1]
row = re.compile(r"\|\s*(tg\d+(?:@d\d+)?)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)%")
names = [("llama-3.1-8b", "bench_decode.txt"), ("gemma-3-4b", "bench_decode_gemma3-4b.txt"),
         ("phi-4-mini", "bench_decode_phi4-mini.txt")]
runs = {}
for name, f in names:
    try:
        text = open(f"{out}/{f}").read()
    except OSError:
        text = ""
    runs[name] = {(m[1], int(m[2])): (float(m[3]), float(m[5])) for m in row.finditer(text)}
keys = sorted(set().union(*runs.values()))
print("| test | batch | " + " | ".join(f"{n} tok/s | share" for n, _ in names) + " |")
print("|---|---|" + "---|---|" * len(names))
for k in keys:
    cells = [runs[n].get(k) for n, _ in names]
    print(f"| {k[0]} | {k[1]} | " + " | ".join(
        f"{c[0]:.0f} | {c[1]:.1f}%" if c else "- | -" for c in cells) + " |")
EOF
log "d. the 8B model: prefill"
timeout 100 "$MLX" bench -m "$MODEL" -p 2048 -n 0 -r 3 --device cuda 2>&1 |
    tee "$OUT/bench_prefill.txt" | say

log "e. scheduler"
timeout 100 "$B/bench/bench_server" "$MODEL" 1 cuda 2>&1 | tail -8 | say

MODEL_CONFIG=$MODEL/config.json python3 - "$OUT" <<'EOF' | say
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
for m in re.finditer(r"\|\s*(tg\d+(?:@d\d+)?)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)%", text):
    print(f"| {m[1]} | {m[2]} | {m[3]} | {m[4]} GB/s of weights and KV | {m[5]}% of copy bw |")
for f in ("bench_decode.txt", "bench_prefill.txt"):
    for m in re.finditer(r"\|\s*pp(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)", open(f"{out}/{f}").read()):
        n, tps = int(m[1]), float(m[3])
        flop = 2 * n * layer_params * L + 2 * n * n * hd * H * L
        tf = flop / (n / tps) / 1e12
        print(f"| pp{n} | 1 | {tps:.0f} | {tf:.1f} TFLOP/s | {100 * tf / gemm:.1f}% of GEMM |")
EOF
log "profiles: one batch-1 decode step kernel by kernel after a 576-token prompt"
MLX=$MLX KV=576 OUT=$OUT/profile timeout 200 bench/decode_profile.sh "$MODEL" 2>&1 | tail -22 | say
prof() { # what, ncu kernel regex, launches to skip, command...
    local what=$1 re=$2 skip=$3
    shift 3
    log "profile: $what"
    timeout 60 ncu --clock-control none --kernel-name "regex:$re" --launch-skip "$skip" --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats "$@" 2>&1 |
        grep -E "^  [a-z].*\(|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit (Reg|Shared)|Issued Instruction|Mem Busy" |
        sed 's/  */ /g' | say
}
# bench_cuda_gemv replays each row count's graph of 8 launches (gate+up, lm_head) 1 + reps
# times, rows 1, 2, 4, 8, 16 in turn: skipping 100 lands on 8 rows.
prof "the 1-row GEMV on lm_head (4-bit)" gemv1_kernel 2 "$B/bench/bench_cuda_gemv" 3 lm_head 4 rows
prof "the tensor-core GEMV at 8 rows on gate+up (4-bit)" gmma_kernel 100 \
    "$B/bench/bench_cuda_gemv" 3 gate+up 4 mma
prof "the quantized GEMM at 64 rows on gate+up (4-bit)" qg_kernel 1 \
    "$B/bench/bench_cuda_gemv" 3 gate+up 4 auto 64
prof "decode attention v2 at 64x4096" paged_decode_mma 1 "$B/bench/bench_attention" 3 64x4096
log "done in $(($(date +%s) - t0)) s"

# f. Mixtures of experts: random Qwen3-30B-A3B-shaped (4-bit group 64, 8-bit routers) and
# gpt-oss-20b-shaped (MXFP4 experts, 8-bit rest) checkpoints made by bench/make_moe_q4.py
# (into MOE_DIR, default /tmp; 17.2 and 12.1 GB, kept for the next run), each benchmarked
# with a 2048-token prefill and 64 decode steps at 1, 8 and 64 sequences.
MOE_DIR=${MOE_DIR:-/tmp}
for shape in qwen3-30b-a3b gpt-oss-20b; do
    moe=$MOE_DIR/$shape-q4
    if [ ! -f "$moe/model.safetensors" ]; then
        log "f. making the $shape model"
        PYTHONUNBUFFERED=1 timeout 900 python3 bench/make_moe_q4.py "$moe" --shape "$shape" \
            > "$OUT/make_$shape.log" 2>&1 || { tail -5 "$OUT/make_$shape.log" | say; continue; }
        tail -2 "$OUT/make_$shape.log" | say
    fi
    log "f. $shape: prefill 2048, then 64 decode steps at 1, 8 and 64 sequences"
    timeout 600 "$MLX" bench -m "$moe" -p 2048 -n 64 -b 1,8,64 -r 1 --device cuda 2>&1 |
        tee "$OUT/bench_$shape.txt" | say
done
log "f. done in $(($(date +%s) - t0)) s"
