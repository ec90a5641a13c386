#!/usr/bin/env bash
# For build machines without package access (e.g. a GPU host with only the CUDA toolkit):
# run this where Debian's archive is reachable; it downloads the -dev and runtime packages
# mlxcel links against and unpacks them into .deps/root (git-ignored). Copy .deps along and
# configure with  cmake -DMLXCEL_DEPS_PREFIX=$PWD/.deps/root  (`make CMAKE_ARGS=...`). CMake finds
# the libraries through pkg-config, so pkgconf comes too: put .deps/root/usr/bin on PATH and
# .deps/root/usr/lib/x86_64-linux-gnu on LD_LIBRARY_PATH there.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0
      libpcre2-posix3 libutf8proc-dev libutf8proc2 pkgconf pkgconf-bin libpkgconf3
      libmicrohttpd-dev libmicrohttpd12 libgnutls30 libgmp10 libhogweed6 libidn2-0 libnettle8
      libp11-kit0 libtasn1-6 libunistring2 libffi8)
rm -rf .deps && mkdir -p .deps/debs .deps/root
(cd .deps/debs && apt-get download "${pkgs[@]}" 2>/dev/null)
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
rm -rf .deps/debs
# Only headers, shared libraries and .pc files travel: the rest is documentation and archives.
find .deps/root -name '*.a' -delete
rm -rf .deps/root/usr/share/doc .deps/root/usr/share/man .deps/root/usr/share/locale \
    .deps/root/usr/share/info .deps/root/usr/share/lintian
# libmicrohttpd.pc names gnutls as a private requirement; gnutls' own -dev package would drag
# in five more, so describe the unpacked runtime library in one file instead.
cat > .deps/root/usr/lib/x86_64-linux-gnu/pkgconfig/gnutls.pc <<'PC'
prefix=/usr
libdir=${prefix}/lib/x86_64-linux-gnu
Name: gnutls
Description: the GnuTLS runtime unpacked beside libmicrohttpd
Version: 3.7.9
Libs: -L${libdir} -l:libgnutls.so.30
Cflags:
PC
echo "unpacked into .deps/root: $(du -sh .deps/root | cut -f1)"
