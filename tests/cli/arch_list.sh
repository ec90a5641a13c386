#!/usr/bin/env bash
# `mlxcel arch` and the README name the same families: every model_type the registry lists has
# its summary (what is supported, the limits) and is named in the README's supported-families
# list.
set -uo pipefail
src=${MLXCEL_SOURCE_DIR:?} bin=${MLXCEL_BIN_DIR:?}
passed=0 failed=0
check() { # check DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $what" >&2; fi
}
out=$("$bin/mlxcel" arch)
check "mlxcel arch exits 0" test $? -eq 0
# The family rows: between "families" and "weights:", "  MODEL_TYPE  summary".
families=$(sed -n '/^families/,/^weights:/{s/^  \([a-z0-9_]*\) .*/\1/p}' <<<"$out")
check "mlxcel arch lists families" test -n "$families"
# The README's list: the bullets after "Supported families", up to the blank line after them.
list=$(awk '/^Supported families/ { on = 1 } on && /^- / { in_list = 1 }
            in_list && /^$/ { exit } in_list' "$src/README.md")
check "the README has the list" test -n "$list"
named=$(grep -o '`[a-z0-9_]*`' <<<"$list" | tr -d '`' | sort -u)
for f in $families; do
    row=$(grep "^  $f " <<<"$out")
    check "$f has a summary" test "${#row}" -gt $((${#f} + 20))
    check "the README lists $f" grep -qx "$f" <<<"$named"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
