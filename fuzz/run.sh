#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/fuzz_*.c) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer in their own build directory, then runs each for FUZZ_SECONDS
# (default 60) over a working copy of its seed corpus (fuzz/corpus/<target>/).
#
#   fuzz/run.sh [TARGET...]        all targets when none is named (e.g. `fuzz/run.sh npy chat`)
#   FUZZ_SECONDS=0 fuzz/run.sh     build only
#
# Crashing inputs land in build-fuzz/artifacts/<target>/; replay one with
# `build-fuzz/fuzz_<target> FILE`, then save it under tests/fuzz_regress/<target>/ so that
# `make test` keeps replaying it. Exits 1 when any target found a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${FUZZ_SECONDS:-60}
build=${FUZZ_BUILD:-build-fuzz}
jobs=${FUZZ_BUILD_JOBS:-2}

flags="-g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"

# libFuzzer's runtime ships with clang (Debian: libclang-rt-dev); install it when missing.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' >"$probe/p.c"
if ! clang -fsanitize=fuzzer "$probe/p.c" -o "$probe/p" 2>/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "mlxcel: error: clang with libFuzzer is missing (apt-get install clang libclang-rt-dev)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev >/dev/null
fi

# The modules the targets reach (all but the CUDA backend, the hub and the CLI), each file with
# coverage instrumentation for the fuzzer; the SIMD kernels with the flags CMakeLists.txt gives
# them. The HTTP target runs the real server, which links the scheduler and the model.
modules=(base io tokenizer chat grammar model model/arch kv attn backend backend/cpu engine server)
cflags="$flags -std=c11 -D_GNU_SOURCE -Isrc -Iinclude $(pkg-config --cflags jansson libpcre2-8 libutf8proc libmicrohttpd)"
rm -rf "$build/obj"
mkdir -p "$build/obj"
for m in "${modules[@]}"; do ls src/"$m"/*.c; done |
    xargs -P "$jobs" -I{} sh -c 'o="$0/obj/$(echo "$1" | tr / _).o"
        case "$1" in
        *_avx2.c) simd="-mavx2 -mfma -mf16c" ;;
        *_avx512.c) simd="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mavx2" ;;
        *_avx512vnni.c) simd="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c -mavx2" ;;
        *) simd= ;;
        esac
        exec clang $2 $simd -fsanitize=fuzzer-no-link -c "$1" -o "$o"' \
        "$build" {} "$cflags"
# The chat page's C array, generated as CMake does (src/server/webui/webui.cmake).
cmake -DIN=src/server/webui/index.html -DOUT="$build/obj/server_webui_page.c" \
    -DNAME=server_webui_page -P src/server/webui/embed.cmake
# shellcheck disable=SC2086
clang $cflags -fsanitize=fuzzer-no-link -c "$build/obj/server_webui_page.c" \
    -o "$build/obj/server_webui_page.o"
rm -f "$build/libfuzzcore.a"
ar rcs "$build/libfuzzcore.a" "$build"/obj/*.o
libs="$(pkg-config --libs jansson libpcre2-8 libutf8proc libmicrohttpd) -lm -lpthread"

if (($# == 0)); then
    set -- $(ls fuzz/fuzz_*.c | sed 's|fuzz/fuzz_\(.*\)\.c|\1|')
fi
for t in "$@"; do
    [ -f "fuzz/fuzz_$t.c" ] || { echo "mlxcel: error: no fuzz target '$t'" >&2; exit 2; }
    # shellcheck disable=SC2086
    clang $cflags -fsanitize=fuzzer -DFUZZ_SOURCE_DIR="\"$root\"" "fuzz/fuzz_$t.c" \
        "$build/libfuzzcore.a" $libs -o "$build/fuzz_$t"
done
((seconds > 0)) || exit 0

# Executions per target in deterministic mode: about a minute each on a 2-core CI machine.
declare -A runs=([safetensors]=1200000 [config]=3000000 [tokenizer_json]=80000 [bpe]=80000
                 [chat]=150000 [chat_nesting]=12000 [npy]=3000000 [http_body]=300000
                 [http_request]=50000)
# The longest input libFuzzer makes (otherwise the longest seed's length): chat's seeds hold
# the 20,000-level templates (up to 280 KB) that the regression test replays whole; mutating
# inputs that long would slow the search, so the fuzzer takes their first 8 KiB, which is
# still a thousand levels, ten times the limit.
declare -A max_len=([chat]=8192)
failed=()
for t in "$@"; do
    mkdir -p "$build/corpus/$t" "$build/artifacts/$t" "$build/logs"
    opts=()
    [ -f "fuzz/$t.dict" ] && opts+=("-dict=fuzz/$t.dict")
    [ -n "${max_len[$t]:-}" ] && opts+=("-max_len=${max_len[$t]}")
    if [ "${FUZZ_DETERMINISTIC:-0}" = 1 ]; then
        echo "== fuzz $t (${runs[$t]:-100000} runs, seed 1)"
    else
        echo "== fuzz $t (${seconds}s)"
    fi
    # FUZZ_DETERMINISTIC=1 (CI): a fixed seed and a fixed number of runs instead of a time
    # limit, so that the same code gives the same verdict on every machine and every run.
    limit=(-max_total_time="$seconds")
    if [ "${FUZZ_DETERMINISTIC:-0}" = 1 ]; then limit=(-seed=1 -reload=0 -runs="${runs[$t]:-100000}"); fi
    if "$build/fuzz_$t" "${limit[@]}" -timeout=10 -rss_limit_mb=2560 \
        -print_final_stats=1 -artifact_prefix="$build/artifacts/$t/" "${opts[@]}" \
        "$build/corpus/$t" "fuzz/corpus/$t" >"$build/logs/$t.log" 2>&1; then
        grep -E '^#[0-9]+[[:space:]]+DONE' "$build/logs/$t.log" | tail -1 || true
    else
        failed+=("$t")
        tail -n 60 "$build/logs/$t.log"
    fi
done
if ((${#failed[@]})); then
    echo "mlxcel: error: fuzz targets failed: ${failed[*]} (inputs under $build/artifacts/)" >&2
    exit 1
fi
