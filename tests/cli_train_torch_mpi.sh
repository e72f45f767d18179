#!/usr/bin/env bash
# Data-parallel zoff train (mpirun -np 2 and 3) against the independent float64 PyTorch training
# loop of tests/cli_train_torch.sh (tests/train_torch_ref.py), as a DeepSpeed user would check it:
# N ranks at micro-batch m with gradient accumulation k must take the step the reference computes
# for the global batch of N x m x k windows (DeepSpeed's train_batch_size). The shard holds exactly
# one step's windows: every step reads them all (the loader gives rank r windows [r m, (r+1) m) of
# each micro-batch's N m in the shuffled order, docs/multinode.md), so the step's mean loss and
# gradient do not depend on which rank reads which window. Every step's loss (the mean over ranks),
# lr and grad_norm (clipping: the global norm over all ranks' gradients) and the final weights
# (zoff export: rank 0's file, gathered from every rank's partition) must be the reference's, for
# ZeRO stages 0-3, with and without offload, Twin-Flow ratio 0.5, round-robin partitions, bf16 and
# fp16 loss scaling (an overflow on one rank only skips the step on all), validation, resume on another
# number of ranks. Ranks that disagreed (one rank skipping or clipping a step the others take, a
# replicated update applied differently) would train on different weights from the next step on,
# and the mean loss of the following steps would leave the reference's.
# Usage: cli_train_torch_mpi.sh ZOFF SRCDIR. Skips (exit 77) when zoff was built without MPI, mpirun
# is missing, or /usr/bin/python3 lacks torch and numpy.
set -u
ZOFF="$1"; SRC="$2"
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check, PY
if ! command -v mpirun >/dev/null 2>&1 || ! "$ZOFF" version | grep -q '^mpi: built'; then
  echo "cli_train_torch_mpi: SKIPPED: zoff was built without MPI or mpirun is missing"; exit 77
fi
if ! "$PY" -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "cli_train_torch_mpi: SKIPPED: $PY cannot import torch and numpy (scripts/deps.sh installs python3-torch)"
  exit 77
