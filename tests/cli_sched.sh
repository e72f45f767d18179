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

# 2. OneCycle's cycle_first_stair_count / cycle_second_stair_count: DeepSpeed 0.19.8 holds the lr and
# the momentum flat over each of that many pieces of a half cycle. zoff accepted them as "stored,
# not used" and ran the continuous cycle. Each step's lr and beta1 (metrics.jsonl) against
# DeepSpeed's formula, written here (last_batch_iteration = the optimizer steps before it, - 1).
echo '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
       "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
         "cycle_first_step_size": 6, "cycle_second_step_size": 4, "cycle_first_stair_count": 3,
         "cycle_second_stair_count": 2, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}}}' > "$W/stairs.json"
"$ZOFF" train "${TINY[@]}" --config "$W/stairs.json" --train-iters 12 --no-checkpoint --save "$W/stairs" \
  >"$W/stairs.txt" 2>&1
check "OneCycle with stair counts trains 12 steps" "[ \$? -eq 0 ] && grep -q '\"step\":12,' '$W/stairs/metrics.jsonl'"
"$PY" - "$W/stairs/metrics.jsonl" >"$W/stairs.py.txt" 2>&1 <<'P'
import json, math, sys
first, second, n1, n2 = 6.0, 4.0, 3, 2
total = first + second
def scale(it):  # DeepSpeed 0.19.8 OneCycle._get_scale_factor at last_batch_iteration it
    bi = it + 1
    x = 1.0 + bi / total - math.floor(1 + bi / total)
    n = n1 if x <= first / total else n2
    pos = bi % total
    return math.floor((pos if pos <= first else total - pos) * n / (first if pos <= first else second)) / n
steps = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
assert len(steps) == 12, len(steps)
for s in steps:
    it = s["step"] - 2  # the lr of optimizer step k is set by the scheduler's (k-1)-th step()
    sc = 0.0 if it < 0 else scale(it)  # before any step(): cycle_min_lr, cycle_min_mom
    lr, mom = 1e-4 + (1e-3 - 1e-4) * sc, (0.95 - (0.95 - 0.85) * sc) if it >= 0 else 0.85
    assert abs(s["lr"] - lr) <= 1e-6 * lr and abs(s["beta1"] - mom) <= 1e-6, (s["step"], s["lr"], lr, s["beta1"], mom)
print("ok", [s["lr"] for s in steps])
P
check "... each step's lr and beta1 are DeepSpeed's stairs ($(tail -c 300 "$W/stairs.py.txt"))" \
  "grep -q '^ok' '$W/stairs.py.txt'"

# 3. optimizer.params.fp32_optimizer_states (DeepSpeed 0.19.8's CPU Adam, Adagrad and Lion) was an
# "unknown key" (exit 2, as if not DeepSpeed's); it has no effect in zoff (fp32 master weights):
# accepted, type-checked and said so.
echo '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3,
       "fp32_optimizer_states": false}}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}' \
  > "$W/fp32st.json"
"$ZOFF" train "${TINY[@]}" --config "$W/fp32st.json" --train-iters 1 --no-checkpoint --save "$W/fp32st" >"$W/fp32st.txt" 2>&1
check "optimizer.params.fp32_optimizer_states: trains, logged as accepted with no effect" \
  "[ \$? -eq 0 ] && grep -q 'accepted, no effect in zoff.*optimizer.params.fp32_optimizer_states' '$W/fp32st.txt'"
sed 's/"fp32_optimizer_states": false/"fp32_optimizer_states": "no"/' "$W/fp32st.json" > "$W/fp32bad.json"
"$ZOFF" train "${TINY[@]}" --config "$W/fp32bad.json" --train-iters 1 --save "$W/fp32bad" >"$W/fp32bad.txt" 2>&1
check "... a string there: exit 2 naming the key, nothing written" \
  "[ \$? -eq 2 ] && grep -q 'optimizer.params.fp32_optimizer_states: expected true or false' '$W/fp32bad.txt' && [ ! -e '$W/fp32bad' ]"

