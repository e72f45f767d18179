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

# A really full disk, end to end: a size-limited tmpfs in a private mount namespace (unshare;
# skipped where mounting is not allowed). Training fills it: exit 1 with the file named, every
# checkpoint directory complete; then the file system grows and the resumed run ends
# bit-identical to one that never saw a full disk. Also the NVMe swap file and zoff tokenize.
W=$(mktemp -d "${TMPDIR:-/tmp}/zoff-full-XXXXXX")
cat > "$W/inner.sh" <<'INNER'
set -u
ZOFF="$1"; SRC="$2"; W="$3"; M="$W/mnt"; mkdir -p "$M"
PY=$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3)
mount -t tmpfs -o size=3m tmpfs "$M" || exit 77
check() { if eval "$2"; then echo "ok   - $1"; else echo "FAIL - $1"; fi; }
cat "$SRC"/src/*/*.c > "$W/corpus.txt"
"$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$W/corpus" "$W/corpus.txt" >/dev/null 2>&1
T=(train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4
   --tokenizer byte --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 0 --quiet
   --save-interval 1 --train-iters 30)
"$ZOFF" "${T[@]}" --save "$W/ref" >/dev/null 2>&1
"$ZOFF" "${T[@]}" --save "$M/run" >"$W/err.txt" 2>&1
rc=$?
check "disk full during training: exit 1 naming the file and the error" \
  "[ $rc -eq 1 ] && grep -q 'No space left on device' '$W/err.txt' && grep -qE 'rank_00000.zckpt|metrics.jsonl' '$W/err.txt'"
check "disk full: every checkpoint directory complete and valid, no temp dir left" \
  "'$PY' '$SRC/scripts/zckpt.py' verify '$M/run' >/dev/null && ! ls '$M/run' | grep -q tmp"
mount -o remount,size=64m "$M"
"$ZOFF" "${T[@]}" --save "$M/run" --load "$M/run" >"$W/err2.txt" 2>&1
check "after freeing space the resumed run completes, bit-identical to an uninterrupted one" \
  "[ $? -eq 0 ] && '$PY' '$SRC/scripts/zckpt.py' compare '$W/ref/step_00000030' '$M/run/step_00000030' >/dev/null"
umount "$M" && mount -t tmpfs -o size=200k tmpfs "$M"
printf '{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "%s/swap"}, "sub_group_size": 8000}}' "$M" > "$W/nvme.json"
"$ZOFF" "${T[@]}" --config "$W/nvme.json" --save "$W/nvrun" >"$W/err.txt" 2>&1
rc=$?
check "NVMe swap file on a full disk: exit 1 naming the .swp file, nothing left there" \
  "[ $rc -eq 1 ] && grep -q '\.swp' '$W/err.txt' && [ -z \"\$(ls '$M/swap' 2>/dev/null)\" ]"
mkdir -p "$M/tok" && head -c 150000 /dev/zero > "$M/fill"
"$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$M/tok/c" "$W/corpus.txt" >"$W/err.txt" 2>&1
rc=$?
check "zoff tokenize on a full disk: fails naming the file, leaves nothing" \
  "[ $rc -ne 0 ] && grep -q 'No space left on device' '$W/err.txt' && grep -q 'tok/c_' '$W/err.txt' && [ -z \"\$(ls '$M/tok')\" ]"
INNER
if unshare --user --map-root-user --mount true 2>/dev/null; then NS=(unshare --user --map-root-user --mount)
elif [ "$(id -u)" -eq 0 ] && unshare --mount true 2>/dev/null; then NS=(unshare --mount)
else NS=(); fi
if [ ${#NS[@]} -gt 0 ]; then
  out=$("${NS[@]}" bash "$W/inner.sh" "$ZOFF" "$SRC" "$W" 2>&1); rc=$?
  if [ "$rc" -eq 77 ]; then echo "skip - full-disk tests: cannot mount a tmpfs here"
  else
    echo "$out"
    pass=$((pass + $(echo "$out" | grep -c '^ok '))); fail=$((fail + $(echo "$out" | grep -c '^FAIL ')))
  fi
else
  echo "skip - full-disk tests: no mount namespace (unshare) here"
fi
rm -rf "$W"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
