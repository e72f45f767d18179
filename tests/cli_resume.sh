#!/usr/bin/env bash
# The rules of --save and --load (docs/reliability.md, "Runs, --save and --load") and what zoff
# train prints: a --save holding another run's checkpoints is refused without --load (or
# cleared with --overwrite); a resume refuses settings that change what the stored state means
# (optimizer, precision, model shape, sequence length, vocabulary) naming the key and both
# values (for older checkpoints from their stored config), and prints those it may change; bad shapes are refused by flag name with nothing
# written; the summary prints validation only when measured; the start-up time is in the log
# and in metrics.jsonl; with 2 ranks (when MPI is there) the validation loss is the 1-rank one,
# the banner shows the global batch, and --quiet prints nothing on success.
# Usage: cli_resume.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
ZABS=$(readlink -f "$ZOFF") # for runs in another working directory
W=$(mktemp -d /tmp/zoff-resume-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check

byte_corpus "$SRC" "$W"
SHAPE=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16)
DATA=(--tokenizer byte --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin")
TINY=("${SHAPE[@]}" --micro-batch-size 4 "${DATA[@]}" --eval-iters 2)
SEQ8=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 8 --micro-batch-size 4 "${DATA[@]}")
cfg() { # optimizer bf16? lr clip
  echo "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"$1\", \"params\": {\"lr\": $3}},
         \"bf16\": {\"enabled\": $2}, \"gradient_clipping\": $4, \"zero_optimization\": {\"stage\": 2}}"
}
cfg AdamW true 1e-3 1.0 > "$W/adamw.json"
cfg Lion true 1e-3 1.0 > "$W/lion.json"
cfg AdamW false 1e-3 1.0 > "$W/fp32.json"
cfg AdamW true 5e-4 0.5 > "$W/adamw_lr.json"

# 1. a run into a --save that already holds checkpoints, without --load, is refused
"$ZOFF" train "${TINY[@]}" --config "$W/adamw.json" --train-iters 4 --save "$W/run" --quiet >/dev/null 2>&1
check "first run ends at step 4" "[ -f '$W/run/step_00000004/COMPLETE' ]"
cp "$W/run/metrics.jsonl" "$W/metrics_before.jsonl"
"$ZOFF" train "${TINY[@]}" --config "$W/adamw.json" --train-iters 2 --save "$W/run" >"$W/err.txt" 2>&1
rc=$?
check "new run into a --save with checkpoints: exit 2" "[ $rc -eq 2 ]"
check "... the message names the newest step, --load, --overwrite" \
  "grep -q 'already holds checkpoints.*step 4.*--load.*--overwrite' '$W/err.txt'"
check "... and nothing there changed (checkpoints, metrics.jsonl)" \
  "cmp -s '$W/metrics_before.jsonl' '$W/run/metrics.jsonl' && [ -f '$W/run/step_00000004/COMPLETE' ] && [ ! -e '$W/run/step_00000002' ]"
"$ZOFF" train "${TINY[@]}" --config "$W/adamw.json" --train-iters 2 --save "$W/run" --overwrite --quiet >/dev/null 2>&1
check "--overwrite starts over: step 2 is the newest, the old step 4 is gone" \
  "[ \$? -eq 0 ] && [ -f '$W/run/step_00000002/COMPLETE' ] && [ ! -e '$W/run/step_00000004' ]"
"$ZOFF" train "${TINY[@]}" --config "$W/adamw.json" --train-iters 3 --save "$W/run" --load "$W/run" --overwrite >"$W/err.txt" 2>&1
check "--overwrite with --load is refused (exit 2)" "[ \$? -eq 2 ] && grep -q 'exclude each other' '$W/err.txt'"

