#!/usr/bin/env bash
# Gradient buckets (zoff_placement_grad_buckets): zoff train with the device's bounded
# gradient buckets gives the losses, gradient norms and final fp32 master weights of the
# full device gradient buffer (zoff_grad_buckets false) bit for bit: offload stage 2,
# fp32 / bf16 / fp16 (dynamic loss scaling), clipping that applies, Twin-Flow ratio 0.5,
# the pipelined, delayed and speculative steps, accumulation 2 (full buffer: the rule
# keeps it), bf16 optimizer states, a ring of 2 buckets (reduce_bucket_size 1); and
# accumulation 3 with zoff_grad_buckets "always" (the sum on the host, back through the
# buckets each micro-batch) in the same modes, ring and flat; the optimizer state in NVMe swap
# files (bf16, Twin-Flow 0.5, delayed, accumulation 3 "always", with and without Twin-Flow). Then
# memory: a device budget that the full buffer does not fit trains with buckets, and
# Twin-Flow "auto" gives the freed bytes to the device. Usage: cli_buckets.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-buckets-XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$W"' EXIT; echo "work: $W"
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check

byte_corpus "$SRC" "$W"
TINY=(--num-layers 3 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4
      --tokenizer byte --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 1)
# name, dtype block, clip, accumulation, offload_optimizer extra, zero_optimization extra
cfg() {
    echo "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": $4, \"gradient_clipping\": $3,
      $2 \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003}},
      \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 1, $6
        \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": false $5}}}" > "$W/$1.json"
    sed 's/ *"zoff_grad_buckets": "always",//; s/"stage": 2,/"stage": 2, "zoff_grad_buckets": false,/' \
        "$W/$1.json" > "$W/$1_full.json"
}
BF='"bf16": {"enabled": true},'
FP16='"fp16": {"enabled": true, "initial_scale_power": 24, "loss_scale_window": 2},'
cfg f32 "" 1.0 1 "" ""
cfg bf16 "$BF" 1.0 1 "" ""
cfg fp16 "$FP16" 1.0 1 "" ""
cfg clip "$BF" 0.05 1 "" ""
cfg twin "$BF" 0.05 1 ", \"ratio\": 0.5" ""
cfg delayed "$BF" 1.0 1 "" "\"zoff_delayed_param_update\": true, \"zoff_delayed_param_update_warmup\": 2,"
cfg spec "$BF" 1.0 1 ", \"super_offload\": true" ""
cfg spec_clip "$BF" 0.05 1 ", \"super_offload\": true" ""
cfg accum "$BF" 0.05 2 "" ""
cfg bf16st '"bf16": {"enabled": true, "bf16_optimizer_states": true},' 0.05 1 "" ""
# accumulation through the buckets ("always"): the sum of 3 micro-batches kept on the host
AL='"zoff_grad_buckets": "always",'
cfg acc3 "$BF" 0.05 3 "" "$AL"
cfg acc3_f32 "" 1.0 3 "" "$AL"
cfg acc3_fp16 "$FP16" 1.0 3 "" "$AL"
cfg acc3_twin "$BF" 0.05 3 ", \"ratio\": 0.5" "$AL"
cfg acc3_delayed "$BF" 1.0 3 "" "$AL \"zoff_delayed_param_update\": true, \"zoff_delayed_param_update_warmup\": 2,"
cfg acc3_spec "$BF" 1.0 3 ", \"super_offload\": true" "$AL"
cfg acc3_bf16st '"bf16": {"enabled": true, "bf16_optimizer_states": true},' 0.05 3 "" "$AL"
cfg acc3_flat "$BF" 0.05 3 "" "$AL"
sed -i 's/"reduce_bucket_size": 1,/"reduce_bucket_size": 100000000,/' "$W/acc3_flat.json" "$W/acc3_flat_full.json"
# the optimizer state in NVMe swap files (sub-groups of 3000 elements, not cut at the layer groups)
nv() { # name: the cpu config NAME with offload to nvme
    for v in "$1" "${1}_full"; do
        mkdir -p "$W/swap_$v"
        sed "s|\"device\": \"cpu\"|\"device\": \"nvme\", \"nvme_path\": \"$W/swap_$v\"|; s|\"stage\": 2,|\"stage\": 2, \"sub_group_size\": 3000,|" \
            "$W/$v.json" > "$W/nvme_$v.json"
    done
}
for m in bf16 twin delayed acc3 acc3_twin; do nv "$m"; done
series() { grep '"loss"' "$1/metrics.jsonl" | grep -o '"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*'; }
for m in f32 bf16 fp16 clip twin delayed spec spec_clip accum bf16st \
         acc3 acc3_f32 acc3_fp16 acc3_twin acc3_delayed acc3_spec acc3_bf16st acc3_flat \
         nvme_bf16 nvme_twin nvme_delayed nvme_acc3 nvme_acc3_twin; do
    for v in "$m" "${m}_full"; do
        "$ZOFF" train "${TINY[@]}" --config "$W/$v.json" --train-iters 5 --save "$W/$v" >"$W/$v.txt" 2>&1
        "$ZOFF" export --load "$W/$v" --format fp32 --output "$W/$v.fp32" --quiet >>"$W/$v.txt" 2>&1
    done
    check "$m: buckets == full gradient buffer bit for bit (losses, norms, final masters)" \
      "[ -f '$W/$m/step_00000005/COMPLETE' ] && [ \$(series '$W/$m' | wc -l) -eq 5 ] && \
       cmp -s <(series '$W/$m') <(series '$W/${m}_full') && cmp -s '$W/$m.fp32' '$W/${m}_full.fp32'"
