#!/usr/bin/env bash
# Download the Debian 12 packages (.deb) of zoff's C dependencies, for a machine
# that has a compiler, CMake and CUDA but no package registry (the GPU machines):
#
#   bash scripts/pack_deps.sh          # -> .deps/debs/*.deb + .deps/debs/MANIFEST
#
# Then, on the target machine (see scripts/unpack_deps.sh):
#   eval "$(bash scripts/unpack_deps.sh)"
#
# What is fetched (apt-get download, after apt-get update; nothing is installed):
#   OpenBLAS      libopenblas0 libopenblas0-pthread libopenblas-dev libopenblas-pthread-dev
#                 + libgfortran5 libquadmath0 (OpenBLAS's Fortran runtime)
#   jansson       libjansson4 libjansson-dev
#   cmocka        libcmocka0 libcmocka-dev        (tests)
#   liburing      liburing2 liburing-dev
#   pkg-config    pkgconf pkgconf-bin libpkgconf3 pkg-config (CMake's FindPkgConfig needs the tool)
# Dependencies assumed present on any machine that can compile (not fetched):
#   libc6 libc6-dev linux-libc-dev libgcc-s1 gcc-12-base. The script checks that
# every dependency of every fetched package is either fetched or in that list.
#
# Environment: ZOFF_DEPS_DIR (default: <repo>/.deps). .deps/ is git-ignored.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPS=${ZOFF_DEPS_DIR:-$ROOT/.deps}
DEBS=$DEPS/debs

PKGS=(libopenblas0 libopenblas0-pthread libopenblas-dev libopenblas-pthread-dev libgfortran5 libquadmath0
      libjansson4 libjansson-dev
      libcmocka0 libcmocka-dev
      liburing2 liburing-dev
      pkgconf pkgconf-bin libpkgconf3 pkg-config)
ASSUMED=(libc6 libc6-dev linux-libc-dev libgcc-s1 gcc-12-base libc-dev)

command -v apt-get >/dev/null || { echo "pack_deps.sh: apt-get not found; run this on Debian 12 (bookworm)" >&2; exit 1; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "pack_deps.sh: apt-get update needs root (or sudo)" >&2; exit 1; }
  SUDO="sudo"
fi

echo "pack_deps.sh: apt-get update" >&2
$SUDO apt-get update -qq

rm -rf "$DEBS.tmp"
mkdir -p "$DEBS.tmp"
(
  cd "$DEBS.tmp"
  # -o APT::Sandbox::User=root: the _apt sandbox user cannot write into arbitrary folders
  apt-get download -q -o APT::Sandbox::User=root "${PKGS[@]}" >&2
)

# Every dependency is fetched or assumed present.
declare -A have=()
for p in "${PKGS[@]}" "${ASSUMED[@]}"; do have[$p]=1; done
missing=()
for f in "$DEBS.tmp"/*.deb; do
  deps=$(dpkg-deb -f "$f" Depends || true)
  [ -z "$deps" ] && continue
  # "a (>= 1), b | c, d" -> one alternative group per line; a group is satisfied by any member
  while IFS= read -r group; do
    ok=0
    for alt in ${group//|/ }; do
      name=${alt%%:*}
      [ -n "${have[$name]:-}" ] && ok=1
    done
    [ "$ok" = 1 ] || missing+=("$(basename "$f"): $group")
  done < <(echo "$deps" | sed -E 's/\([^)]*\)//g; s/ //g' | tr ',' '\n' | grep -v '^$')
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "pack_deps.sh: dependencies neither fetched nor assumed present:" >&2
  printf '  %s\n' "${missing[@]}" >&2
  rm -rf "$DEBS.tmp"
  exit 1
fi

rm -rf "$DEBS"
mv "$DEBS.tmp" "$DEBS"
(
  cd "$DEBS"
  {
    echo "# zoff build/run dependencies, Debian $(cat /etc/debian_version 2>/dev/null || echo '?'), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    for f in *.deb; do
      echo "$(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version) $(sha256sum "$f" | cut -d' ' -f1) $f"
    done
  } > MANIFEST
)
n=$(ls "$DEBS"/*.deb | wc -l)
echo "pack_deps.sh: $n packages ($(du -sh "$DEBS" | cut -f1)) in $DEBS; unpack with: eval \"\$(bash scripts/unpack_deps.sh)\"" >&2