# 2. resume with another optimizer type or precision: refused, naming the key and both values
"$ZOFF" train "${TINY[@]}" --config "$W/lion.json" --train-iters 4 --save "$W/run" --load "$W/run" >"$W/err.txt" 2>&1
rc=$?
check "resume with another optimizer: exit 2" "[ $rc -eq 2 ]"
check "... naming optimizer.type, AdamW and Lion" "grep -q 'optimizer.type is AdamW in the checkpoint but Lion' '$W/err.txt'"
"$ZOFF" train "${TINY[@]}" --config "$W/fp32.json" --train-iters 4 --save "$W/run" --load "$W/run" >"$W/err.txt" 2>&1
check "resume in another precision: exit 2 naming bf16 and fp32" \
  "[ \$? -eq 2 ] && grep -q 'precision.*bf16 in the checkpoint but fp32' '$W/err.txt'"
check "refused resumes wrote nothing" "[ ! -e '$W/run/step_00000004' ]"

# 3. the sequence length, vocabulary or shape of the checkpoint cannot change on resume
"$ZOFF" train "${SEQ8[@]}" --config "$W/adamw.json" --train-iters 4 --save "$W/run" --load "$W/run" >"$W/err.txt" 2>&1
check "resume with another --seq-length: exit 2 naming seq_length 16 and 8" \
  "[ \$? -eq 2 ] && grep -q 'seq_length is 16 in the checkpoint but 8 here' '$W/err.txt'"
"$ZOFF" train "${TINY[@]}" --vocab-size 300 --config "$W/adamw.json" --train-iters 4 --save "$W/run" --load "$W/run" >"$W/err.txt" 2>&1
check "resume with another --vocab-size: exit 2 naming vocab_size" \
  "[ \$? -eq 2 ] && grep -q 'vocab_size is 256 in the checkpoint but 300 here' '$W/err.txt'"

# 4. what a resume may change is printed, one line each; the run goes on
"$ZOFF" train "${TINY[@]}" --config "$W/adamw_lr.json" --train-iters 4 --save "$W/run" --load "$W/run" >"$W/out.txt" 2>&1
check "resume with another lr and clipping: exit 0, ends at step 4" "[ \$? -eq 0 ] && [ -f '$W/run/step_00000004/COMPLETE' ]"
check "... one line for the lr (0.001 -> 0.0005)" "grep -q 'resume: optimizer.params.lr 0.001 -> 0.0005' '$W/out.txt'"
check "... one line for gradient_clipping (1 -> 0.5)" "grep -q 'resume: gradient_clipping 1 -> 0.5' '$W/out.txt'"
check "... and none for what did not change" "! grep -q 'resume: train_micro_batch' '$W/out.txt'"

# 4b. a checkpoint written before "settings" existed: the stored config is compared instead
cp -r "$W/run" "$W/old"
"$PY" "$SRC/scripts/zckpt.py" strip "$W/old/step_00000004/rank_00000.zckpt" --meta-key settings >/dev/null
check "old-style checkpoint (no settings in meta) still verifies" "'$PY' '$SRC/scripts/zckpt.py' verify '$W/old' >/dev/null"
"$ZOFF" train "${TINY[@]}" --config "$W/lion.json" --train-iters 5 --save "$W/old" --load "$W/old" >"$W/err.txt" 2>&1
check "old-style checkpoint, another optimizer: refused from the stored config (AdamW vs Lion)" \
  "[ \$? -eq 2 ] && grep -q 'optimizer.type is AdamW in the checkpoint but Lion' '$W/err.txt'"
"$ZOFF" train "${TINY[@]}" --config "$W/adamw_lr.json" --train-iters 5 --save "$W/old" --load "$W/old" --quiet >"$W/err.txt" 2>&1
check "old-style checkpoint, same optimizer: resumes to step 5" "[ \$? -eq 0 ] && [ -f '$W/old/step_00000005/COMPLETE' ]"

# 5. --quiet: a successful resume prints nothing (no "resumed from")
"$ZOFF" train "${TINY[@]}" --config "$W/adamw_lr.json" --train-iters 5 --save "$W/run" --load "$W/run" --quiet >"$W/q.txt" 2>&1
check "--quiet resume: exit 0 and no output" "[ \$? -eq 0 ] && [ ! -s '$W/q.txt' ]"

