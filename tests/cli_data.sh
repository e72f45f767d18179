#!/usr/bin/env bash
# The training data as a user with their own token shards meets it: shards written here by an
# independent writer (numpy, llm.c's format), lists, directories, links, epochs and resumes.
# Usage: cli_data.sh ZOFF SRCDIR
set -u
ZOFF=$(readlink -f "$1"); SRC="$2" # absolute: sections run it from other directories
W=$(mktemp -d /tmp/zoff-cli-data-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check
if ! "$PY" -c 'import numpy' 2>/dev/null; then
    echo "cli_data: SKIPPED: needs numpy (python3-numpy) to write the shards independently"
    exit 77
fi

# llm.c's writer (its dev/data/data_common.py write_datafile): 256 int32 header (magic 20240520,
# version 1, token count, the rest 0), then uint16 tokens; seeded random bytes as tokens
"$PY" - "$W" <<'EOF'
import sys, numpy as np
d = sys.argv[1]
def shard(name, n, seed):
    h = np.zeros(256, dtype='<i4'); h[0], h[1], h[2] = 20240520, 1, n
    t = np.random.default_rng(seed).integers(0, 256, n).astype('<u2')
    with open(f'{d}/{name}', 'wb') as f: f.write(h.tobytes()); f.write(t.tobytes())
shard('a.bin', 20000, 1); shard('b.bin', 6000, 2); shard('val.bin', 3000, 3)
shard('short16.bin', 16, 4); shard('empty.bin', 0, 5); shard('exact17.bin', 17, 6)
EOF
# a schedule of its own (the built-in one spans --train-iters: 2 and 4 steps would differ)
echo '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 2e-3}},
       "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 2}}}' \
  > "$W/sched.json"
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --config "$W/sched.json"
      --tokenizer byte --eval-iters 2)
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/"tokens_per_s".*//'; }

# 1. --data-path as a list of relative paths: the checkpoint records each of them absolute, so a
#    resume without --data-path from another directory reads the same shards (before: only the
#    first was made absolute; the resume failed "token shard b.bin: No such file or directory")
(cd "$W" && "$ZOFF" train "${TINY[@]}" --quiet --data-path a.bin,b.bin --val-path val.bin --train-iters 4 \
   --save "$W/list_straight" >/dev/null 2>&1)
(cd "$W" && "$ZOFF" train "${TINY[@]}" --quiet --data-path a.bin,b.bin --val-path val.bin --train-iters 2 \
   --save "$W/list" >/dev/null 2>&1)
(cd / && "$ZOFF" train --load "$W/list" --train-iters 4 >"$W/list.txt" 2>&1)
rc=$?
check "resume of a relative --data-path list from another directory: exit 0, step 4 saved" \
  "[ $rc -eq 0 ] && [ -f '$W/list/step_00000004/COMPLETE' ]"
check "... reading the run's shards: losses bit-identical to the straight run" \
  "[ -n \"\$(losses '$W/list')\" ] && [ \"\$(losses '$W/list')\" = \"\$(losses '$W/list_straight')\" ]"

# 2. a shard in a --data-path directory that is a link to a file gone: refused, exit 2, naming the
#    link (before: skipped unsaid, the run trained on the other shards; a glob refused it)
mkdir -p "$W/dl"
ln -s ../a.bin "$W/dl/a.bin"; ln -s ../gone.bin "$W/dl/b.bin"
"$ZOFF" train "${TINY[@]}" --data-path "$W/dl" --val-path "$W/val.bin" --train-iters 1 --save "$W/dl_run" \
  >"$W/dl.txt" 2>&1
rc=$?
check "a dangling link in a --data-path directory: exit 2, names the link and its target, nothing written" \
  "[ $rc -eq 2 ] && grep -q 'dl/b.bin (a link to ../gone.bin): No such file' '$W/dl.txt' && [ ! -e '$W/dl_run' ]"
rm "$W/dl/b.bin"
"$ZOFF" train "${TINY[@]}" --quiet --data-path "$W/dl" --val-path "$W/val.bin" --train-iters 1 --save "$W/dl_run2" \
  >"$W/dl.txt" 2>&1
check "... a directory of a link to a shard trains (exit 0)" "[ $? -eq 0 ]"

# 3. an epoch wrap is reported: windows = (tokens - 1) // 16, batches an epoch = windows // 4, so
#    the step after the last batch of epoch 1 begins epoch 2 (before: nothing said)
first=$("$PY" -c 'print((20000 - 1) // 16 // 4 + 1)')
"$ZOFF" train "${TINY[@]}" --data-path "$W/a.bin" --val-path "$W/val.bin" --train-iters "$first" \
  --save "$W/epoch" >"$W/epoch.txt" 2>&1
