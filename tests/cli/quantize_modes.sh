#!/usr/bin/env bash
# `mlxcel quantize --mode`: mxfp4 writes the checkpoint and config.json mlx-lm's convert
# --q-mode mxfp4 writes (model_quantize's bytes are checked in tests/model/test_quantize.c);
# the modes MLX has and mlxcel does not (nvfp4, mxfp8), unknown modes and the bits or group
# sizes MXFP4 cannot take are refused with exit status 2 and a message naming them.
set -uo pipefail
src=${MLXCEL_SOURCE_DIR:?} bin=${MLXCEL_BIN_DIR:?}
passed=0 failed=0
check() { # check DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $what" >&2; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
in=$src/tests/fixtures/gpt_oss_bf16

# refused: ARGS... -> exit status 2 and stderr holding every word given after --
refused() {
    local args=() words=() seen=0
    for a in "$@"; do
        if [ "$a" = -- ]; then
            seen=1
        elif [ $seen -eq 0 ]; then
            args+=("$a")
        else
            words+=("$a")
        fi
    done
    "$bin/mlxcel" quantize -m "$in" -o "$tmp/refused" "${args[@]}" 2>"$tmp/err"
    local rc=$?
    check "${args[*]}: exit status 2 (got $rc)" test "$rc" -eq 2
    for w in "${words[@]}"; do
        check "${args[*]}: the message names $w" grep -q -- "$w" "$tmp/err"
    done
}
refused --mode nvfp4 -- nvfp4 "not implemented"
refused --mode mxfp8 -- mxfp8 "not implemented"
refused --mode int4 -- int4 affine mxfp4
refused --mode mxfp4 --bits 8 -- "--bits 8" mxfp4
refused --mode mxfp4 --group-size 64 -- "--group-size 64" mxfp4
check "nothing written for a refused mode" test ! -e "$tmp/refused/model.safetensors"

"$bin/mlxcel" quantize -m "$in" -o "$tmp/mx" --mode mxfp4 --bits 4 --group-size 32
check "--mode mxfp4 exits 0" test $? -eq 0
cfg=$tmp/mx/config.json
# "quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4", "<router>": {...}, ...}
q=$(tr -d ' \n' <"$cfg")
check "config.json: mxfp4 by default" \
    grep -q '"quantization":{"group_size":32,"bits":4,"mode":"mxfp4"' <<<"$q"
check "config.json: the routers at 8 bits, no mode" \
    grep -q '"model.layers.1.mlp.router":{"group_size":64,"bits":8}' <<<"$q"
check "config.json: the Hugging Face copy" grep -q '"quantization_config":{"group_size":32' <<<"$q"
out=$("$bin/mlxcel" generate -m "$tmp/mx" --tokens 1,20,30 -n 4 --temp 0 --json)
check "the mxfp4 checkpoint generates" grep -q '"tokens":\[' <<<"$out"

"$bin/mlxcel" quantize -m "$in" -o "$tmp/q4"
check "the default mode is affine 4-bit g64" grep -q '"mode": "affine"' "$tmp/q4/config.json"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
