#!/usr/bin/env bash
# Operating a long run: the tools a user points at a run folder after saves, resumes and
# interruptions. scripts/zckpt.py verify of one step folder checks that checkpoint (before: "ok:
# 0 complete checkpoint(s)", exit 0, having checked nothing, also for a corrupt one); list of a run
# folder says to give a step folder.
# Usage: cli_longrun.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-longrun-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check, byte_corpus, PY

byte_corpus "$SRC" "$W"
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4
      --tokenizer byte --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 2)
ZCKPT=("$PY" "$SRC/scripts/zckpt.py")

# 1. a run with periodic saves; then a resume of its older step 3 (step 6 moved out of the folder,
# as docs/reliability.md says to), trained to step 5
"$ZOFF" train "${TINY[@]}" --train-iters 6 --save-interval 3 --save "$W/run" --quiet >/dev/null 2>&1
check "run to step 6 with --save-interval 3: steps 3 and 6 saved" \
  "[ -f '$W/run/step_00000003/COMPLETE' ] && [ -f '$W/run/step_00000006/COMPLETE' ]"
mv "$W/run/step_00000006" "$W/moved_step_6"
"$ZOFF" train "${TINY[@]}" --train-iters 5 --load "$W/run" --quiet >/dev/null 2>&1
check "resume of step 3 to step 5: exit 0, step 5 saved" "[ \$? -eq 0 ] && [ -f '$W/run/step_00000005/COMPLETE' ]"

# 2. zckpt.py verify of one step folder verifies it; a corrupt one fails
out=$("${ZCKPT[@]}" verify "$W/run/step_00000005" 2>&1)
check "verify DIR/step_00000005: exit 0 naming step 5 ($out)" "[ \$? -eq 0 ] && echo '$out' | grep -q '1 complete checkpoint(s): 5'"
cp -r "$W/run/step_00000003" "$W/bad_step"
mv "$W/bad_step" "$W/step_00000003"
f="$W/step_00000003/rank_00000.zckpt"
size=$(stat -c %s "$f")
printf '\125\146\167\210' | dd of="$f" bs=1 seek=$((size - 4096)) conv=notrunc 2>/dev/null
"${ZCKPT[@]}" verify "$W/step_00000003" >"$W/v.txt" 2>&1
check "verify of a corrupt step folder: exit 1, 'CRC mismatch' (before: 'ok: 0', exit 0)" \
  "[ \$? -eq 1 ] && grep -q 'CRC mismatch' '$W/v.txt'"
mkdir "$W/run/step_00000009"
"${ZCKPT[@]}" verify "$W/run/step_00000009" >"$W/v.txt" 2>&1
check "verify of a step folder without COMPLETE: exit 1, 'no COMPLETE marker'" \
  "[ \$? -eq 1 ] && grep -q 'no COMPLETE marker' '$W/v.txt'"
rmdir "$W/run/step_00000009"
"${ZCKPT[@]}" list "$W/run" >"$W/v.txt" 2>&1
check "list of a run folder: exit 1, says it is not a step directory (before: rank_00000.zckpt not found)" \
  "[ \$? -eq 1 ] && grep -q 'is not a step directory' '$W/v.txt'"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