# 6. a shape the model cannot have: refused by flag name, exit 2, no --save directory left
"$ZOFF" train "${DATA[@]}" --num-layers 2 --hidden-size 64 --num-attention-heads 5 --seq-length 16 \
  --train-iters 1 --save "$W/heads/sub" >"$W/err.txt" 2>&1
rc=$?
check "hidden 64 with 5 heads: exit 2 naming the flags" "[ $rc -eq 2 ] && grep -q -- '--num-attention-heads' '$W/err.txt'"
check "... without naming an internal function" "! grep -q 'zoff_gpt2_create' '$W/err.txt'"
check "... and no --save directory created" "[ ! -e '$W/heads' ]"
"$ZOFF" train "${TINY[@]}" --device-memory 64KiB --train-iters 1 --save "$W/oom/sub" >"$W/err.txt" 2>&1
check "a model that does not fit the device: exit non-zero, no empty --save directory left" \
  "[ \$? -ne 0 ] && [ ! -e '$W/oom' ]"

# 7. the summary prints validation figures only when measured; start-up time in log and metrics
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --train-iters 2 --save "$W/noval" >"$W/out.txt" 2>&1
check "--eval-iters 0: the summary has no validation loss (no 'nan')" \
  "[ \$? -eq 0 ] && grep -q 'trained 2 steps' '$W/out.txt' && ! grep -q 'validation' '$W/out.txt' && ! grep -qi 'nan' '$W/out.txt'"
"$ZOFF" train "${TINY[@]}" --train-iters 2 --save "$W/val" >"$W/out.txt" 2>&1
check "with validation: the summary has 'validation loss A -> B'" \
  "grep -qE 'validation loss [0-9.]+ -> [0-9.]+' '$W/out.txt'"
check "the summary gives the peak device and pinned memory (what zoff plan predicts) and the host's resident peak" \
  "grep -qE '^zoff: peak memory: device [0-9.]+ (B|KiB|MiB|GiB), pinned host [0-9.]+ (B|KiB|MiB|GiB), host resident [0-9.]+ (B|KiB|MiB|GiB) \\(the process.s VmHWM\\)$' '$W/out.txt'"
check "the log reports the start-up time" "grep -qE '^zoff: start-up [0-9.]+ s' '$W/out.txt'"
check "metrics.jsonl has a startup_time line before the first step" \
  "head -1 '$W/val/metrics.jsonl' | grep -qE '^\\{\"step\":0,\"startup_time\":[0-9.]+(,\"startup_[a-z_]+\":-?[0-9.]+){8}\\}$'"
check "the log breaks the start-up down by phase" \
  "grep -qE '^zoff: start-up [0-9.]+ s \\(config [0-9.]+, data [0-9.]+, model [0-9.]+, initial_weights [0-9.]+, engine_alloc [0-9.]+, first_touch [0-9.]+, pinning [0-9.]+, other [0-9.]+ s\\)' '$W/out.txt'"

# 9. a resume into a --save that holds other checkpoints than the loaded run's: refused at start
"$ZOFF" train "${TINY[@]}" --config "$W/adamw.json" --train-iters 4 --save "$W/ra" --quiet >/dev/null 2>&1
"$ZOFF" train "${TINY[@]}" --config "$W/adamw.json" --train-iters 6 --save "$W/rb" --save-interval 2 --seed 7 --quiet >/dev/null 2>&1
cp "$W/rb/metrics.jsonl" "$W/rb_metrics.jsonl"
"$ZOFF" train "${TINY[@]}" --config "$W/adamw.json" --train-iters 5 --load "$W/ra" --save "$W/rb" >"$W/err.txt" 2>&1
check "--load A --save B, B holding another run's checkpoints: exit 2" \
  "[ \$? -eq 2 ] && grep -q 'holds checkpoints of another run (the newest: step 6)' '$W/err.txt'"
check "... before training: B's steps and metrics.jsonl unchanged" \
  "[ ! -e '$W/rb/step_00000005' ] && cmp -s '$W/rb_metrics.jsonl' '$W/rb/metrics.jsonl'"