rc=$?
check "an epoch wrap: exit 0, 'step $first began epoch 2 of the training data' said once" \
  "[ $rc -eq 0 ] && [ \$(grep -c 'step $first began epoch 2 of the training data: an epoch reads 1248 of its 1249 windows' '$W/epoch.txt') -eq 1 ] && [ \$(grep -c 'began epoch' '$W/epoch.txt') -eq 1 ]"

# 4. a shard written again between a run and its resume, the same size with other tokens (a corpus
#    re-tokenized): the resume warns (before: silently other data; a shard removed, added or of
#    another size is refused, exit 2, as before)
mkdir -p "$W/mod"; cp "$W/a.bin" "$W/b.bin" "$W/mod/"
"$ZOFF" train "${TINY[@]}" --quiet --data-path "$W/mod" --val-path "$W/val.bin" --train-iters 2 --save "$W/modrun" \
  >/dev/null 2>&1
"$ZOFF" train --load "$W/modrun" --train-iters 3 >"$W/mod1.txt" 2>&1
rc=$?
check "resume over the same shards: exit 0, no warning about their tokens" \
  "[ $rc -eq 0 ] && ! grep -q 'other tokens' '$W/mod1.txt'"
"$PY" -c "
import numpy as np
h = np.fromfile('$W/mod/b.bin', dtype='<i4', count=256)
t = np.random.default_rng(9).integers(0, 256, int(h[2])).astype('<u2')
with open('$W/mod/b.bin', 'wb') as f: f.write(h.tobytes()); f.write(t.tobytes())"
"$ZOFF" train --load "$W/modrun" --train-iters 4 >"$W/mod2.txt" 2>&1
rc=$?
check "resume over a shard written again (same size, other tokens): exit 0, warns that the data holds other tokens" \
  "[ $rc -eq 0 ] && grep -q \"warning: the data position is restored, but --data-path (the checkpoint's, $W/mod) holds other tokens than the saved run\" '$W/mod2.txt'"
rm "$W/mod/b.bin"
"$ZOFF" train --load "$W/modrun" --train-iters 5 >"$W/mod3.txt" 2>&1
rc=$?
R=$(readlink -f "$W") # the checkpoint records the shards' resolved paths
check "resume with a shard removed: exit 2, the data position refused, naming the shard removed (before: not named)" \
  "[ $rc -eq 2 ] && grep -q 'cannot restore the data position' '$W/mod3.txt' && [ ! -e '$W/modrun/step_00000005' ] \
   && grep -q 'since the save: removed $R/mod/b.bin (6000 tokens)\$' '$W/mod3.txt'"
cp "$W/b.bin" "$W/mod/"; cp "$W/short16.bin" "$W/mod/c.bin"
"$ZOFF" train --load "$W/modrun" --train-iters 5 >"$W/mod4.txt" 2>&1
rc=$?
check "... with a shard added: exit 2, naming it and its tokens" \
  "[ $rc -eq 2 ] && grep -q 'cannot restore the data position.*; since the save: added $R/mod/c.bin (16 tokens)\$' '$W/mod4.txt'"
rm "$W/mod/c.bin"; cp "$W/b.bin" "$W/mod/a.bin"
"$ZOFF" train --load "$W/modrun" --train-iters 5 >"$W/mod5.txt" 2>&1
rc=$?
check "... with a shard of another size: exit 2, naming it and both sizes" \
  "[ $rc -eq 2 ] && grep -q 'cannot restore the data position.*; since the save: $R/mod/a.bin resized to 6000 tokens from 20000\$' '$W/mod5.txt' \
   && [ ! -e '$W/modrun/step_00000005' ]"

# 5. one file named twice: in --data-path and --val-path (a folder of zoff tokenize's output holds
#    NAME_val.bin too), or twice in --data-path (a list and a link): a warning naming both
#    (before: the validation loss was measured on training data, or a shard read twice an epoch, unsaid)
mkdir -p "$W/both"; cp "$W/a.bin" "$W/both/x_train.bin"; cp "$W/val.bin" "$W/both/x_val.bin"
"$ZOFF" train "${TINY[@]}" --quiet --data-path "$W/both" --val-path "$W/both/x_val.bin" --train-iters 1 \
  --save "$W/both_run" >"$W/both.txt" 2>&1
rc=$?
check "--data-path a folder holding the --val-path shard: exit 0, warns naming the shard" \
  "[ $rc -eq 0 ] && grep -q \"warning: --val-path's $W/both/x_val.bin is also a training shard\" '$W/both.txt'"
ln -s a.bin "$W/a_link.bin"
"$ZOFF" train "${TINY[@]}" --quiet --data-path "$W/a.bin,$W/a_link.bin" --val-path "$W/val.bin" --train-iters 1 \
  --save "$W/twice_run" >"$W/twice.txt" 2>&1
