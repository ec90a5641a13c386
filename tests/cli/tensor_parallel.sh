#!/usr/bin/env bash
# -tp N / --tensor-parallel N on every command that runs a model: 1 is the one-device run
# unchanged, 0 is a usage error, more than one is refused with the reason on a machine that
# cannot run it (here the CPU backend); llama.cpp's --split-mode and --tensor-split are refused
# with a pointer to -tp.
set -uo pipefail
src=${MLXCEL_SOURCE_DIR:?} bin=${MLXCEL_BIN_DIR:?}
model=$src/tests/fixtures/llama_bf16
passed=0 failed=0
check() { # check DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $what" >&2; fi
}
# expect WANT_RC PATTERN COMMAND...: the command exits WANT_RC and its stderr matches PATTERN
expect() {
    local want=$1 pattern=$2 err rc
    shift 2
    err=$("$@" 2>&1 >/dev/null)
    rc=$?
    check "$* exits $want (got $rc: $err)" test "$rc" -eq "$want"
    check "$* says '$pattern' (got: $err)" grep -q -- "$pattern" <<<"$err"
}
gen=("$bin/mlxcel" generate -m "$model" --tokens 1,2,3 -n 4 --temp 0 --device cpu --json)
tokens() { "$@" | sed -n 's/.*"tokens":\(\[[0-9,]*\]\).*/\1/p'; }
plain=$(tokens "${gen[@]}")
check "generate gives tokens" test -n "$plain"
check "-tp 1 generates what no -tp does" test "$(tokens "${gen[@]}" -tp 1)" = "$plain"
check "--tensor-parallel=1 too" test "$(tokens "${gen[@]}" --tensor-parallel=1)" = "$plain"

expect 2 "-tp wants an integer in \[1, 64\], got '0'" "${gen[@]}" -tp 0
expect 2 "--tensor-parallel wants an integer" "${gen[@]}" --tensor-parallel two
cpu="the cpu backend runs one rank"
expect 1 "--tensor-parallel 2: $cpu" "${gen[@]}" -tp 2
expect 1 "--tensor-parallel 4: $cpu" "$bin/mlxcel" run -p hi -n 2 --device cpu --tensor-parallel 4
expect 1 "--tensor-parallel 2: $cpu" "$bin/mlxcel" bench -m "$model" -p 8 -n 2 -b 1 --device cpu -tp 2
expect 1 "--tensor-parallel 2: $cpu" "$bin/mlxcel-server" -m "$model" --device cpu -tp 2 --port 0

llama="is llama.cpp's; mlxcel spreads a model over GPUs with -tp N"
expect 2 "generate: --split-mode $llama" "${gen[@]}" --split-mode row
expect 2 "generate: --split-mode $llama" "${gen[@]}" --split-mode=layer
expect 2 "generate: --tensor-split $llama" "${gen[@]}" -ts 1,1
expect 2 "run: --tensor-split $llama" "$bin/mlxcel" run -p hi --tensor-split=3,1
expect 2 "bench: --split-mode $llama" "$bin/mlxcel" bench -m "$model" -sm none
expect 2 "mlxcel-server: --tensor-split $llama" "$bin/mlxcel-server" -m "$model" -ts 1,1
expect 2 "mlxcel-server: --split-mode $llama" "$bin/mlxcel-server" -m "$model" --split-mode row
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
