#!/usr/bin/env bash
# Unpack the .debs fetched by scripts/pack_deps.sh into a private prefix and print
# the environment that builds and runs zoff against it (no root, no apt, no
# maintainer scripts):
#
#   eval "$(bash scripts/unpack_deps.sh)"        # .deps/debs/*.deb -> .deps/prefix/
#   cmake -S . -B build ... && cmake --build build
#
# stdout is only `export VAR=...` lines (PATH, PKG_CONFIG, PKG_CONFIG_PATH,
# LD_LIBRARY_PATH, CMAKE_PREFIX_PATH); messages go to stderr. The prefix is
# rebuilt from scratch on every run.
#
# What dpkg's maintainer scripts would have done, done here by hand:
#   - OpenBLAS's update-alternatives links (libopenblas.so, libblas.so.3,
#     liblapack.so.3, openblas.pc, blas.pc, lapack.pc in the multiarch folders);
#   - every .pc file's absolute /usr paths (prefix=, libdir=, includedir=, ...
#     and -L/usr..., -I/usr... in Libs/Cflags, as cmocka.pc has them) are
#     rewritten to the unpacked prefix, and so are the CMake package files.
#
# Options: --print-only (do not unpack again; print the environment of the existing prefix).
# Environment: ZOFF_DEPS_DIR (default: <repo>/.deps).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPS=${ZOFF_DEPS_DIR:-$ROOT/.deps}
DEPS=$(mkdir -p "$DEPS" && cd "$DEPS" && pwd)
DEBS=$DEPS/debs
P=$DEPS/prefix
ARCH=x86_64-linux-gnu
LIB=$P/usr/lib/$ARCH

print_only=0
[ "${1:-}" = "--print-only" ] && print_only=1

if [ "$print_only" = 0 ]; then
  shopt -s nullglob
  debs=("$DEBS"/*.deb)
  if [ ${#debs[@]} -eq 0 ]; then
    echo "unpack_deps.sh: no .deb files in $DEBS; run scripts/pack_deps.sh on a Debian 12 machine first" >&2
    exit 1
  fi
  rm -rf "$P"
  mkdir -p "$P"
  for f in "${debs[@]}"; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$P"
    else # no dpkg: a .deb is an ar archive holding data.tar.{xz,zst,gz}
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$f")
      data=$(ls "$tmp"/data.tar.* | head -1)
      tar -xf "$data" -C "$P"
      rm -rf "$tmp"
    fi
  done

  # OpenBLAS alternatives (libopenblas-pthread-dev / libopenblas0-pthread postinst)
  OB=openblas-pthread
  if [ -d "$LIB/$OB" ]; then
    mkdir -p "$LIB/pkgconfig" "$LIB/cmake/openblas"
    for so in libopenblas.so libopenblas.so.0 libblas.so libblas.so.3 liblapack.so liblapack.so.3 libopenblas.a; do
      [ -e "$LIB/$OB/$so" ] && ln -sfn "$OB/$so" "$LIB/$so"
    done
    [ -f "$LIB/$OB/pkgconfig/openblas.pc" ] && cp -f "$LIB/$OB/pkgconfig/openblas.pc" "$LIB/pkgconfig/openblas.pc"
    [ -f "$LIB/$OB/pkgconfig/blas-openblas.pc" ] && cp -f "$LIB/$OB/pkgconfig/blas-openblas.pc" "$LIB/pkgconfig/blas.pc"
    [ -f "$LIB/$OB/pkgconfig/lapack-openblas.pc" ] && cp -f "$LIB/$OB/pkgconfig/lapack-openblas.pc" "$LIB/pkgconfig/lapack.pc"
    for h in cblas.h f77blas.h openblas_config.h; do
      [ -f "$P/usr/include/$ARCH/$OB/$h" ] && ln -sfn "$OB/$h" "$P/usr/include/$ARCH/$h"
    done
    cp -f "$LIB/$OB"/cmake/openblas/*.cmake "$LIB/cmake/openblas/" 2>/dev/null || true
  fi

  # Relocate: absolute /usr paths in pkg-config and CMake package files -> the prefix.
  while IFS= read -r -d '' pc; do
    sed -i -E -e "s#^([A-Za-z_][A-Za-z0-9_]*)=/usr(/|\$)#\1=$P/usr\2#" \
              -e "s#(-[LI])/usr([/ ]|\$)#\1$P/usr\2#g" "$pc"
  done < <(find "$P" -name '*.pc' -type f -print0)
  while IFS= read -r -d '' cm; do
    sed -i -E "s#([\" ;(]|^)/usr([/\" ;)]|\$)#\1$P/usr\2#g" "$cm"
  done < <(find "$P/usr/lib" -path '*/cmake/*' -name '*.cmake' -type f -print0)

  n=${#debs[@]}
  echo "unpack_deps.sh: $n packages unpacked into $P" >&2
fi

[ -d "$LIB" ] || { echo "unpack_deps.sh: $P is not unpacked; run without --print-only" >&2; exit 1; }

pcpath="$LIB/pkgconfig:$P/usr/share/pkgconfig"
ldpath="$LIB:$LIB/openblas-pthread"
echo "export PATH='$P/usr/bin':\"\$PATH\""
if [ -x "$P/usr/bin/pkgconf" ]; then
  echo "export PKG_CONFIG='$P/usr/bin/pkgconf'"
fi
echo "export PKG_CONFIG_PATH='$pcpath'\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
echo "export LD_LIBRARY_PATH='$ldpath'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
echo "export CMAKE_PREFIX_PATH='$P/usr'\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
