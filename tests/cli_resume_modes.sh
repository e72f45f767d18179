#!/usr/bin/env bash
# Resume is bit-identical in every mode of the step (docs/reliability.md, "Runs, --save and
# --load"): for each configuration, a straight run of N steps; the same with a checkpoint after
# every step (--save-interval 1: the background writer with one rank and the state in host
# memory, else the synchronous one); and runs resumed from several of those checkpoints. The
# saves must not change the run, and every resumed run must give the straight run's metrics
# (loss, lr, grad_norm, loss_scale, skipped, rollbacks), final validation loss and final
# checkpoint, byte for byte. Modes: exact (optimizer on the device), pipelined (offload, one
# rank), delayed update (saves in and right after its warm-up; fp16 loss scaling with skipped
# steps; a final save then --load), speculative (super_offload, with rollbacks), Twin-Flow ratio,
# NVMe offload; OneCycle's lr and momentum (speculative and delayed); gradient accumulation 2 throughout; the delayed update on 2 ranks when MPI is
# there. Also: a delayed checkpoint of the previous format still loads, with its warning. The
# one-rank resumes load through 4 KiB pieces (ZOFF_TEST_CKPT_PIECE_BYTES): the load's pipeline.
# Usage: cli_resume_modes.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-resmodes-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check

byte_corpus "$SRC" "$W"
N=6
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4 --tokenizer byte
      --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 2 --quiet)
BF16='"bf16": {"enabled": true},'
cfg() { # name zero-json [precision-json [clip]]
  echo "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2, \"gradient_clipping\": ${4:-1.0},
         \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-2, \"weight_decay\": 0.1}},
         ${3:-$BF16} \"zero_optimization\": $2}" > "$W/$1.json"
}
CPU='"offload_optimizer": {"device": "cpu"}'
NV="\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$W/swap\", \"buffer_count\": 4}"
DPU='"zoff_delayed_param_update": true, "zoff_delayed_param_update_warmup": 2'
mkdir -p "$W/swap"
cfg exact '{"stage": 2}'
cfg pipelined "{\"stage\": 2, $CPU}"
cfg delayed "{\"stage\": 2, $CPU, $DPU}"
cfg delayed_fp16 "{\"stage\": 2, $CPU, \"zoff_delayed_param_update\": true, \"zoff_delayed_param_update_warmup\": 1}" \
  '"fp16": {"enabled": true, "initial_scale_power": 18, "hysteresis": 1},'
cfg speculative '{"stage": 2, "offload_optimizer": {"device": "cpu", "super_offload": true}}' '' 1.5
cfg twinflow '{"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}'
cfg twinflow_delayed "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}, $DPU}"
cfg nvme "{\"stage\": 1, $NV}"
# OneCycle: the lr and the momentum (the betas) change every step of the cycle, then stay
OC='"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2,
    "cycle_first_step_size": 2, "cycle_min_mom": 0.8, "cycle_max_mom": 0.95, "decay_step_size": 1, "decay_lr_rate": 0.5}},'
cfg onecycle_speculative '{"stage": 2, "offload_optimizer": {"device": "cpu", "super_offload": true}}' "$BF16 $OC" 1.5
cfg onecycle_delayed "{\"stage\": 2, $CPU, $DPU}" "$BF16 $OC"
cfg nvme_delayed "{\"stage\": 2, $NV, $DPU}"

# the per-step metrics that must not change, from step $2 on
fields() {
  grep '"loss"' "$1/metrics.jsonl" | sed 's/"tokens_per_s".*"loss_scale"/"loss_scale"/; s/,"ckpt_wait.*//' |
    awk -v k="$2" -F'[:,]' '$2 > k'
}
val_at() { grep "\"step\":$2,\"val_loss\"" "$1/metrics.jsonl" | tail -1; }
same_ckpt() { # dir1 dir2: every rank file of step N byte for byte
  local s="step_$(printf %08d $N)" f
  [ -f "$1/$s/COMPLETE" ] && [ -f "$2/$s/COMPLETE" ] || return 1
  for f in "$1/$s"/rank_*.zckpt; do cmp -s "$f" "$2/$s/$(basename "$f")" || return 1; done
}
# compare run dir $3 (resumed at step $2, or 0) with the straight run $1
same_run() { cmp -s <(fields "$1" "$2") <(fields "$3" "$2") && [ -n "$(fields "$3" "$2")" ] &&
             [ -n "$(val_at "$1" $N)" ] && [ "$(val_at "$1" $N)" = "$(val_at "$3" $N)" ] && same_ckpt "$1" "$3"; }

