#!/usr/bin/env bash
# Operating a long run: the tools a user points at a run folder after saves, resumes and
# interruptions. scripts/zckpt.py verify of one step folder checks that checkpoint (before: "ok:
# 0 complete checkpoint(s)", exit 0, having checked nothing, also for a corrupt one); list of a run
# folder says to give a step folder; scripts/plot_metrics.sh draws the run as it stands after a
# resume of an older step: one point per step, the steps the abandoned branch logged past it
# dropped (before: steps 1..6 then 4, 5 again, the curve drawn back over itself); --keep-last on
# the resume of a run whose saves filled the disk applies at start, so that the run goes on.
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

# 3. plot_metrics.sh after the resume of step 3: steps 1..5, each once, in order; validation at 0
# (the first start), 3 (the resume's start) and 5 (its end), not the abandoned branch's step 6.
# gnuplot is replaced by a stand-in that keeps the data files it is given.
mkdir "$W/bin" "$W/seen"
cat > "$W/bin/gnuplot" <<'G'
#!/bin/sh
p=$(grep -o '"[^"]*/steps.dat"' | head -1 | tr -d '"')
cp "$p" "$SEEN/steps.dat" && cp "${p%steps.dat}val.dat" "$SEEN/val.dat"
G
chmod +x "$W/bin/gnuplot"
SEEN="$W/seen" PATH="$W/bin:$PATH" bash "$SRC/scripts/plot_metrics.sh" "$W/run" "$W/plots" >"$W/p.txt" 2>&1
check "plot_metrics.sh: exit 0" "[ \$? -eq 0 ]"
steps=$(awk '{printf "%s ", $1}' "$W/seen/steps.dat" 2>/dev/null)
check "plot_metrics.sh: train points at steps 1 2 3 4 5 (got: $steps)" "[ '$steps' = '1 2 3 4 5 ' ]"
vals=$(awk '{printf "%s ", $1}' "$W/seen/val.dat" 2>/dev/null)
check "plot_metrics.sh: validation points at steps 0 3 5 (got: $vals)" "[ '$vals' = '0 3 5 ' ]"
# the points of steps 4 and 5 are the resumed run's: its last lines for those steps
l5=$(grep '"step":5,"loss"' "$W/run/metrics.jsonl" | tail -1 | sed 's/.*"loss":\([0-9.]*\).*/\1/')
check "plot_metrics.sh: step 5's loss is the resumed run's ($l5)" "awk '\$1 == 5 { exit !(\$2 == $l5) }' '$W/seen/steps.dat'"

# 4. a run saving every 2 steps without --keep-last fills its disk (a tmpfs of 2 MiB, 4 checkpoints
# of 500 KiB, in a private mount namespace; skipped where mounting is not allowed): exit 1, advice
# "keep fewer checkpoints (--keep-last)" and "go on with --load". That resume with --keep-last 2
# keeps the newest 2 from the start and goes on (before: refused at start, the disk too full for one
# checkpoint, as the older ones were pruned only after a save)
cat > "$W/inner.sh" <<'INNER'
set -u
ZOFF="$1"; W="$2"; shift 2; mkdir -p "$W/m"; mount -t tmpfs -o size=2m tmpfs "$W/m" || exit 77
"$ZOFF" train "$@" --train-iters 20 --save-interval 2 --save "$W/m/run" >"$W/full.txt" 2>&1
echo "first rc=$?"
"$ZOFF" train "$@" --train-iters 14 --save-interval 2 --keep-last 2 --load "$W/m/run" >"$W/keep.txt" 2>&1
echo "resume rc=$? steps: $(cd "$W/m/run" && ls -d step_* | tr '\n' ' ')"
umount "$W/m"
INNER
if unshare --user --map-root-user --mount true 2>/dev/null; then NS=(unshare --user --map-root-user --mount)
elif [ "$(id -u)" -eq 0 ] && unshare --mount true 2>/dev/null; then NS=(unshare --mount)
else NS=(); fi
out=""; rc=77
if [ ${#NS[@]} -gt 0 ]; then out=$("${NS[@]}" bash "$W/inner.sh" "$(readlink -f "$ZOFF")" "$W" "${TINY[@]}" 2>&1); rc=$?; fi
if [ $rc -eq 77 ]; then echo "skip - --keep-last on a resume after the disk filled: cannot mount a tmpfs here"
else
  check "saves without --keep-last fill a 2 MiB disk: exit 1, advice --keep-last and --load ($(echo $out | head -c 200))" \
    "echo '$out' | grep -q '^first rc=1' && grep -q 'keep fewer checkpoints (--keep-last)' '$W/full.txt' && grep -q 'go on with --load' '$W/full.txt'"
  check "the resume with --keep-last 2: exit 0, only steps 12 and 14 left" \
    "echo '$out' | grep -q '^resume rc=0 steps: step_00000012 step_00000014 \$'"
  check "... the older checkpoints removed at start, each said" \
    "grep -q 'removed old checkpoint .*step_00000004 (keeping the newest 2)' '$W/keep.txt'"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
