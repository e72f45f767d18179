#!/usr/bin/env bash
# Learning-rate schedules and optimizer settings through zoff train, as a DeepSpeed user gives
# them (docs/config.md, "optimizer" and "scheduler"): settings zoff cannot honour are refused by
# name (exit 2, nothing written), and what it accepts does what DeepSpeed does.
# Usage: cli_sched.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-sched-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check

byte_corpus "$SRC" "$W"
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --tokenizer byte
      --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 0)

# 1. Lion and Adagrad run on the host optimizer only; the device optimizer is fused Adam/AdamW.
# A Twin-Flow ratio below 1 (or "auto", which puts what fits on the device) gave the device's
# sub-groups Adam's update instead (exit 0, another optimizer for part of the model): refused now,
# naming the ratio and the optimizer, with nothing written; ratio 1 trains.
for opt in Lion Adagrad; do
  for ratio in 0.5 0 '"auto"'; do
    out="$W/tf_${opt}_${ratio//\"/}"
    echo "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"$opt\", \"params\": {\"lr\": 1e-3}},
           \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": $ratio}}}" \
      > "$W/tf.json"
    "$ZOFF" train "${TINY[@]}" --config "$W/tf.json" --train-iters 2 --save "$out" >"$W/tf.txt" 2>&1
    rc=$?
    check "$opt with offload_optimizer.ratio $ratio: exit 2 (got $rc), naming the ratio and $opt, nothing written" \
      "[ $rc -eq 2 ] && grep -q 'offload_optimizer.ratio .*device optimizer, which is Adam/AdamW only, but optimizer.type $opt' '$W/tf.txt' && [ ! -e '$out' ]"
  done
  sed 's/"ratio": "auto"/"ratio": 1/' "$W/tf.json" > "$W/tf1.json"
  "$ZOFF" train "${TINY[@]}" --config "$W/tf1.json" --train-iters 2 --no-checkpoint --save "$W/tf1_$opt" >"$W/tf1.txt" 2>&1
  check "$opt with offload_optimizer.ratio 1: trains" "[ \$? -eq 0 ] && grep -q '\"step\":2,' '$W/tf1_$opt/metrics.jsonl'"
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