"$ZOFF" train "${TINY[@]}" --config "$W/adamw.json" --train-iters 6 --load "$W/rb/step_00000002" --save "$W/rb" >"$W/err.txt" 2>&1
check "resume of step 2 into its own folder that holds steps 4 and 6: exit 2 at start, naming the newer steps" \
  "[ \$? -eq 2 ] && grep -q 'resumes step 2, but --save .* also holds newer steps (up to 6)' '$W/err.txt' && cmp -s '$W/rb_metrics.jsonl' '$W/rb/metrics.jsonl'"
"$ZOFF" train "${TINY[@]}" --config "$W/adamw.json" --train-iters 3 --load "$W/rb/step_00000002" --save "$W/rb2" --quiet >/dev/null 2>&1
check "... into another (empty) --save it runs: step 3 there" "[ \$? -eq 0 ] && [ -f '$W/rb2/step_00000003/COMPLETE' ]"
"$ZOFF" train "${TINY[@]}" --config "$W/adamw.json" --train-iters 7 --load "$W/rb/step_00000006" --save "$W/rb" --quiet >/dev/null 2>&1
check "... and the newest step's folder given as --load, into its own folder, runs: step 7" \
  "[ \$? -eq 0 ] && [ -f '$W/rb/step_00000007/COMPLETE' ]"

(cd "$W" && "$ZABS" train "${TINY[@]}" --train-iters 4 --load "$W/rb2" --quiet >/dev/null 2>&1)
check "--load DIR without --save goes on in DIR: step 4 there, nothing in the default out/gpt2-small" \
  "[ \$? -eq 0 ] && [ -f '$W/rb2/step_00000004/COMPLETE' ] && [ ! -e '$W/out' ]"
(cd "$W" && "$ZABS" train "${SHAPE[@]}" --micro-batch-size 4 --tokenizer byte --data-path corpus_train.bin \
  --val-path corpus_val.bin --eval-iters 2 --train-iters 5 --load "$W/rb2/step_00000004" --quiet >/dev/null 2>&1)
check "... and --load DIR/step_N without --save in DIR too: step 5" \
  "[ \$? -eq 0 ] && [ -f '$W/rb2/step_00000005/COMPLETE' ] && [ ! -e '$W/out' ]"

(cd / && "$ZABS" train "${SHAPE[@]}" --tokenizer byte --eval-iters 2 --train-iters 6 --load "$W/rb2" >"$W/out.txt" 2>&1)
check "... and without --data-path, elsewhere, too: the run's shards (given relative, recorded absolute), said; its validation runs" \
  "[ \$? -eq 0 ] && [ -f '$W/rb2/step_00000006/COMPLETE' ] && grep -q 'resume: no --data-path given: the run.s $W/corpus_train.bin, --val-path $W/corpus_val.bin' '$W/out.txt' && grep -q 'validation loss' '$W/out.txt'"
# ... and a shard of the run's gone: the error names the path as the checkpoint's (before: "--data-path:",
# a flag not given)
for f in train val; do
  mv "$W/corpus_$f.bin" "$W/corpus_$f.off"
  (cd / && "$ZABS" train "${SHAPE[@]}" --tokenizer byte --eval-iters 2 --train-iters 7 --load "$W/rb2" >"$W/out.txt" 2>&1)
  rc=$?
  mv "$W/corpus_$f.off" "$W/corpus_$f.bin"
  flag=$([ $f = train ] && echo data || echo val)
  check "... without --data-path, the run's --$flag-path shard gone: exit 2, '--$flag-path (the checkpoint's, PATH): ...', no step 7" \
    "[ $rc -eq 2 ] && grep -q -- '^zoff train: --$flag-path (the checkpoint.s, $W/corpus_$f.bin): .*corpus_$f.bin' '$W/out.txt' \
     && [ ! -e '$W/rb2/step_00000007' ]"
done