# 4. OneCycle's decay_mom_rate grows the momentum after the cycle: one that takes beta1 to 1 or more
# within --train-iters is refused before training, naming the key and the step (docs/config.md
# said "stops training at that step"); fewer steps train. beta1 of step 10: 0.9 * (1 + 0.5 * 5).
echo '{"train_micro_batch_size_per_gpu": 4, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4,
       "cycle_max_lr": 1e-3, "cycle_first_step_size": 2, "decay_step_size": 1, "decay_mom_rate": 0.5}}}' > "$W/mom.json"
"$ZOFF" train "${TINY[@]}" --config "$W/mom.json" --train-iters 10 --save "$W/mom" >"$W/mom.txt" 2>&1
check "decay_mom_rate 0.5 over 10 steps: exit 2 before training, beta1 3.15 at step 10 named, nothing written" \
  "[ \$? -eq 2 ] && grep -q 'scheduler.params.decay_mom_rate 0.5 takes .* to 3.15 by optimizer step 10 of --train-iters 10' '$W/mom.txt' && [ ! -e '$W/mom' ]"
"$ZOFF" train "${TINY[@]}" --config "$W/mom.json" --train-iters 4 --no-checkpoint --save "$W/mom4" >"$W/mom4.txt" 2>&1
check "... over 4 steps: trains (step 4: beta1 0.85, half way down the cycle)" "[ \$? -eq 0 ] && grep -q '\"step\":4,.*\"beta1\":0.850000' '$W/mom4/metrics.jsonl'"

# 5. torch_adam: DeepSpeed builds torch.optim.AdamW from the params given, so a weight_decay not
# given is torch's AdamW default (FusedAdam's and CPU Adam's is 0); zoff took 0. The default is
# read from torch when it imports (else torch's documented 1e-2): the run with torch_adam and no
# weight_decay must be the run with that weight_decay, step for step.
WD=$("$PY" -c 'import torch; print(torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).defaults["weight_decay"])' \
     2>/dev/null || echo 0.01)
for v in torch:'"torch_adam": true' wd:"\"weight_decay\": $WD" zero:'"weight_decay": 0'; do
  echo "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_clipping\": 0,
         \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-2, ${v#*:}}}}" > "$W/ta_${v%%:*}.json"
  "$ZOFF" train "${TINY[@]}" --config "$W/ta_${v%%:*}.json" --train-iters 4 --no-checkpoint --save "$W/ta_${v%%:*}" \
    >/dev/null 2>&1
  grep '"loss"' "$W/ta_${v%%:*}/metrics.jsonl" 2>/dev/null | grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' \
    > "$W/ta_${v%%:*}.txt"
done
check "torch_adam without weight_decay trains as weight_decay $WD (torch.optim.AdamW's default), not as 0" \
  "[ \$(wc -l < '$W/ta_torch.txt') -eq 4 ] && cmp -s '$W/ta_torch.txt' '$W/ta_wd.txt' && ! cmp -s '$W/ta_torch.txt' '$W/ta_zero.txt'"

# 6. A torch.optim.lr_scheduler class (DeepSpeed builds any by name when it is not one of its own)
# was "not allowed", as if the config were wrong: the refusal now says what it is and that zoff
# implements DeepSpeed's five. A missing type still says it is required.
echo '{"train_micro_batch_size_per_gpu": 4, "scheduler": {"type": "StepLR", "params": {"step_size": 10}}}' > "$W/steplr.json"
"$ZOFF" train "${TINY[@]}" --config "$W/steplr.json" --train-iters 1 --save "$W/steplr" >"$W/steplr.txt" 2>&1
check "scheduler.type StepLR: exit 2, named as a torch scheduler zoff does not implement, nothing written" \
  "[ \$? -eq 2 ] && grep -q 'scheduler.type: \"StepLR\" is not allowed; allowed: \"WarmupLR\".*torch.optim.lr_scheduler classes DeepSpeed also builds by name.*are not implemented in zoff' '$W/steplr.txt' && [ ! -e '$W/steplr' ]"
echo '{"train_micro_batch_size_per_gpu": 4, "scheduler": {"params": {"warmup_num_steps": 10}}}' > "$W/notype.json"
"$ZOFF" train "${TINY[@]}" --config "$W/notype.json" --train-iters 1 --save "$W/notype" >"$W/notype.txt" 2>&1
check "... no scheduler.type: exit 2, 'is required'" "[ \$? -eq 2 ] && grep -q 'scheduler.type: is required' '$W/notype.txt'"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
