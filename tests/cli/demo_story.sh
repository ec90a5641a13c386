#!/usr/bin/env bash
# `make demo`'s command on the CPU: the demo model continues the story as English of about the
# asked length (60 tokens: 40 words or more), the prompt first, no chat-template markers, and
# the same text on a second run (the seed).
set -uo pipefail
src=${MLXCEL_SOURCE_DIR:?} bin=${MLXCEL_BIN_DIR:?}
cmd=$(sed -n 's|^\t$(BUILD)/bin/mlxcel run \(.*\)$|\1|p' "$src/Makefile")
passed=0 failed=0
check() { # check DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $what" >&2; fi
}
check "the Makefile's demo command is found" test -n "$cmd"
story=$(eval "MLXCEL_DEMO_MODEL=$src/models/demo $bin/mlxcel run $cmd --device cpu -t 2" 2>/dev/null)
again=$(eval "MLXCEL_DEMO_MODEL=$src/models/demo $bin/mlxcel run $cmd --device cpu -t 2" 2>/dev/null)
echo "$story"
check "it begins with the prompt" test "${story#Once upon a time}" != "$story"
check "40 words or more" test "$(wc -w <<<"$story")" -ge 40
no_markers() { ! grep -q -e INST -e '<s>' -e '</s>' <<<"$story"; }
check "no template markers" no_markers
check "the same story twice" test "$story" = "$again"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
