#!/bin/sh
# libmlxcel exports the public API and nothing else: every defined dynamic symbol is mlxcel_*
# and the header's entry points are all there.
lib="$1"
header="$2"
syms=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[A-Z]$/ { print $3 }') || exit 1
stray=$(printf '%s\n' "$syms" | grep -v '^mlxcel_')
if [ -n "$stray" ]; then
    echo "$lib exports symbols outside the API:" $stray
    exit 1
fi
for f in $(grep -o '^[a-z_ *]*\bmlxcel_[a-z_]*(' "$header" | grep -o 'mlxcel_[a-z_]*($' | tr -d '('); do
    if ! printf '%s\n' "$syms" | grep -qx "$f"; then
        echo "$lib: $f is declared in $header but not exported"
        exit 1
    fi
done
echo "$(printf '%s\n' "$syms" | wc -l) exported, all mlxcel_*"