fi
W=$(mktemp -d /tmp/zoff-trtorch-mpi-XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$W"' EXIT
REF="$SRC/tests/train_torch_ref.py"
STEPS=6
# Open MPI as root in a container without a network, as tests/cli_mpi.sh launches it
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
MPIOPTS=(--allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader
         --mca btl_vader_single_copy_mechanism none -x ZOFF_THREADS=1 -x OMP_NUM_THREADS=1
         -x OMP_WAIT_POLICY=passive -x ZOFF_COMM_TIMEOUT=120 -x ASAN_OPTIONS)

# one step = N ranks x micro-batch 2 x accumulation 2 windows: 8 for 2 ranks, 12 for 3; validation:
# --eval-iters N + 1 batches of the micro-batch (not a multiple of N: some ranks run a batch again and do
# not count it, docs/multinode.md), val.bin exactly their windows, before training and every 2 steps
for n in 2 3; do
  mkdir -p "$W/n$n"
  "$PY" "$REF" setup "$W/n$n" --layers 2 --hidden 32 --heads 2 --seq 8 --windows $((n * 2 * 2)) \
    --val-windows $(((n + 1) * 2))
done
check "the reference wrote the initial weights and one step's token windows for 2 and 3 ranks" \
  "[ \$(stat -c %s '$W/n2/train.bin') -eq \$((1024 + 2 * (8 * 8 + 1))) ] && [ \$(stat -c %s '$W/n3/train.bin') -eq \$((1024 + 2 * (12 * 8 + 1))) ]"

ADAMW='"optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.5}}'
DECAY='"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2, '\
'"warmup_num_steps": 3, "warmup_type": "linear", "total_num_steps": 8}}'
BASE="\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2"
CLIP='"gradient_clipping": 1.8'
CPU='"offload_optimizer": {"device": "cpu"'
# fp16 at a loss scale that overflows on some steps (2^18 here: steps 3 and 4; the scale doubles every
# 2 good steps): the ranks skip together, the schedule does not advance (docs/config.md)
SKIP='"fp16": {"enabled": true, "initial_scale_power": 18, "loss_scale_window": 2}'
# name|ranks|tolerance class|config (after the batch)|extra zoff train flags
RUNS=$(cat <<EOF
stage0|2|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 0}|
noclip|2|fp32|"gradient_clipping": 0, $ADAMW, $DECAY, "zero_optimization": {"stage": 0}|
stage1|2|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 1}|
stage1_cpu|2|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 1, $CPU}}|
stage2|2|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 2}|
stage2_cpu_rr|2|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 2, "round_robin_gradients": true, $CPU}}|
stage3|2|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}|
stage3_cpu|2|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 3, $CPU}, "offload_param": {"device": "cpu"}}|
twinflow|2|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 2, $CPU, "ratio": 0.5}}|
buckets_twin|2|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 2, "zoff_grad_buckets": "always", $CPU, "ratio": 0.5}}|
bf16|2|16bit|$CLIP, $ADAMW, $DECAY, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2, $CPU}}|
fp16|2|16bit|$CLIP, $ADAMW, $DECAY, "fp16": {"enabled": true, "initial_scale_power": 8}, "zero_optimization": {"stage": 2, $CPU, "ratio": 0.5}}|
fp16_skip|2|16bit|$CLIP, $ADAMW, $DECAY, $SKIP, "zero_optimization": {"stage": 2, $CPU, "ratio": 0.5}}|
fp16_skip_s0|2|16bit|$CLIP, $ADAMW, $DECAY, $SKIP, "zero_optimization": {"stage": 0}|
adagrad_rr|2|fp32|$CLIP, "optimizer": {"type": "Adagrad", "params": {"lr": 3e-2, "weight_decay": 0.1}}, "zero_optimization": {"stage": 2, "round_robin_gradients": true, $CPU}}|
lion|2|fp32|$CLIP, "optimizer": {"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.5}}, "zero_optimization": {"stage": 1, $CPU}}|
one_cycle_twin|2|fp32|$CLIP, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2, "cycle_first_step_size": 2, "cycle_second_step_size": 2, "decay_step_size": 1, "decay_lr_rate": 0.5, "decay_mom_rate": 0.01, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}}, "zero_optimization": {"stage": 2, $CPU, "ratio": 0.5}}|
delayed|2|fp32|$CLIP, $ADAMW, "zero_optimization": {"stage": 2, $CPU}, "zoff_delayed_param_update": true, "zoff_delayed_param_update_warmup": 2}|
super_offload|2|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 1, $CPU, "ratio": 0.5, "super_offload": true}}|
stage3_nvme|2|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "$W/nvme"}, "offload_param": {"device": "nvme", "nvme_path": "$W/nvme", "max_in_cpu": 0}}|--checkpoint-activations
no_bias_corr|2|fp32|$CLIP, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "bias_correction": false, "weight_decay": 0.1}}, "zero_optimization": {"stage": 2}|
bf16_comm_fp32|2|16bit|$CLIP, $ADAMW, $DECAY, "bf16": {"enabled": true}, "communication_data_type": "fp32", "zero_optimization": {"stage": 1}|
bf16_states|2|16bit|$CLIP, $ADAMW, $DECAY, "bf16": {"enabled": true, "bf16_optimizer_states": true}, "zero_optimization": {"stage": 2, $CPU}}|
stage3_persist_3r|3|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 3, $CPU, "ratio": 0.5}}|
super_offload_3r|3|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 2, "round_robin_gradients": true, $CPU, "super_offload": true}}|
fp16_spec_s3|2|16bit|$CLIP, $ADAMW, $DECAY, $SKIP, "zero_optimization": {"stage": 3, $CPU, "super_offload": true}, "offload_param": {"device": "cpu"}}|
bf16_s3_3r|3|16bit|$CLIP, $ADAMW, $DECAY, "bf16": {"enabled": true}, "zero_optimization": {"stage": 3, "round_robin_gradients": true, $CPU}, "offload_param": {"device": "cpu"}}|
adagrad_s3_3r|3|fp32|$CLIP, "optimizer": {"type": "Adagrad", "params": {"lr": 3e-2, "weight_decay": 0.1}}, "zero_optimization": {"stage": 3, $CPU}, "offload_param": {"device": "cpu"}}|
adam_l2_rr_3r|3|fp32|$CLIP, "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "adam_w_mode": false, "weight_decay": 0.5}}, $DECAY, "zero_optimization": {"stage": 2, "round_robin_gradients": true}|
always_s1_3r|3|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 1, "zoff_grad_buckets": "always", "reduce_bucket_size": 1, $CPU, "ratio": 0.5}}|
tbs_only_3r|3|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 2, $CPU}}|
stage0_3r|3|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 0}|
fp16_skip_3r|3|16bit|$CLIP, $ADAMW, $DECAY, $SKIP, "zero_optimization": {"stage": 1, $CPU}}|
twinflow_3r|3|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 2, "round_robin_gradients": true, $CPU, "ratio": 0.5}}|
stage3_3r|3|fp32|$CLIP, $ADAMW, $DECAY, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, $CPU}, "offload_param": {"device": "cpu"}}|
EOF
)
specs=()
while IFS='|' read -r name n tol cfg flags; do
  D="$W/n$n"
  batch=$BASE
  [ "$name" = tbs_only_3r ] && batch='"train_batch_size": 12' # DeepSpeed derives micro-batch 4, accumulation 1
  echo "{$batch, $cfg}" > "$W/$name.json"
  # shellcheck disable=SC2086
  timeout 300 mpirun "${MPIOPTS[@]}" -np "$n" "$ZOFF" train --init-from "$D/init.safetensors" \
    --num-attention-heads 2 --seq-length 8 --tokenizer byte --data-path "$D/train.bin" --val-path "$D/val.bin" \
    --eval-iters $((n + 1)) --eval-interval 2 --config "$W/$name.json" --train-iters $STEPS --save "$W/$name" --device cpu --quiet $flags \
    </dev/null >"$W/$name.log" 2>&1
  rc=$?
  "$ZOFF" export --load "$W/$name" --output "$W/$name.safetensors" --quiet >>"$W/$name.log" 2>&1
  check "$name: $n ranks train $STEPS steps (exit $rc) and export their weights" \
    "[ $rc -eq 0 ] && [ \$(grep -c '\"loss\"' '$W/$name/metrics.jsonl') -eq $STEPS ] && [ -s '$W/$name.safetensors' ]" \
    || tail -20 "$W/$name.log"
  specs+=("$D:$name:$W/$name.json:$W/$name:$W/$name.safetensors:$tol:$n")
