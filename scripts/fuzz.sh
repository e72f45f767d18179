#!/usr/bin/env bash
# Build the libFuzzer harnesses (fuzz/, clang + ASan + UBSan) and run each one.
#
#   bash scripts/fuzz.sh                  short run: 30 s per harness (what CI runs)
#   bash scripts/fuzz.sh --long           long run: 20 min per harness (FUZZ_LONG_SECONDS)
#   bash scripts/fuzz.sh --time 120 --only ckpt,shard
#   bash scripts/fuzz.sh --build-dir build-fuzz --jobs 2
#
# Each harness starts from its committed seeds (fuzz/corpus/NAME, never modified) plus the
# corpus it grew in earlier runs of this build dir (BUILD/fuzz-corpus/NAME). A finding (crash,
# sanitizer report, failed check, timeout, out-of-memory) is saved as BUILD/fuzz-artifacts/
# NAME-crash-* and makes the script fail; reproduce it with
#   BUILD/fuzz/fuzz_NAME BUILD/fuzz-artifacts/NAME-crash-...
# One line per harness: "PASS fuzz_NAME ..." or "FAIL fuzz_NAME ...", then a summary line;
# the summary of a --long run is appended to BUILD/fuzz-long-results.txt for
# docs/reliability.md.
set -uo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=30
LONG=0
ONLY=""
BUILD="build-fuzz"
JOBS="${JOBS:-2}"
while [ $# -gt 0 ]; do
  case "$1" in
    --long) LONG=1; SECONDS_EACH="${FUZZ_LONG_SECONDS:-1200}" ;;
    --time) SECONDS_EACH="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    --build-dir) BUILD="$2"; shift ;;
    --jobs) JOBS="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz.sh: clang not found: apt-get install clang libclang-rt-14-dev (scripts/deps.sh)" >&2
  exit 2
fi

echo "== fuzz: configure and build ($BUILD)"
if ! CC=clang cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZOFF_CUDA=OFF -DZOFF_MPI=OFF \
     -DZOFF_FUZZ=ON -DZOFF_TESTS=OFF >"$BUILD.configure.log" 2>&1; then
  cat "$BUILD.configure.log"; echo "FAIL fuzz:configure"; exit 1
fi
if ! cmake --build "$BUILD" --target fuzz_all -j "$JOBS" >"$BUILD.build.log" 2>&1; then
  tail -40 "$BUILD.build.log"; echo "FAIL fuzz:build"; exit 1
fi

# Scratch files of the harnesses go to memory when possible (each input writes files).
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-}:print_stacktrace=1:halt_on_error=1"
# These variables would change what the parsers do; the harnesses test the defaults.
unset ZOFF_CKPT_FAULT ZOFF_IO_FAULT ZOFF_DATA_DIR

mkdir -p "$BUILD/fuzz-corpus" "$BUILD/fuzz-artifacts"
pass=0; fail=0; summary=()
for exe in "$BUILD"/fuzz/fuzz_*; do
  [ -x "$exe" ] || continue
  name="${exe##*/fuzz_}"
  if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]]; then continue; fi
  seeds="fuzz/corpus/$name"; work="$BUILD/fuzz-corpus/$name"; log="$BUILD/fuzz-$name.log"
  mkdir -p "$work"
  [ -d "$seeds" ] || seeds=""
  echo "== fuzz_$name: ${SECONDS_EACH}s"
  start=$(date +%s)
  # -timeout: one input may take 10 s at most (a hang is a finding); -rss_limit_mb / -malloc_limit_mb:
  # an input that makes the parser allocate more than 2 GiB is a finding (unbounded allocation).
  "$exe" "$work" $seeds -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$BUILD/fuzz-artifacts/$name-" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  corp=$(find "$work" -type f | wc -l)
  line="fuzz_$name: ${runs:-?} inputs in ${secs}s, coverage ${cov:-?} edges, corpus $corp"
  if [ "$rc" -eq 0 ] && ! grep -qE "ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)|runtime error:|fuzz check failed" "$log"; then
    echo "PASS $line"; pass=$((pass + 1))
  else
    echo "FAIL $line (exit $rc; log $log)"
    grep -E "ERROR:|runtime error:|fuzz check failed|SUMMARY:|Test unit written" "$log" | head -8
    fail=$((fail + 1))
  fi
  summary+=("$line, $([ "$rc" -eq 0 ] && echo 'no findings' || echo "FINDING (exit $rc)")")
done

if [ $((pass + fail)) -eq 0 ]; then echo "FAIL fuzz: no harness ran"; exit 1; fi
echo "fuzz: $pass passed, $fail failed"
if [ "$LONG" -eq 1 ]; then
  {
    echo "## $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), ${SECONDS_EACH}s per harness, $(nproc) cores, $(clang --version | head -1)"
    for s in "${summary[@]}"; do echo "- $s"; done
  } >>"$BUILD/fuzz-long-results.txt"
  echo "fuzz: results appended to $BUILD/fuzz-long-results.txt"
fi
[ "$fail" -eq 0 ]
