#!/usr/bin/env bash
# Installs what building and testing mlxcel needs, and nothing when it is all there:
# Debian's -dev packages (as root through apt-get) and the JavaScript reference packages the
# conformance tests compare against (npm ci in tests/node).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev
          libmicrohttpd-dev libcurl4-openssl-dev libedit-dev nodejs npm)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# nodejs/npm may come from elsewhere than Debian: a working node and npm on PATH will do.
if command -v node >/dev/null && command -v npm >/dev/null; then
    missing=("${missing[@]/nodejs}")
    missing=("${missing[@]/npm}")
fi
read -r -a missing <<<"${missing[*]:-}"
# Chromium only runs the chat page's browser test, which skips without it: installed when
# this runs as root, and not asked for otherwise.
if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q 'install ok installed' &&
    [ "$(id -u)" -eq 0 ]; then
    missing+=(chromium)
fi
if ((${#missing[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "mlxcel: error: missing packages: ${missing[*]} (run this script as root, or apt-get install them)" >&2
        exit 1
    fi
    echo "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# npm ci leaves node_modules/.package-lock.json: its absence means a missing or broken install.
marker=tests/node/node_modules/.package-lock.json
if [ ! -f "$marker" ] || [ tests/node/package-lock.json -nt "$marker" ]; then
    echo "installing the JavaScript reference packages (tests/node)"
    (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
fi
