#!/usr/bin/env bash
# Runs every C test binary (BUILD/tests/test_*) under valgrind's memcheck with the environment
# and working directory ctest gives them, and prints each one's error and leak summary.
#
#   tools/valgrind.sh [TEST_NAME...]      all when none is named (e.g. test_npy test_chat)
#   BUILD=build VALGRIND_TIMEOUT=1800     the build to use (not a sanitizer one), per-test limit
#
# Exits 1 when any test fails or memcheck reports an error or a definite or possible leak.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$(cd "${BUILD:-build}" && pwd)
limit=${VALGRIND_TIMEOUT:-1800}
logs=$build/valgrind
mkdir -p "$logs"
command -v valgrind >/dev/null || { echo "mlxcel: error: valgrind is not installed" >&2; exit 1; }

if (($# == 0)); then
    set -- $(cd "$build/tests" && ls test_* | sort)
fi
failed=()
for name in "$@"; do
    bin=$build/tests/$name
    [ -x "$bin" ] || { echo "mlxcel: error: no test binary $bin" >&2; exit 2; }
    log=$logs/$name.log
    start=$SECONDS
    rc=0
    (cd "$build" && MLXCEL_SOURCE_DIR=$root MLXCEL_BIN_DIR=$build/bin \
        timeout "$limit" valgrind --error-exitcode=1 --leak-check=full \
        --suppressions="$root/tools/valgrind.supp" \
        --log-file="$log" "$bin" >"$logs/$name.out" 2>&1) || rc=$?
    summary=$(grep -E 'ERROR SUMMARY' "$log" | tail -1 | sed 's/^==[0-9]*== //' || true)
    lost=$(grep -E 'definitely lost:' "$log" | tail -1 | sed 's/^==[0-9]*== *//' || true)
    echo "$name: rc=$rc $((SECONDS - start))s ${summary:-no summary} ${lost:+($lost)}"
    ((rc == 0)) || failed+=("$name")
done
if ((${#failed[@]})); then
    echo "mlxcel: error: under valgrind: ${failed[*]} (logs in $logs)" >&2
    exit 1
fi