# 10. a resume without --config goes on with the checkpoint's config and batch, not the default
echo '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
       "optimizer": {"type": "Lion", "params": {"lr": 1e-4, "betas": [0.8, 0.9]}},
       "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}' > "$W/lion_lr.json"
"$ZOFF" train "${SHAPE[@]}" "${DATA[@]}" --eval-iters 0 --config "$W/lion_lr.json" --micro-batch-size 1 --train-iters 2 \
  --save "$W/nc" --quiet >/dev/null 2>&1
"$ZOFF" train "${SHAPE[@]}" "${DATA[@]}" --eval-iters 0 --train-iters 3 --load "$W/nc" --save "$W/nc" >"$W/out.txt" 2>&1
check "resume without --config of a Lion run: exit 0, says it takes the stored config" \
  "[ \$? -eq 0 ] && grep -q 'the run goes on with the config stored in' '$W/out.txt'"
check "... no setting changed (no 'resume:' change line), the batch is the run's (--micro-batch-size 1 x 2)" \
  "! grep -q 'resume: .* -> ' '$W/out.txt' && grep -q 'batch 1 x 2 accumulation' '$W/out.txt'"
check "... and step 3 runs at the stored lr (1e-4, no schedule)" \
  "grep '\"step\":3,' '$W/nc/metrics.jsonl' | grep -q '\"lr\":1.000000e-04,'"

# 11. Adam (adam_w_mode true, DeepSpeed's default) and AdamW are one update; other changes printed
echo '{"train_micro_batch_size_per_gpu": 4}' > "$W/noopt.json"
echo '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"betas": [0.5, 0.6],
       "eps": 1e-3, "weight_decay": 0.2}}, "zero_optimization": {"stage": 1}}' > "$W/adamw_b.json"
echo '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}}' > "$W/adaml2.json"
"$ZOFF" train "${TINY[@]}" --config "$W/noopt.json" --train-iters 1 --save "$W/aw" --quiet >/dev/null 2>&1
"$ZOFF" train "${TINY[@]}" --config "$W/adamw_b.json" --train-iters 2 --load "$W/aw" --save "$W/aw" >"$W/out.txt" 2>&1
check "a run without an optimizer section (Adam, adam_w_mode true) resumed as AdamW: exit 0, no optimizer.type line" \
  "[ \$? -eq 0 ] && ! grep -q 'optimizer.type' '$W/out.txt'"
check "... betas, eps, weight_decay and the ZeRO stage changes printed, one line each" \
  "grep -q 'resume: optimizer.params.betas\\[0\\] 0.9 -> 0.5' '$W/out.txt' && grep -q 'resume: optimizer.params.betas\\[1\\] 0.999 -> 0.6' '$W/out.txt' && grep -q 'resume: optimizer.params.eps 1e-08 -> 0.001' '$W/out.txt' && grep -q 'resume: optimizer.params.weight_decay 0 -> 0.2' '$W/out.txt' && grep -q 'resume: zero_optimization.stage 0 -> 1' '$W/out.txt'"
"$ZOFF" train "${TINY[@]}" --config "$W/adaml2.json" --train-iters 3 --load "$W/aw" --save "$W/aw" >"$W/out.txt" 2>&1
check "... and Adam with adam_w_mode false (L2) after it: the change printed (AdamW -> Adam)" \
  "[ \$? -eq 0 ] && grep -q 'resume: optimizer.type AdamW -> Adam ' '$W/out.txt'"

# 12. the built-in config's schedule spans --train-iters; a config's shorter schedule is noted
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --train-iters 30 --save "$W/sched" --quiet >/dev/null 2>&1
lr30=$(grep -o '"step":30,[^}]*"lr":[0-9.e-]*' "$W/sched/metrics.jsonl" | grep -o '"lr":[0-9.e-]*' | cut -d: -f2)
check "built-in config, --train-iters 30: the last step's lr is near the cosine floor 2e-4 (got $lr30)" \
  "awk -v x='$lr30' 'BEGIN { exit !(x != \"\" && x >= 2e-4 && x < 2.2e-4) }'"
