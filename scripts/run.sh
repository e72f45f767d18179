#!/usr/bin/env bash
# One command from a fresh Debian 12 clone to a result:
#   bash scripts/run.sh train [zoff train options]   install deps, build, run the default training job
#   bash scripts/run.sh test                          install deps, build, run the whole test suite
# Environment: BUILD_DIR (default build), JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-train}"; shift || true
BUILD_DIR="${BUILD_DIR:-build}"
JOBS="${JOBS:-$(nproc)}"

bash scripts/deps.sh

configure_build() { # dir, extra cmake args...
  local dir="$1"; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DZOFF_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j "$JOBS"
}

case "$what" in
  train)
    configure_build "$BUILD_DIR"
    exec "$BUILD_DIR/zoff" train "$@"
    ;;
  test)
    bash scripts/test.sh "$BUILD_DIR"
    ;;
  *)
    echo "usage: bash scripts/run.sh train|test [options]" >&2
    exit 2
    ;;
esac
