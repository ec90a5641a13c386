#!/usr/bin/env bash
# mlxcel against llama.cpp on this machine's CPU, in the same run: the random Llama-3.2-1B shape,
# MLX affine 4- and 8-bit (group 64) for mlxcel, Q4_0 and Q8_0 of the same bf16 weights for
# llama.cpp, prompt processing of 128 tokens and 32 decode steps at THREADS threads, the two
# engines in turns (who goes first alternates) for ROUNDS rounds, each test best of REPS runs a
# turn; the machine's memory read bandwidth is the one `mlxcel bench` measures as its ceiling
# at the start of each of its turns. Prints one table.
#
#   bench/run_cpu.sh            (env: ROUNDS=3 REPS=2 THREADS=2 BUILD=build-cpu
#                                     WORK=/tmp/mlxcel-bench-cpu PYTHON=/usr/bin/python3)
#
# Needs: mlxcel built in BUILD (configured and built here when missing), Python 3 with numpy,
# node and the peer's packages in bench/node (npm install --prefix bench/node, done here when
# missing: the prebuilt llama.cpp CPU libraries of node-llama-cpp, not a test dependency).
# Models and GGUFs are made in WORK once (about 7 GB) and reused; a GGUF older than
# bench/make_gguf.py is made again.
#
# Before timing anything it checks the peer: make_gguf.py's Q4_0 / Q8_0 blocks equal ggml's
# reference quantizers byte for byte, and llama.cpp's greedy ids on models/demo (converted to
# F32 from its 4-bit weights, so both engines hold the same values) equal `mlxcel generate
# --temp 0` for the same prompt ids; either failing stops the run.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
REPS=${REPS:-2}
THREADS=${THREADS:-2}
BUILD=${BUILD:-build-cpu}
WORK=${WORK:-/tmp/mlxcel-bench-cpu}
PYTHON=${PYTHON:-/usr/bin/python3}
MLXCEL=$BUILD/bin/mlxcel
GGML_BASE=bench/node/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so
mkdir -p "$WORK"

if [ ! -x "$MLXCEL" ]; then
    cmake -S . -B "$BUILD" -DMLXCEL_CUDA=OFF >/dev/null
    cmake --build "$BUILD" -j"$(nproc)" --target mlxcel >/dev/null
fi
# npm install, not npm ci: the lock holds only the linux-x64 build of node-llama-cpp's optional
# per-platform packages, which npm ci (npm 11) refuses as out of sync; install keeps the locked
# versions.
[ -d bench/node/node_modules/node-llama-cpp ] ||
    npm install --prefix bench/node --silent --no-audit --no-fund

# --- the models ---------------------------------------------------------------------------------
BF16=$WORK/llama1b-bf16
[ -f "$BF16/config.json" ] || "$PYTHON" tools/make_random_model.py llama-3.2-1b "$BF16"
for bits in 4 8; do
    [ -f "$WORK/llama1b-q$bits/config.json" ] ||
        "$MLXCEL" quantize -m "$BF16" -o "$WORK/llama1b-q$bits" --bits $bits --group-size 64 >/dev/null
    gguf=$WORK/llama1b-q${bits}_0.gguf
    [ "$gguf" -nt bench/make_gguf.py ] || "$PYTHON" bench/make_gguf.py "$BF16" "$gguf" --type q${bits}_0
done

# --- the peer checked -----------------------------------------------------------------------------
"$PYTHON" bench/check_gguf_blocks.py "$GGML_BASE"
"$PYTHON" bench/make_gguf.py models/demo "$WORK/demo-f32.gguf" --type f32 >/dev/null
for prompt in 1,450,4996,17354 1,15043,29892,590,1024,338; do
    ours=$("$MLXCEL" generate -m models/demo --tokens $prompt -n 32 --temp 0 -t "$THREADS" --json \
        2>/dev/null | tail -n 1)
    peer=$(node bench/peer_cpu.mjs -m "$WORK/demo-f32.gguf" --tokens $prompt -n 32 -t "$THREADS")
    "$PYTHON" -c 'import json, sys
a, b = (json.loads(s)["tokens"] for s in sys.argv[2:])
if a != b:
    sys.exit(f"demo greedy ids differ after prompt {sys.argv[1]}:\n  mlxcel    {a}\n  llama.cpp {b}")
print(f"demo, prompt {sys.argv[1]}: {len(a)} greedy ids equal")' "$prompt" "$ours" "$peer"
done

# --- the turns ----------------------------------------------------------------------------------
RESULTS=$WORK/results.jsonl
: >"$RESULTS"
tag() { # round engine bits: wraps each JSON line of stdin
    while read -r line; do
        printf '{"round":%d,"engine":"%s","bits":%d,"row":%s}\n' "$1" "$2" "$3" "$line"
    done >>"$RESULTS"
}
load() { printf '{"load":%s}\n' "$(cut -d' ' -f1 /proc/loadavg)" >>"$RESULTS"; }
run_mlxcel() {
    "$MLXCEL" bench -m "$WORK/llama1b-q$2" -t "$THREADS" -p 128 -n 32 -r "$REPS" --json \
        2>/dev/null | tag "$1" mlxcel "$2"
}
run_peer() {
    node bench/peer_cpu.mjs -m "$WORK/llama1b-q${2}_0.gguf" -t "$THREADS" -p 128 -n 32 -r "$REPS" \
        --json | tag "$1" llama.cpp "$2"
}
for round in $(seq 1 "$ROUNDS"); do
    for bits in 4 8; do
        load
        if [ $((round % 2)) -eq 1 ]; then
            run_mlxcel "$round" $bits
            load
            run_peer "$round" $bits
        else
            run_peer "$round" $bits
            load
            run_mlxcel "$round" $bits
        fi
    done
    echo "round $round of $ROUNDS done" >&2
done
load

"$PYTHON" bench/cpu_table.py "$RESULTS" "$BF16" "$THREADS" "$REPS"
