#!/usr/bin/env bash
# mlxcel perplexity on the shipped demo model must give transformers' figure (computed by
# tools/reference/demo_perplexity.py on the same dequantized weights) within 1%.
set -euo pipefail
src=${MLXCEL_SOURCE_DIR:?} bin=${MLXCEL_BIN_DIR:?}
fx=$src/tests/fixtures/demo_perplexity
chunks=$(sed -n 's/.*"chunks": \([0-9]*\).*/\1/p' "$fx/perplexity.json")
want=$(sed -n 's/.*"perplexity_chunks": \([0-9.]*\).*/\1/p' "$fx/perplexity.json")
got=$("$bin/mlxcel" perplexity -m "$src/models/demo" -f "$fx/heldout.txt" -c 512 \
    --chunks "$chunks" 2>/dev/null | sed -n 's/^perplexity: \([0-9.]*\) .*/\1/p')
awk -v got="$got" -v want="$want" 'BEGIN {
    rel = (got - want) / want; if (rel < 0) rel = -rel
    printf "perplexity: mlxcel %s, transformers %s, relative difference %.2e\n", got, want, rel
    if (got == "" || rel >= 0.01) { print "0 passed, 1 failed"; exit 1 }
    print "1 passed, 0 failed"
}'