rc=$?
check "--data-path naming one file twice (itself and a link to it): exit 0, warns naming both" \
  "[ $rc -eq 0 ] && grep -q 'warning: --data-path names one file twice, $W/a.bin and $W/a_link.bin' '$W/twice.txt'"
"$ZOFF" train "${TINY[@]}" --quiet --data-path "$W/a.bin,$W/b.bin" --val-path "$W/val.bin" --train-iters 1 \
  --save "$W/distinct_run" >"$W/distinct.txt" 2>&1
check "... distinct shards: no such warning" "[ $? -eq 0 ] && ! grep -q 'warning' '$W/distinct.txt'"

# 6. shards shorter than one window (seq_len + 1 = 17 tokens: windows never cross shards) are not
#    read: a note says how many, their tokens and the first (before: left out unsaid); a shard of
#    exactly 17 tokens is one window, read
"$ZOFF" train "${TINY[@]}" --data-path "$W/a.bin,$W/short16.bin,$W/exact17.bin,$W/empty.bin" --val-path "$W/val.bin" \
  --train-iters 1 --save "$W/short_run" >"$W/short.txt" 2>&1
rc=$?
check "shards of 16 and 0 tokens at seq 16: exit 0, a note names 2 of 4 shards, 16 tokens, the first" \
  "[ $rc -eq 0 ] && grep -q \"note: 2 of --data-path's 4 shards (16 tokens; the first: $W/short16.bin) hold fewer than seq_len + 1 = 17 tokens\" '$W/short.txt'"

# 7. the help says what --data-path takes, the list form too (before: "file, directory or glob", while
#    a comma-separated list, section 1, is read)
check "zoff train --help and zoff eval --help name the comma-separated list of --data-path" \
  "\"$ZOFF\" train --help 2>&1 | grep -q 'comma-separated list of these' && \"$ZOFF\" eval --help 2>&1 | grep -q 'comma-separated list of these'"

# 8. a shard truncated in place while a run reads it (a script writing it again): the run ends with an
#    error naming the shard, exit 1, its last checkpoint kept (before: "Bus error", exit 135, no word)
cp "$W/a.bin" "$W/trunc.bin"
"$ZOFF" train "${TINY[@]}" --quiet --data-path "$W/trunc.bin" --val-path "$W/val.bin" --train-iters 1000000 \
  --save-interval 50 --save "$W/trunc_run" >"$W/trunc.txt" 2>&1 &
pid=$!
for _ in $(seq 600); do [ -d "$W/trunc_run/step_00000050" ] && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
: > "$W/trunc.bin"
for _ in $(seq 600); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill $pid 2>/dev/null
wait $pid
rc=$?
check "a shard truncated during the run: exit 1, the error names it, a checkpoint kept" \
  "[ $rc -eq 1 ] && grep -q '$W/trunc.bin: the file became shorter while this run reads it' '$W/trunc.txt' && [ -f '$W/trunc_run/step_00000050/COMPLETE' ]"

# 9. a leading ~ in a path zoff expands itself (a quoted glob, the second path of a comma-separated
#    list: the shell leaves ~ there as it is) is $HOME, as the shell's (before: "no files match
#    '~/a*.bin'", "token shard ~/b.bin: No such file or directory")
mkdir -p "$W/home/c"; cp "$W/a.bin" "$W/b.bin" "$W/val.bin" "$W/home/"
printf 'some text to tokenize\n' > "$W/home/c/t1.txt"
"$ZOFF" train "${TINY[@]}" --quiet --data-path "$W/a.bin,$W/b.bin" --val-path "$W/val.bin" --train-iters 1 \
  --save "$W/tilde_abs" >/dev/null 2>&1
HOME="$W/home" "$ZOFF" train "${TINY[@]}" --quiet --data-path '~/a.bin,~/b.bin' --val-path '~/val*.bin' \
  --train-iters 1 --save "$W/tilde" >"$W/tilde.txt" 2>&1
rc=$?
check "--data-path '~/a.bin,~/b.bin' --val-path '~/val*.bin': exit 0, the same loss as the paths written out" \
  "[ $rc -eq 0 ] && [ -n \"\$(losses '$W/tilde')\" ] && [ \"\$(losses '$W/tilde')\" = \"\$(losses '$W/tilde_abs')\" ]"
HOME="$W/home" "$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$W/tk" '~/c/t*.txt' >"$W/tk.txt" 2>&1
rc=$?
check "zoff tokenize '~/c/t*.txt': exit 0, shards written" "[ $rc -eq 0 ] && ls '$W'/tk*.bin >/dev/null 2>&1"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