# run name launcher-words...: straight, saved every step, resumed from each of RESUME
run_mode() {
  local m="$1"; shift
  "$@" "$ZOFF" train "${TINY[@]}" --config "$W/$m.json" --train-iters $N --save "$W/$m.S" >"$W/$m.S.txt" 2>&1 ||
    { bad "$m: straight run failed"; tail -5 "$W/$m.S.txt"; return; }
  "$@" "$ZOFF" train "${TINY[@]}" --config "$W/$m.json" --train-iters $N --save "$W/$m.B" --save-interval 1 \
    --eval-interval 1 >"$W/$m.B.txt" 2>&1
  check "$m: checkpoints and validation after every step leave the run as it was (metrics, final checkpoint)" \
    "same_run '$W/$m.S' 0 '$W/$m.B' && [ -n \"\$(val_at '$W/$m.B' $((N - 1)))\" ]"
  local k pieces=() # one rank: resumed through 4 KiB load pieces (the load's pipeline, many pieces per array)
  [ $# -eq 0 ] && pieces=(env ZOFF_TEST_CKPT_PIECE_BYTES=4096)
  for k in $RESUME; do
    mkdir -p "$W/$m.R$k"
    cp -r "$W/$m.B/step_$(printf %08d $k)" "$W/$m.R$k/"
    "$@" "${pieces[@]}" "$ZOFF" train "${TINY[@]}" --config "$W/$m.json" --train-iters $N --save "$W/$m.R$k" --load "$W/$m.R$k" \
      >"$W/$m.R$k.txt" 2>&1
    check "$m: saved at step $k and resumed == straight (metrics, final validation loss, checkpoint bytes)" \
      "same_run '$W/$m.S' $k '$W/$m.R$k'"
  done
}

for m in exact pipelined speculative twinflow nvme; do RESUME="3" run_mode $m; done
# the delayed update: warm-up 2 (steps 1-2 undelayed): saved at its end, right after it, later
RESUME="2 3 4" run_mode delayed
RESUME="3" run_mode twinflow_delayed
RESUME="3" run_mode nvme_delayed
RESUME="2 3 5" run_mode onecycle_speculative
RESUME="3 5" run_mode onecycle_delayed
# fp16: steps 1 and 5 overflow and are skipped (warm-up 1 counts taken steps: step 2 is undelayed)
RESUME="1 2 3 4 5" run_mode delayed_fp16
check "delayed fp16: the straight run skipped steps" "grep -q '\"skipped\":true' '$W/delayed_fp16.S/metrics.jsonl'"
check "delayed fp16: and took some" "grep -q '\"skipped\":false' '$W/delayed_fp16.S/metrics.jsonl'"
check "speculative: the straight run rolled back (rollbacks counted across the resume)" \
  "grep -q '\"rollbacks\":[1-9]' '$W/speculative.S/metrics.jsonl'"

# validation between steps (--eval-interval, run B) reads the weights the next forward uses: those
# of the last update, or with the delayed update those of the one before (that of step k - 1 at
# step k); a run that ends there validates them after training
val_of() { val_at "$1" "$2" | sed 's/.*"val_loss"://'; }
for m in exact pipelined twinflow nvme delayed; do
  k=3 e=3 # validated at step k of run B; the reference run ends at step e
  [ $m = delayed ] && k=4 e=3
  "$ZOFF" train "${TINY[@]}" --config "$W/$m.json" --train-iters $e --save "$W/$m.V" --no-checkpoint >/dev/null 2>&1
  check "$m: validation at step $k between steps == after a run of $e steps" \
    "[ -n \"\$(val_of '$W/$m.V' $e)\" ] && [ \"\$(val_of '$W/$m.B' $k)\" = \"\$(val_of '$W/$m.V' $e)\" ]"
done

# what the delayed checkpoints hold: the device weights only while an update's weights are pending
meta() { grep -a -o '"weights_pending": [a-z]*' "$W/delayed.B/step_$(printf %08d $1)/rank_00000.zckpt"; }
check "delayed: no weights pending in the warm-up (step 2), pending after it (step 3)" \
  "[ \"\$(meta 2)\" = '\"weights_pending\": false' ] && [ \"\$(meta 3)\" = '\"weights_pending\": true' ]"
check "delayed: the checkpoints verify with the independent reader" "'$PY' '$SRC/scripts/zckpt.py' verify '$W/delayed.B' >/dev/null"
"$ZOFF" export --load "$W/delayed.B" --step 3 --output "$W/d3.safetensors" --quiet
check "delayed: zoff export of a checkpoint with weights pending (the master weights, not the entry)" \
  "[ \$? -eq 0 ] && [ -s '$W/d3.safetensors' ] && ! grep -a -q 'delayed_update' '$W/d3.safetensors'"

# a final save (synchronous), then --load: k steps + resume == straight
"$ZOFF" train "${TINY[@]}" --config "$W/delayed.json" --train-iters 4 --save "$W/delayed.F" >/dev/null 2>&1
"$ZOFF" train "${TINY[@]}" --config "$W/delayed.json" --train-iters $N --save "$W/delayed.F" --load "$W/delayed.F" >/dev/null 2>&1
check "delayed: 4 steps (final save) + --load to $N == straight" "same_run '$W/delayed.S' 4 '$W/delayed.F'"

# a checkpoint of the previous format (no weights_pending, no device weights) still loads, and says
# that this delayed resume is not bit-identical
mkdir -p "$W/old" && cp -r "$W/delayed.B/step_00000003" "$W/old/"
"$PY" "$SRC/scripts/zckpt.py" strip "$W/old/step_00000003/rank_00000.zckpt" --meta-key weights_pending \
  --entry delayed_update.device_weights >/dev/null
"$ZOFF" train "${TINY[@]/--quiet/--eval-iters=2}" --config "$W/delayed.json" --train-iters $N --save "$W/old" --load "$W/old" \
  >"$W/old.txt" 2>&1
check "previous-format delayed checkpoint: resumes to step $N" "[ \$? -eq 0 ] && [ -f '$W/old/step_$(printf %08d $N)/COMPLETE' ]"
check "... with a warning that this delayed resume is not bit-identical" \
  "grep -q 'did not store the delayed update.s device weights.*not bit-identical' '$W/old.txt'"

# 2 ranks (MPI): the delayed update saved and resumed on 2 ranks == 2 ranks straight
if command -v mpirun >/dev/null 2>&1 && "$ZOFF" version | grep -q '^mpi: built'; then
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  MPI2=(timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader
        --mca btl_vader_single_copy_mechanism none -x ZOFF_THREADS=1 -x OMP_NUM_THREADS=1
        -x OMP_WAIT_POLICY=passive -x ZOFF_COMM_TIMEOUT=120 -x ASAN_OPTIONS -np 2)
  cp "$W/delayed.json" "$W/delayed_2ranks.json"
  RESUME="3" run_mode delayed_2ranks "${MPI2[@]}"
  check "delayed, 2 ranks: both rank files in the final checkpoint" \
    "[ -f '$W/delayed_2ranks.R3/step_$(printf %08d $N)/rank_00001.zckpt' ]"
  # resharding a checkpoint with weights pending: 2 ranks -> 1, 1 -> 2
  mkdir -p "$W/rs21" "$W/rs12"
  cp -r "$W/delayed_2ranks.B/step_00000003" "$W/rs21/"; cp -r "$W/delayed.B/step_00000003" "$W/rs12/"
  "$ZOFF" train "${TINY[@]}" --config "$W/delayed.json" --train-iters $N --save "$W/rs21" --load "$W/rs21" >/dev/null 2>&1
  check "delayed, weights pending: a 2-rank checkpoint resumes on 1 rank" "[ \$? -eq 0 ] && [ -f '$W/rs21/step_$(printf %08d $N)/COMPLETE' ]"
  "${MPI2[@]}" "$ZOFF" train "${TINY[@]}" --config "$W/delayed.json" --train-iters $N --save "$W/rs12" --load "$W/rs12" >/dev/null 2>&1
  check "delayed, weights pending: a 1-rank checkpoint resumes on 2 ranks" "[ \$? -eq 0 ] && [ -f '$W/rs12/step_$(printf %08d $N)/COMPLETE' ]"
else
  echo "skip - 2-rank delayed resume: zoff was built without MPI or mpirun is missing"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
