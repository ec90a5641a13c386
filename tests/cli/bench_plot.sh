#!/usr/bin/env bash
# mlxcel bench --plot: an SVG of decode tok/s against batch with the bandwidth ceiling the rows
# name, from a run and from the --json rows of one (--plot-from); the refusals name what is wrong.
set -uo pipefail
src=${MLXCEL_SOURCE_DIR:?} bin=${MLXCEL_BIN_DIR:?}
mlxcel=$bin/mlxcel
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
passed=0 failed=0
check() { # check DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $what" >&2; fi
}
count() { grep -o "$1" "$2" | wc -l; }

"$mlxcel" bench -m "$src/models/demo" -p 0 -n 4 -b 1,2,4 -r 1 -t 2 --device cpu --json \
    --plot "$t/run.svg" >"$t/rows.jsonl" 2>"$t/err"
check "bench --plot runs ($(cat "$t/err"))" test $? -eq 0
check "the SVG is one <svg> element" bash -c "head -c 4 '$t/run.svg' | grep -q '<svg' && tail -n 1 '$t/run.svg' | grep -q '^</svg>$'"
check "a measured line with a marker per batch" test "$(count '<circle' "$t/run.svg")" -eq 3
check "and a dashed ceiling line" test "$(count 'stroke-dasharray="6 4" points' "$t/run.svg")" -eq 1
check "the title names the model and the test" grep -q "models/demo: decode, tg4" "$t/run.svg"
check "the CPU's ceiling is its read bandwidth" grep -q "read-bandwidth ceiling" "$t/run.svg"

"$mlxcel" bench --plot-from "$t/rows.jsonl" --plot "$t/again.svg" 2>"$t/err"
check "--plot-from draws the same rows ($(cat "$t/err"))" test "$(count '<circle' "$t/again.svg")" -eq 3
# the ceiling is measured / share: 100 / 0.5 = 200 tok/s at batch 1, 300 / 0.25 at batch 4
printf '%s\n' '{"model":"m & <x>","test":"tg8","batch":4,"tok_per_s":300,"ceiling":"copy","ceiling_share":0.25}' \
    '{"model":"m & <x>","test":"pp8","batch":1,"tok_per_s":900}' \
    '{"model":"m & <x>","test":"tg8","batch":1,"tok_per_s":100,"ceiling":"copy","ceiling_share":0.5}' >"$t/made.jsonl"
"$mlxcel" bench --plot-from "$t/made.jsonl" --plot "$t/made.svg" 2>"$t/err"
check "rows in any order, prefill rows passed over ($(cat "$t/err"))" test "$(count '<circle' "$t/made.svg")" -eq 2
check "the model's name is escaped" grep -q "m &amp; &lt;x&gt;: decode, tg8" "$t/made.svg"
check "the tooltips give the points" bash -c "grep -q '<title>1: 100.0</title>' '$t/made.svg' && grep -q '<title>4: 300.0</title>' '$t/made.svg'"
check "the ceiling named as the rows name it" grep -q "copy-bandwidth ceiling" "$t/made.svg"

refused() { # refused STATUS TEXT ARGS...: exits STATUS with TEXT in its error, writes nothing
    local want=$1 text=$2
    shift 2
    rm -f "$t/no.svg"
    "$mlxcel" bench "$@" 2>"$t/err" >/dev/null
    local rc=$?
    [ "$rc" -eq "$want" ] && grep -q -- "$text" "$t/err" && [ ! -e "$t/no.svg" ] ||
        { echo "bench $*: status $rc, $(cat "$t/err")" >&2; return 1; }
}
check "--plot with -n 0" refused 2 "\-n 0 runs none" -m "$src/models/demo" -n 0 --plot "$t/no.svg"
check "--plot-from without --plot" refused 2 "needs --plot" --plot-from "$t/made.jsonl"
check "--plot-from with -m" refused 2 "leave out -m" --plot-from "$t/made.jsonl" --plot "$t/no.svg" -m "$src/models/demo"
echo 'not json' >"$t/bad.jsonl"
check "a line that is not JSON, by file and line" refused 1 "bad.jsonl:1: not JSON" --plot-from "$t/bad.jsonl" --plot "$t/no.svg"
echo '{"test":"tg8","batch":"four","tok_per_s":1,"ceiling":"read","ceiling_share":0.1}' >"$t/field.jsonl"
check "a bad field, by name" refused 1 "field.jsonl:1: 'batch'" --plot-from "$t/field.jsonl" --plot "$t/no.svg"
echo '{"test":"tg8","batch":1,"tok_per_s":1,"ceiling_share":0.1}' >"$t/unnamed.jsonl"
check "a share without its ceiling" refused 1 "unnamed.jsonl:1: 'ceiling'" --plot-from "$t/unnamed.jsonl" --plot "$t/no.svg"
printf '%s\n' '{"test":"tg8","batch":1,"tok_per_s":1,"ceiling":"read","ceiling_share":0.1}' \
    '{"test":"tg16","batch":2,"tok_per_s":1,"ceiling":"read","ceiling_share":0.1}' >"$t/mixed.jsonl"
check "rows of two tests" refused 1 "one run's rows" --plot-from "$t/mixed.jsonl" --plot "$t/no.svg"
printf '%s\n' '{"test":"tg8","batch":1,"tok_per_s":1,"ceiling":"read","ceiling_share":0.1}' \
    '{"test":"tg8","batch":2,"tok_per_s":1,"ceiling":"copy","ceiling_share":0.1}' >"$t/ceilings.jsonl"
check "rows of two ceilings" refused 1 "against the copy bandwidth among rows against the read" --plot-from "$t/ceilings.jsonl" --plot "$t/no.svg"
check "rows with no decode test" refused 1 "no decode rows" --plot-from /dev/null --plot "$t/no.svg"
check "a missing file" refused 1 "nothere.jsonl: No such file" --plot-from "$t/nothere.jsonl" --plot "$t/no.svg"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