done <<< "$RUNS"

# fp16: an overflow on one rank only skips the step on every rank. A shard of 4 windows, S R R R (S: one
# token repeated, R: random tokens; 2 ranks x micro-batch 2 = one step reads all 4): whatever the
# shuffled order, every step one rank gets S and an R, the other two Rs. Probes on one rank at
# micro-batch 2 (zoff pre-divides each rank's loss gradient by N, so one rank at scale 2^16 is each of
# 2 ranks at 2^17, docs/multinode.md): S R overflows at 2^16, R R does not. So at 2^17 step 1
# overflows on one rank only; the metrics of both ranks must say skipped, and the run (the scale
# halves: hysteresis 1) must follow the reference that skips it.
H="$W/hot"; mkdir -p "$H"; cp "$W/n2/init.safetensors" "$W/n2/val.bin" "$H/"
"$PY" - "$H" "$SRC/tests" <<'PYEOF'
import sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from train_torch_ref import write_shard
T, d = 8, sys.argv[1]
R = [int(x) for x in np.random.default_rng(3).integers(0, 256, T)]
S = [200] * T
def stream(ws):  # windows of T + 1 tokens overlap by one: every window's last token is the next one's first
    return sum(ws, []) + [R[0]]
write_shard(d + "/train.bin", stream([S, R, R, R]))
write_shard(d + "/probe_sr.bin", stream([S, R]))
write_shard(d + "/probe_rr.bin", stream([R, R]))
PYEOF
HOT=(--init-from "$H/init.safetensors" --num-attention-heads 2 --seq-length 8 --tokenizer byte --val-path "$H/val.bin"
     --eval-iters 0 --device cpu --quiet)
echo '{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
       "fp16": {"enabled": true, "loss_scale": 65536}}' > "$H/probe.json"
for p in sr rr; do
  "$ZOFF" train "${HOT[@]}" --data-path "$H/probe_$p.bin" --config "$H/probe.json" --train-iters 1 --no-checkpoint \
    --save "$H/probe_$p" >"$H/probe_$p.log" 2>&1
done
check "probes on one rank at loss scale 2^16: micro-batch S R overflows, R R does not" \
  "grep -q '\"skipped\":true' '$H/probe_sr/metrics.jsonl' && grep -q '\"skipped\":false' '$H/probe_rr/metrics.jsonl'"