echo '{"train_micro_batch_size_per_gpu": 4, "scheduler": {"type": "WarmupCosineLR",
       "params": {"total_num_steps": 3, "warmup_num_steps": 1}}}' > "$W/short.json"
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --config "$W/short.json" --train-iters 4 --no-checkpoint --save "$W/short" >"$W/out.txt" 2>&1
check "a WarmupCosineLR of 3 steps with --train-iters 4: a note names both" \
  "[ \$? -eq 0 ] && grep -q 'schedule ends at scheduler.params.total_num_steps 3, before --train-iters 4' '$W/out.txt'"

# 13. fp16 overflow: each skipped step is said, the summary counts them, loss_scale exact
echo '{"train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": true, "initial_scale_power": 32},
       "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}' > "$W/fp16.json"
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --config "$W/fp16.json" --train-iters 2 --save "$W/f16" >"$W/out.txt" 2>&1
nskip=$(grep -c '"skipped":true' "$W/f16/metrics.jsonl")
check "fp16 from 2^32: $nskip of 2 steps skipped, each said on the console" \
  "[ $nskip -ge 1 ] && [ \$(grep -c 'inf/NaN gradients at loss scale [0-9]*: update skipped' '$W/out.txt') -eq $nskip ]"
check "... the summary counts them" "grep -q 'trained 2 steps ($nskip of them skipped: inf/NaN gradients)' '$W/out.txt'"
check "... and metrics.jsonl's loss_scale is the exact integer 4294967296, not 4.29497e+09" \
  "grep -q '\"loss_scale\":4294967296,' '$W/f16/metrics.jsonl'"

# 14. an nvme_path that is a file: exit 2 naming it
touch "$W/afile"
echo "{\"train_micro_batch_size_per_gpu\": 4, \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$W/afile\"}}}" > "$W/nvfile.json"
"$ZOFF" train "${TINY[@]}" --config "$W/nvfile.json" --train-iters 1 --no-checkpoint --save "$W/nv" >"$W/err.txt" 2>&1
check "nvme_path names a file: exit 2, 'is a file, not a directory'" \
  "[ \$? -eq 2 ] && grep -q 'nvme_path .*afile is a file, not a directory' '$W/err.txt'"

# 15. SIGINT during the final validation (the checkpoint written): it stops, exit 130. The signal
# goes 0.3 s after the step's COMPLETE marker appears (the validation of 100 batches takes seconds);
# if it still lands in the save's last moments (fsync, rename: "step 1 saved under ..."), another
# try, up to 3.
for try in 1 2 3; do
  rm -rf "$W/sig"
  "$ZOFF" train "${DATA[@]}" --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 \
    --micro-batch-size 8 --eval-iters 100 --train-iters 1 --save "$W/sig" >"$W/sig.txt" 2>&1 &
  P=$!
  for _ in $(seq 1 6000); do [ -f "$W/sig/step_00000001/COMPLETE" ] && break; kill -0 $P 2>/dev/null || break; sleep 0.05; done
  sleep 0.3
  kill -INT $P 2>/dev/null
  wait $P
  rc=$?
  grep -q 'step 1 saved under' "$W/sig.txt" || break
  echo "# try $try: the signal came before the save returned"
done
check "SIGINT after the final save, during the final validation: exit 130 (rc $rc), says so" \
  "[ $rc -eq 130 ] && grep -q 'the final validation stopped; step 1 is saved' '$W/sig.txt' \
   && grep -Eq '^zoff: trained 1 step \(stopped by signal 2\) in [0-9.]+ s; train loss [0-9.]+ \(last step\)$' '$W/sig.txt'"

