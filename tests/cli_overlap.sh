#!/usr/bin/env bash
# zoff train with the host step hidden behind the device (the pipelined exact step,
# the delayed update, speculation-then-validation): 6 steps train; with the exact step and
# with speculation 3 steps + resume to 6 gives the losses, learning rates and gradient
# norms of 6 straight steps bit for bit (the delayed update's resume: cli_resume_modes.sh);
# speculation == the exact step bit for bit, with a clip that nothing reaches (no rollback)
# and with one that rolls back every speculated step, and metrics.jsonl counts the rollbacks. Usage: cli_overlap.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-overlap-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check

byte_corpus "$SRC" "$W"
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4
      --tokenizer byte --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 2 --quiet)
cfg() { # name, clip, extra offload_optimizer keys, extra zero_optimization keys
    echo "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_clipping\": $2, \"optimizer\": {\"type\": \"AdamW\"},
      \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 4}},
      \"zero_optimization\": {\"stage\": 2, $4 \"offload_optimizer\": {\"device\": \"cpu\" $3}}}" > "$W/$1.json"
}
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/"tokens_per_s".*//'; }
cfg exact 10.0 "" ""   # the gradient norms here are 2-3.4: nothing clipped
cfg delayed 1.0 "" "\"zoff_delayed_param_update\": true, \"zoff_delayed_param_update_warmup\": 2,"
cfg spec 10.0 ", \"super_offload\": true" ""
cfg exact_clip 1e-6 "" ""
cfg spec_clip 1e-6 ", \"super_offload\": true" ""
"$ZOFF" train "${TINY[@]}" --config "$W/delayed.json" --train-iters 6 --save "$W/delayed" >"$W/delayed.txt" 2>&1
check "delayed: 6 steps" "[ -f '$W/delayed/step_00000006/COMPLETE' ] && [ \$(grep -c '\"loss\"' '$W/delayed/metrics.jsonl') -eq 6 ]"
for m in exact spec exact_clip spec_clip; do
    "$ZOFF" train "${TINY[@]}" --config "$W/$m.json" --train-iters 6 --save "$W/$m" >"$W/$m.txt" 2>&1
    "$ZOFF" train "${TINY[@]}" --config "$W/$m.json" --train-iters 3 --save "$W/${m}_r" >/dev/null 2>&1
    "$ZOFF" train "${TINY[@]}" --config "$W/$m.json" --train-iters 6 --save "$W/${m}_r" --load "$W/${m}_r" >/dev/null 2>&1
    check "$m: 6 steps, and 3 + resume to 6 bit-identical" \
      "[ -f '$W/$m/step_00000006/COMPLETE' ] && cmp -s <(losses '$W/$m') <(losses '$W/${m}_r')"
done
check "speculation == exact step bit for bit" "cmp -s <(losses '$W/exact') <(losses '$W/spec')"
check "speculation with a rolling-back clip == exact step bit for bit" \
  "cmp -s <(losses '$W/exact_clip') <(losses '$W/spec_clip')"
check "metrics.jsonl counts the rollbacks (all 6 steps speculated and clipped)" \
  "[ \"\$(grep '\"loss\"' '$W/spec_clip/metrics.jsonl' | tail -1 | grep -o '\"rollbacks\":[0-9]*')\" = '\"rollbacks\":6' ]"
check "no rollback when nothing is clipped (speculative run)" \
  "[ \"\$(grep -c '\"rollbacks\":0' '$W/spec/metrics.jsonl')\" = 6 ]"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