done
check "the clipped runs clip (norm above 0.05)" \
  "series '$W/clip' | head -1 | sed 's/.*grad_norm\":\\([^,]*\\).*/\\1/' | awk '{exit !(\$1 > 0.05)}'"
check "the fp16 run skips a step for overflow (initial scale 2^24)" "grep -q '\"skipped\":true' '$W/fp16/metrics.jsonl'"
check "buckets in use: the log says so" "grep -q 'device gradients: gradient buckets (2 x' '$W/bf16.txt'"
check "accumulation 2 keeps the full buffer (the log says so, and why: the setting that changes it)" \
  "grep -q 'device gradients: the full device gradient buffer (gradient_accumulation_steps > 1 .*zoff_grad_buckets .always. keeps the sum on the host' '$W/accum.txt'"
check "zoff_grad_buckets false keeps the full buffer (the log says so and why)" \
  "grep -q 'device gradients: the full device gradient buffer (zero_optimization.zoff_grad_buckets is false)' '$W/bf16_full.txt'"
check "\"always\": accumulation 3 through a ring of 2 buckets (the log says so)" \
  "grep -q 'device gradients: gradient buckets (2 x.*the accumulation.s sum on the host' '$W/acc3.txt'"
check "nvme: gradient buckets (the log says so)" "grep -q 'device gradients: gradient buckets (2 x' '$W/nvme_bf16.txt'"
check "\"always\", flat: a bucket per group (the log says so)" \
  "grep -q 'one per group.*the accumulation.s sum on the host' '$W/acc3_flat.txt'"

# memory: 4 x 512 (12.75M parameters, bf16, all optimizer state on the host). Measured
# (2026-11-26): 51.04 MiB on the device with the full gradient buffer, 39.01 MiB with a ring of
# 2 block-sized buckets (reduce_bucket_size 1). A 45 MiB budget: out of memory / fits.
BIG=(--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 16 --micro-batch-size 2
     --tokenizer byte --data-path "$W/corpus_train.bin" --eval-iters 0 --device cpu --train-iters 1)
cfg mem "$BF" 1.0 1 "" ""
"$ZOFF" train "${BIG[@]}" --config "$W/mem_full.json" --device-memory 45MiB --save "$W/mem_full" >"$W/mem_full.txt" 2>&1 && touch "$W/mem_full.ok"
check "full gradient buffer: out of device memory under a 45 MiB budget" \
  "grep -qi 'out of.*memory\|budget' '$W/mem_full.txt' && ! [ -f '$W/mem_full.ok' ]"
"$ZOFF" train "${BIG[@]}" --config "$W/mem.json" --device-memory 45MiB --save "$W/mem" >"$W/mem.txt" 2>&1 && touch "$W/mem.ok"
check "gradient buckets: the same job fits 45 MiB and trains" "[ -f '$W/mem.ok' ]"
cfg memacc "$BF" 1.0 2 "" "$AL"
for v in memacc memacc_full; do
    "$ZOFF" train "${BIG[@]}" --config "$W/$v.json" --device-memory 45MiB --save "$W/$v" >"$W/$v.txt" 2>&1 && touch "$W/$v.ok"
done
check "accumulation 2: the full buffer is out of memory under 45 MiB" "! [ -f '$W/memacc_full.ok' ]"
check "accumulation 2 with \"always\": fits 45 MiB and trains" "[ -f '$W/memacc.ok' ]"
# Twin-Flow "auto" gives the freed bytes to the device share of the optimizer
cfg auto "$BF" 1.0 1 ", \"ratio\": \"auto\"" ""
for v in auto auto_full; do
    "$ZOFF" train "${BIG[@]}" --config "$W/$v.json" --device-memory 64MiB --save "$W/$v" >"$W/$v.txt" 2>&1
done
hr() { grep -o 'host ratio >= [0-9.]*' "$1" | grep -o '[0-9.]*$'; }
check "auto: a lower host ratio with buckets ($(hr "$W/auto.txt") < $(hr "$W/auto_full.txt"))" \
  "awk -v a=\"\$(hr '$W/auto.txt')\" -v b=\"\$(hr '$W/auto_full.txt')\" 'BEGIN { exit !(a != \"\" && b != \"\" && a + 0 < b + 0) }'"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