for st in 0 2; do
  name=fp16_one_rank_s$st
  echo "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 1, $CLIP, $ADAMW,
         \"fp16\": {\"enabled\": true, \"initial_scale_power\": 17, \"hysteresis\": 1, \"loss_scale_window\": 2},
         \"zero_optimization\": {\"stage\": $st}}" > "$W/$name.json"
  timeout 300 mpirun "${MPIOPTS[@]}" -np 2 "$ZOFF" train "${HOT[@]}" --data-path "$H/train.bin" --config "$W/$name.json" \
    --train-iters $STEPS --save "$W/$name" </dev/null >"$W/$name.log" 2>&1
  rc=$?
  "$ZOFF" export --load "$W/$name" --output "$W/$name.safetensors" --quiet >>"$W/$name.log" 2>&1
  check "$name: 2 ranks train $STEPS steps (exit $rc); step 1 (one rank's overflow) skipped on both ranks" \
    "[ $rc -eq 0 ] && grep '\"step\":1,' '$W/$name/metrics.jsonl' | grep -q '\"skipped\":true' && grep '\"step\":1,' '$W/$name/metrics_rank_00001.jsonl' | grep -q '\"skipped\":true'" \
    || tail -20 "$W/$name.log"
  specs+=("$H:$name:$W/$name.json:$W/$name:$W/$name.safetensors:16bit:2")
done

# The number of ranks changes on resume (docs/multinode.md, Checkpoints): 3 steps on 2 ranks at
# micro-batch 2, then to step 6 on 1 rank without --config (train_batch_size 8 kept: accumulation
# 2 -> 4); 3 steps on 1 rank at micro-batch 4, then on 2 ranks (accumulation 2 -> 1). Both are the
# reference's 6 steps of the global batch of 8 (its config: one rank at micro-batch 4).
D="$W/n2"; ONE="$W/resume_one.json"
sed 's/"train_micro_batch_size_per_gpu": 2/"train_micro_batch_size_per_gpu": 4/' "$W/stage2_cpu_rr.json" > "$ONE"
RS=(--data-path "$D/train.bin" --val-path "$D/val.bin" --eval-iters 0 --device cpu --quiet)
INIT=(--init-from "$D/init.safetensors" --num-attention-heads 2 --seq-length 8 --tokenizer byte)
for r in "2 1" "1 2"; do
  read -r from to <<< "$r"; name=resume_${from}to$to; cfg="$W/stage2_cpu_rr.json"; [ "$from" = 1 ] && cfg="$ONE"
  timeout 300 mpirun "${MPIOPTS[@]}" -np "$from" "$ZOFF" train "${INIT[@]}" "${RS[@]}" --config "$cfg" \
    --train-iters 3 --save "$W/$name" </dev/null >"$W/$name.log" 2>&1
  rc1=$?
  timeout 300 mpirun "${MPIOPTS[@]}" -np "$to" "$ZOFF" train "${RS[@]}" --train-iters $STEPS --save "$W/$name" \
    --load "$W/$name" </dev/null >>"$W/$name.log" 2>&1
  rc=$?
  "$ZOFF" export --load "$W/$name" --output "$W/$name.safetensors" --quiet >>"$W/$name.log" 2>&1
  check "$name: 3 steps on $from rank(s), resumed to $STEPS on $to (exit $rc1, $rc)" \
    "[ $rc1 -eq 0 ] && [ $rc -eq 0 ] && [ \$(grep -c '\"loss\"' '$W/$name/metrics.jsonl') -eq $STEPS ]" \
    || tail -20 "$W/$name.log"
  specs+=("$D:$name:$ONE:$W/$name:$W/$name.safetensors:fp32:1")
done

for D in "$W/n2" "$W/n3" "$H"; do
  sel=()
  for s in "${specs[@]}"; do [ "${s%%:*}" = "$D" ] && sel+=("${s#*:}"); done
  "$PY" "$REF" check "$D" "${sel[@]}" >>"$W/ref.txt" 2>&1
done
cat "$W/ref.txt"
for s in "${specs[@]}"; do
  s=${s#*:}; name=${s%%:*}
  check "$name: loss, lr and grad_norm of every step and the final weights are the PyTorch reference's for the global batch" \
    "grep -q '^$name: $STEPS steps' '$W/ref.txt' && ! grep -q '^FAIL: $name:' '$W/ref.txt'"
done
check "clipping (of the global norm) is active on some steps of stage0 and not on others" \
  "grep -q '^stage0: .*clipped: [yn]*yn' '$W/ref.txt'"
check "val_loss before training and after steps 2, 4 and 6 is the reference's (2 and 3 ranks, stages 0 and 3)" \
  "[ \$(grep -c '^\(stage0\|stage0_3r\|stage3\|stage3_3r\): .*val_loss [^ ]* (4)' '$W/ref.txt') -eq 4 ]"
for name in fp16_skip fp16_skip_s0 fp16_skip_3r fp16_spec_s3; do
  check "$name: fp16 overflow skips some steps (on every rank) and not others" \
    "grep -q '^$name: .*skipped: [yn]*y' '$W/ref.txt' && grep -q '^$name: .*skipped: [yn]*n' '$W/ref.txt'"
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
