#!/usr/bin/env bash
# The short crash test of CI (< 2 minutes): scripts/crash_test.sh kills `zoff train` with
# SIGKILL (and some SIGTERM) at random points, many inside checkpoint saves, resumes each time,
# and checks that every checkpoint directory is complete and valid after every kill, that the
# final checkpoint is bit-identical to an uninterrupted run and that metrics.jsonl is whole and
# agrees with it. Two configurations: stage 0 fp32, and stage 2 CPU offload with fp16 dynamic
# loss scaling and --keep-last (pruning under kill). The kill schedule is random; a failure
# prints its seed (replay: bash scripts/crash_test.sh --seed N --keep ...).
# Usage: cli_crash.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
pass=0; fail=0
# a sanitizer build runs 2-5x slower: fewer kills keep the test inside its budget
scale=1
if grep -qa "__asan_init\|__tsan_init" "$ZOFF" 2>/dev/null; then scale=2; fi
run() { # name, crash_test args...
  local name="$1"; shift
  local out
  out=$(bash "$SRC/scripts/crash_test.sh" --zoff "$ZOFF" "$@" 2>&1)
  if [ $? -eq 0 ]; then echo "ok   - $name: ${out##*crash_test: }"; pass=$((pass + 1))
  else echo "FAIL - $name"; echo "$out" | tail -15; fail=$((fail + 1)); fi
}
run "stage 0 fp32, kill anywhere" --kills $((24 / scale)) --steps 30
run "stage 2 CPU offload fp16, --keep-last 3" --kills $((12 / scale)) --steps 16 --config offload --keep-last 3
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
