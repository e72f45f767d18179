#!/usr/bin/env bash
# zoff train's math against an independent float64 PyTorch training loop (tests/train_torch_ref.py),
# as a user moving from DeepSpeed/PyTorch would check it: a tiny GPT-2 (2 layers, width 32, 2 heads,
# seq 8, byte vocabulary) from one safetensors file (--init-from), one shard of exactly one step's
# windows (every step reads them all, so zoff's shuffled order does not matter), 6 steps of each
# DeepSpeed config below; every step's loss, lr and grad_norm (metrics.jsonl) and the final weights
# (zoff export) must be the reference's: gradient accumulation (the mean over micro-batches),
# clipping of the global norm before the update (clipped on some steps, not others), weight decay on
# the parameters docs/config.md names, Adam/AdamW (L2, bias correction off), Adagrad, Lion, the
# schedules' lr at each step (DeepSpeed's step counting; OneCycle's beta1 too), ZeRO stages 1-3,
# offload to host and NVMe, Twin-Flow ratio 0.5, speculation, gradient buckets, activation
# checkpointing, and zoff's delayed parameter update as docs/config.md describes it (one step behind
# after its warm-up): the fp32 runs to float32 precision; bf16 and fp16 runs close to it. Skipped (77) without /usr/bin/python3 with
# torch and numpy. Usage: cli_train_torch.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check, PY
if ! "$PY" -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "cli_train_torch: SKIPPED: $PY cannot import torch and numpy (scripts/deps.sh installs python3-torch)"
  exit 77
fi
W=$(mktemp -d /tmp/zoff-trtorch-XXXXXX)
trap 'rm -rf "$W"' EXIT
REF="$SRC/tests/train_torch_ref.py"
STEPS=6

"$PY" "$REF" setup "$W" --layers 2 --hidden 32 --heads 2 --seq 8 --windows 8
check "the reference wrote the initial weights and one step's token windows" \
  "[ -s '$W/init.safetensors' ] && [ \$(stat -c %s '$W/train.bin') -eq \$((1024 + 2 * (8 * 8 + 1))) ]"

ADAMW='"optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.5}}'
DECAY='"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2, '\
'"warmup_num_steps": 3, "warmup_type": "linear", "total_num_steps": 8}}'
BASE="\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2"
CLIP='"gradient_clipping": 1.8'
CPU='"offload_optimizer": {"device": "cpu"'
# name|tolerance class|config (after the batch)|extra zoff train flags
RUNS=$(cat <<EOF
stage0|fp32|$CLIP, $ADAMW, $DECAY|
noclip|fp32|"gradient_clipping": 0, $ADAMW, $DECAY|
adam_l2|fp32|$CLIP, "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "adam_w_mode": false, "weight_decay": 0.5}}, $DECAY|
no_bias_corr|fp32|$CLIP, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "bias_correction": false, "weight_decay": 0.1}}|
cosine|fp32|$CLIP, $ADAMW, "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_min_ratio": 0.1, "warmup_num_steps": 3, "total_num_steps": 8}}|
warmup_log|fp32|$CLIP, $ADAMW, "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3, "warmup_num_steps": 4}}|
lr_range|fp32|$CLIP, $ADAMW, "scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 1e-3, "lr_range_test_step_size": 2, "lr_range_test_step_rate": 2, "lr_range_test_staircase": true}}|
one_cycle|fp32|$CLIP, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2, "cycle_first_step_size": 2}}|
one_cycle_decay|fp32|$CLIP, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2, "cycle_first_step_size": 2, "cycle_second_step_size": 2, "decay_step_size": 1, "decay_lr_rate": 0.5, "decay_mom_rate": 0.01, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}}, "zero_optimization": {"stage": 2, $CPU, "ratio": 0.5}}|
stage1|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 1}|
stage2_cpu|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 2, $CPU}}|
stage3_cpu|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 3, $CPU}, "offload_param": {"device": "cpu"}}|
stage3_nvme|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "$W/nvme"}, "offload_param": {"device": "nvme", "nvme_path": "$W/nvme", "max_in_cpu": 0}}|--checkpoint-activations
twinflow|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 2, $CPU, "ratio": 0.5}}|
super_offload|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 1, $CPU, "ratio": 0.5, "super_offload": true}}|
buckets|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 2, "zoff_grad_buckets": "always", $CPU}}|
ckpt_act|fp32|$CLIP, $ADAMW, $DECAY|--checkpoint-activations
delayed_update|fp32|$CLIP, $ADAMW, "zero_optimization": {"stage": 2, $CPU}, "zoff_delayed_param_update": true, "zoff_delayed_param_update_warmup": 2}|
adagrad|fp32|$CLIP, "optimizer": {"type": "Adagrad", "params": {"lr": 3e-2, "weight_decay": 0.1}}, "zero_optimization": {"stage": 2, $CPU}}|
lion|fp32|$CLIP, "optimizer": {"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.5}}, "zero_optimization": {"stage": 2, $CPU}}|
bf16|16bit|$CLIP, $ADAMW, $DECAY, "bf16": {"enabled": true}|
bf16_states|16bit|$CLIP, $ADAMW, $DECAY, "bf16": {"enabled": true, "bf16_optimizer_states": true}, "zero_optimization": {"stage": 2, $CPU}}|
fp16|16bit|$CLIP, $ADAMW, $DECAY, "fp16": {"enabled": true, "initial_scale_power": 8}, "zero_optimization": {"stage": 2, $CPU, "ratio": 0.5}}|
EOF
)
specs=()
while IFS='|' read -r name tol cfg flags; do
  echo "{$BASE, $cfg}" > "$W/$name.json"
  # shellcheck disable=SC2086
  "$ZOFF" train --init-from "$W/init.safetensors" --num-attention-heads 2 --seq-length 8 --tokenizer byte \
    --data-path "$W/train.bin" --val-path "$W/val.bin" --eval-iters 0 --config "$W/$name.json" \
    --train-iters $STEPS --save "$W/$name" --device cpu --quiet $flags >"$W/$name.log" 2>&1
  rc=$?
  "$ZOFF" export --load "$W/$name" --output "$W/$name.safetensors" --quiet >>"$W/$name.log" 2>&1
  check "$name: trains $STEPS steps (exit $rc) and exports its weights" \
    "[ $rc -eq 0 ] && [ \$(grep -c '\"loss\"' '$W/$name/metrics.jsonl') -eq $STEPS ] && [ -s '$W/$name.safetensors' ]" \
    || cat "$W/$name.log"
  specs+=("$name:$W/$name.json:$W/$name:$W/$name.safetensors:$tol")
done <<< "$RUNS"

"$PY" "$REF" check "$W" "${specs[@]}" >"$W/ref.txt" 2>&1
rc=$?
cat "$W/ref.txt"
for s in "${specs[@]}"; do
  name=${s%%:*}
  check "$name: loss, lr and grad_norm of every step and the final weights are the PyTorch reference's" \
    "[ $rc -le 1 ] && grep -q '^$name: $STEPS steps' '$W/ref.txt' && ! grep -q '^FAIL: $name:' '$W/ref.txt'"
done
check "clipping is active on some steps of stage0 and not on others" "grep -q '^stage0: .*clipped: [yn]*yn' '$W/ref.txt'"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
