#!/usr/bin/env bash
# llama.cpp as the peer of a benchmark, for a machine with no copy of its source beside the
# checkout (../shared/peers): the source comes from the git bundle that node-llama-cpp's npm
# package ships (bench/node, the CPU benchmark's peer), at the release its prebuilt CPU
# libraries were built from, so both peers are the same llama.cpp.
#
#   bench/peer_llama.sh pack [OUT.tar.gz]     where npm works: the source needed to build
#                                             llama-bench and llama-batched-bench, about 7 MB
#                                             (default bench/.peer/llama.cpp.tar.gz, git-ignored:
#                                             carry it to a machine without network)
#   bench/peer_llama.sh build SRC.tar.gz DIR cuda|cpu
#                                             unpacks and builds both tools in DIR (CUDA for
#                                             compute capability 9.0 alone)
#   bench/peer_llama.sh decode DIR MODEL.gguf BATCHES [PROMPT [GEN]]
#                                             llama-batched-bench: BATCHES (1,8,...) sequences,
#                                             each with its own PROMPT-token prompt (default 512)
#                                             then GEN (default 64) decode steps, every layer on
#                                             the GPU when DIR was built for CUDA; prints one line
#                                             a batch: "peer decode batch B: T tok/s"
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
pack)
    out=${2:-bench/.peer/llama.cpp.tar.gz}
    bundle=bench/node/node_modules/node-llama-cpp/llama/gitRelease.bundle
    # npm install, not npm ci: bench/run_cpu.sh says why
    [ -f "$bundle" ] || npm install --prefix bench/node --silent --no-audit --no-fund
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    git clone -q "$bundle" "$tmp/src" 2>/dev/null
    mkdir -p "$(dirname "$out")"
    # the build's own files only: the web UI is the server's, which is not built
    git -C "$tmp/src" archive --format=tar --prefix=llama.cpp/ HEAD CMakeLists.txt cmake ggml src \
        include common tools vendor licenses LICENSE ':(exclude)tools/ui' | gzip -9 >"$out"
    tag=$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' "$(dirname "$bundle")/llama.cpp.info.json")
    echo "$out: llama.cpp $tag (commit $(git -C "$tmp/src" rev-parse --short HEAD)) from" \
        "node-llama-cpp's bundle, $(wc -c <"$out") bytes"
    ;;
build)
    src=${2:?build SRC.tar.gz DIR cuda|cpu} dir=${3:?} kind=${4:?}
    mkdir -p "$dir"
    tar xzf "$src" -C "$dir"
    flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DGGML_NATIVE=ON)
    # nvcc from PATH, else the toolkit's usual place (CMake looks on PATH only); the tools link
    # the driver library through the toolkit's stub (soname libcuda.so.1, the driver's own
    # at run time), so a machine whose driver library is off the linker's path builds too
    if [ "$kind" = cuda ]; then
        nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
        stubs=$(dirname "$(dirname "$nvcc")")/lib64/stubs
        flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 "-DCMAKE_CUDA_COMPILER=$nvcc"
            "-DCMAKE_EXE_LINKER_FLAGS=-L$stubs -Wl,--no-as-needed -lcuda")
    fi
    cmake -S "$dir/llama.cpp" -B "$dir/build" "${flags[@]}" >"$dir/configure.log" 2>&1 ||
        { tail -20 "$dir/configure.log"; exit 1; }
    cmake --build "$dir/build" -j "$(nproc)" --target llama-bench llama-batched-bench \
        >"$dir/build.log" 2>&1 || { grep -m5 -A5 error "$dir/build.log"; exit 1; }
    echo "llama.cpp built in $dir/build/bin ($kind)"
    ;;
decode)
    dir=${2:?decode DIR MODEL.gguf BATCHES [PROMPT [GEN]]} model=${3:?} batches=${4:?}
    pp=${5:-512} tg=${6:-64}
    most=$(tr ',' '\n' <<<"$batches" | sort -n | tail -1)
    ngl=0
    grep -q 'GGML_CUDA:BOOL=ON' "$dir/build/CMakeCache.txt" && ngl=99
    "$dir/build/bin/llama-batched-bench" -m "$model" -c $((most * (pp + tg))) -b 2048 -ub 512 \
        -npp "$pp" -ntg "$tg" -npl "$batches" -ngl "$ngl" -fa on 2>"$dir/decode.err" |
        tee "$dir/decode.log" |
        awk -F'|' 'NF > 9 && $4 + 0 > 0 { gsub(/ /, ""); printf "peer decode batch %d: %s tok/s\n", $4, $9 }'
    ;;
*)
    sed -n '2,20p' "$0"
    exit 2
    ;;
esac
