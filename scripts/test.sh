#!/usr/bin/env bash
# The whole test suite: a -Werror build (with the CUDA backend compiled and
# linked when nvcc is present), its tests, then the same tests under
# AddressSanitizer + UndefinedBehaviorSanitizer and the threaded ones under
# ThreadSanitizer, then short runs of the libFuzzer harnesses (scripts/fuzz.sh).
# Prints one closing line "N passed, N failed, N skipped" (a skipped test -- exit 77, ctest's
# SKIP_RETURN_CODE, e.g. tests/cli_mpi.sh without MPI -- did not run and is not counted as passed).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
JOBS="${JOBS:-$(nproc)}"
passed=0; failed=0; skipped=0; failed_names=(); skipped_names=()

run_suite() { # label, build dir, ctest regex, cmake args...
  local label="$1" dir="$2" regex="$3"; shift 3
  echo "== $label: configure and build ($dir)"
  if ! cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DZOFF_WERROR=ON "$@" >"$dir.configure.log" 2>&1; then
    cat "$dir.configure.log"; failed=$((failed + 1)); failed_names+=("$label:configure"); return
  fi
  if ! cmake --build "$dir" -j "$JOBS" >"$dir.build.log" 2>&1; then
    tail -50 "$dir.build.log"; failed=$((failed + 1)); failed_names+=("$label:build"); return
  fi
  echo "== $label: ctest"
  local rc p f k
  (cd "$dir" && ctest --output-on-failure -j "$JOBS" -R "$regex" --output-junit "ctest-junit.xml") | tee "$dir.ctest.log"
  rc=${PIPESTATUS[0]}
  p=$(grep -cE "Test +#[0-9]+: .*Passed" "$dir.ctest.log" || true)
  f=$(grep -cE "Test +#[0-9]+: .*(\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Not Run|SEGFAULT|Child aborted)" "$dir.ctest.log" || true)
  k=$(grep -cE "Test +#[0-9]+: .*\*\*\*Skipped" "$dir.ctest.log" || true)
  if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then f=1; failed_names+=("$label:no-tests"); fi
  skipped=$((skipped + k))
  [ "$k" -gt 0 ] && skipped_names+=($(grep -oE "Test +#[0-9]+: [A-Za-z0-9_]+ .*\*\*\*Skipped" "$dir.ctest.log" | awk -v l="$label" '{print l ":" $3}'))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; failed_names+=("$label:ctest-exit-$rc"); fi
  passed=$((passed + p)); failed=$((failed + f))
  [ "$f" -gt 0 ] && failed_names+=("$label")
}

mkdir -p "$BUILD_DIR"
run_suite "release" "$BUILD_DIR" "."
if [ "${ZOFF_SKIP_SANITIZERS:-0}" != 1 ]; then
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  run_suite "asan+ubsan" "$BUILD_DIR-asan" "." -DZOFF_CUDA=OFF -DZOFF_SANITIZE=address -DCMAKE_BUILD_TYPE=RelWithDebInfo
  # ThreadSanitizer for the threaded parts: device streams, CPU Adam threads, engine, checkpoint writer,
  # background saves (with a Twin-Flow share: its copy beside the training).
  # libgomp is not built with TSan, so its barriers are invisible to it and every
  # OpenMP team reports false races; OMP_NUM_THREADS=1 keeps the kernels' OpenMP
  # regions on the calling thread while the pthread-based concurrency under test
  # (stream threads, events, copy streams, the engine's worker) stays real.
  # Tests that check OpenMP threading itself request their thread counts explicitly.
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
  OMP_NUM_THREADS=1 run_suite "tsan" "$BUILD_DIR-tsan" "test_device|test_cpu_adam|test_engine|test_train|test_aio|test_nvme|test_ckpt|test_safetensors|cli_ckpt_background|cli_ckpt_snapshot|cli_twinflow" -DZOFF_CUDA=OFF -DZOFF_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
# Fuzz smoke runs: every libFuzzer harness (fuzz/, clang, ASan + UBSan) for FUZZ_SECONDS (30)
# from its committed seeds; each harness counts as one test. The crash test (tests/cli_crash.sh)
# and the fuzz inputs' replay (test_fuzz_replay) run in the ctest suites above.
if [ "${ZOFF_SKIP_FUZZ:-0}" != 1 ]; then
  if command -v clang >/dev/null 2>&1; then
    bash scripts/fuzz.sh --time "${FUZZ_SECONDS:-30}" --build-dir "$BUILD_DIR-fuzz" --jobs "$JOBS" | tee "$BUILD_DIR-fuzz.log"
    p=$(grep -c "^PASS " "$BUILD_DIR-fuzz.log" || true); f=$(grep -c "^FAIL " "$BUILD_DIR-fuzz.log" || true)
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p)); failed=$((failed + f))
    [ "$f" -gt 0 ] && failed_names+=("fuzz")
  else
    echo "fuzz: clang not found (scripts/deps.sh installs clang libclang-rt-14-dev)"
    failed=$((failed + 1)); failed_names+=("fuzz:no-clang")
  fi
fi

echo
[ ${#failed_names[@]} -gt 0 ] && echo "failed suites: ${failed_names[*]}"
[ ${#skipped_names[@]} -gt 0 ] && echo "skipped: ${skipped_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