# 15b. SIGHUP (the terminal closed, an ssh session dropped) stops the run as SIGTERM does: the step
# saved, exit 129 (before: the process died with no checkpoint of the steps it had trained)
rm -rf "$W/hup"
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --train-iters 100000 --save "$W/hup" >"$W/hup.txt" 2>&1 </dev/null &
P=$!
for _ in $(seq 1 6000); do grep -q '"step":2,' "$W/hup/metrics.jsonl" 2>/dev/null && break; kill -0 $P 2>/dev/null || break; sleep 0.05; done
kill -HUP $P 2>/dev/null
wait $P
rc=$?
check "SIGHUP: exit 129, the step it reached saved and named, a complete checkpoint" \
  "[ $rc -eq 129 ] && grep -q 'signal 1: saving a checkpoint at step' '$W/hup.txt' && ls '$W'/hup/step_*/COMPLETE >/dev/null 2>&1 \
   && grep -q 'saved under .*/hup; go on with --load' '$W/hup.txt'"
# ... and it says what it trained, as a run that ends does (before: no summary at all): the steps
# (the step it saved, from the checkpoint's folder name), the stop, the last loss, the throughput
hs=$(ls -d "$W"/hup/step_* 2>/dev/null | tail -1); hs=$((10#${hs##*step_}))
check "SIGHUP: the summary: trained $hs steps (stopped by signal 1), the last loss, the throughput" \
  "grep -Eq '^zoff: trained $hs steps \(stopped by signal 1\) in [0-9.]+ s; train loss [0-9.]+ \(last step\)' '$W/hup.txt' \
   && grep -q '^zoff: throughput: [0-9]* tokens/s' '$W/hup.txt' && grep -q '^zoff: peak memory:' '$W/hup.txt' \
   && ! grep -q 'try: zoff sample' '$W/hup.txt'"

# 16. what a run takes that the user did not say is said: a capped --eval-iters, a kept seed, the
# optimizer of a config without one
"$ZOFF" train "${TINY[@]}" --eval-iters 1000000 --train-iters 1 --seed 7 --save "$W/sd" >"$W/out.txt" 2>&1
check "--eval-iters beyond the validation data: a note with the batches used" \
  "[ \$? -eq 0 ] && grep -q 'note: --eval-iters 1000000 is more than --val-path holds ([0-9]* batches of 4 x 16 tokens)' '$W/out.txt'"
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --train-iters 2 --load "$W/sd" --save "$W/sd" >"$W/out.txt" 2>&1
check "a resume without --seed 7: the run's seed 7 is kept, and said" \
  "[ \$? -eq 0 ] && grep -q \"resume: the run's seed 7 is kept, not 1234\" '$W/out.txt'"
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --train-iters 3 --load "$W/sd" --save "$W/sd" --seed 7 >"$W/out.txt" 2>&1
check "... the step it saved records seed 7: the next resume with --seed 7 says nothing of it" \
  "[ \$? -eq 0 ] && ! grep -q 'seed' '$W/out.txt'"
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --config "$W/noopt.json" --train-iters 1 --no-checkpoint --save "$W/noopt" >"$W/out.txt" 2>&1
check "a config without an optimizer section: a note names AdamW and its settings" \
  "[ \$? -eq 0 ] && grep -q 'note: the config has no optimizer section: AdamW at .* (lr 0.001, betas (0.9, 0.999)' '$W/out.txt'"

echo '{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}' > "$W/all3.json"
"$ZOFF" train "${SHAPE[@]}" "${DATA[@]}" --eval-iters 0 --config "$W/all3.json" --micro-batch-size 2 --train-iters 1 \
  --no-checkpoint --save "$W/mb" >"$W/out.txt" 2>&1
check "--micro-batch-size 2 with a config giving all three batch keys: the re-derived accumulation is said" \
  "[ \$? -eq 0 ] && grep -q 'note: --micro-batch-size 2 keeps train_batch_size 16: gradient_accumulation_steps 4 -> 8' '$W/out.txt'"

"$ZOFF" train "${DATA[@]}" --num-layers 1 --hidden-size 32 --num-attention-heads 1 --seq-length 16 --eval-iters 0 \
  --train-iters 1 --no-checkpoint --save "$W/one" >"$W/out.txt" 2>&1
check "the banner of a 1-layer, 1-head model of 21472 parameters says so (not '1 layers', '0.02M')" \
  "grep -q 'GPT-2 1 layer, width 32, 1 head, seq 16, vocab 256: 21472 parameters on' '$W/out.txt'"

# a half-written step (step_X.tmp-PID of a live process) and an unfinished one (no COMPLETE marker)
# beside complete ones: each said once per run, not at every listing of the folder (before: 4 times
# each for one run with 1 rank: the resume, --load, the saves)
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --train-iters 2 --save-interval 1 --save "$W/half" --quiet >/dev/null 2>&1
mkdir "$W/half/step_00000009.tmp-$$" "$W/half/step_00000008"
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --train-iters 2 --save "$W/half" --load "$W/half" >"$W/half.txt" 2>&1
check "resume beside a step_X.tmp-PID and an unmarked step: exit 0, each 'ignoring' line printed once" \
  "[ \$? -eq 0 ] && [ \$(grep -c 'ignoring .*half/step_00000009.tmp-$$: a checkpoint still being written' '$W/half.txt') -eq 1 ] \
   && [ \$(grep -c 'ignoring incomplete checkpoint .*half/step_00000008 ' '$W/half.txt') -eq 1 ] && grep -q 'resumed from .* at step 2' '$W/half.txt'" \
  || cat "$W/half.txt"
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --train-iters 4 --save-interval 1 --save "$W/half" --load "$W/half" >"$W/half2.txt" 2>&1
check "and training on with a save each step: the unmarked step still said once" \
  "[ \$? -eq 0 ] && [ \$(grep -c 'ignoring incomplete checkpoint .*half/step_00000008 ' '$W/half2.txt') -eq 1 ] && [ -e '$W/half/step_00000004' ]" \
  || cat "$W/half2.txt"

# 8. two ranks (MPI): validation loss == one rank's; the banner shows the global batch; --quiet
if command -v mpirun >/dev/null 2>&1 && "$ZOFF" version | grep -q '^mpi: built'; then
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  MPI2=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader
        --mca btl_vader_single_copy_mechanism none -x ZOFF_THREADS=1 -x OMP_NUM_THREADS=1
        -x OMP_WAIT_POLICY=passive -x ZOFF_COMM_TIMEOUT=120 -x ASAN_OPTIONS -np 2)
  "$ZOFF" train "${TINY[@]}" --eval-iters 5 --train-iters 0 --save "$W/v1" --quiet >/dev/null 2>&1
  timeout 300 "${MPI2[@]}" "$ZOFF" train "${TINY[@]}" --eval-iters 5 --train-iters 0 --save "$W/v2" >"$W/v2.txt" 2>&1
  v1=$(grep -o '"val_loss":[0-9.]*' "$W/v1/metrics.jsonl" | head -1); v2=$(grep -o '"val_loss":[0-9.]*' "$W/v2/metrics.jsonl" | head -1)
  check "2 ranks: validation loss over --eval-iters 5 == 1 rank's ($v1 vs $v2)" "[ -n '$v1' ] && [ '$v1' = '$v2' ]"
  check "2 ranks: the banner shows the global batch (4 x 1 x 2 ranks = 8 sequences per step)" \
    "grep -q 'batch 4 x 1 accumulation x 2 ranks = 8 sequences (128 tokens) per step' '$W/v2.txt'"
  timeout 300 "${MPI2[@]}" "$ZOFF" train "${TINY[@]}" --train-iters 2 --save "$W/v2" --load "$W/v2" --quiet >"$W/v2q.txt" 2>&1
  check "2 ranks, --quiet resume: exit 0 and no output" "[ \$? -eq 0 ] && [ ! -s '$W/v2q.txt' ]"
  timeout 300 "${MPI2[@]}" "$ZOFF" train "${TINY[@]}" --train-iters 2 --save "$W/v2" >"$W/v2r.txt" 2>&1
  check "2 ranks: a --save with checkpoints, no --load: refused (non-zero exit, message)" \
    "[ \$? -ne 0 ] && grep -q 'already holds checkpoints' '$W/v2r.txt'"
else
  echo "skip - 2-rank cases: zoff was built without MPI or mpirun is missing"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
