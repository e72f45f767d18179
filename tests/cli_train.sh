#!/usr/bin/env bash
# CLI behaviour of zoff train / sample / tokenize: the files it writes, exit
# codes and messages on bad input, exact resume. Usage: cli_train.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-cli-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check

# a small byte-level corpus from the project's own sources
byte_corpus "$SRC" "$W"
check "tokenize writes train and val shards" "[ -s '$W/corpus_train.bin' ] && [ -s '$W/corpus_val.bin' ]"

TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4
      --tokenizer byte --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 2 --quiet)

# 1. a short run writes metrics and a complete checkpoint; sample reads it
"$ZOFF" train "${TINY[@]}" --train-iters 6 --save "$W/run" >"$W/out.txt" 2>&1
rc=$?
check "train exits 0" "[ $rc -eq 0 ]"
check "metrics.jsonl has 6 step lines with loss, lr, grad_norm, tokens_per_s, step_time" \
  "[ \$(grep -c '\"loss\".*\"lr\".*\"grad_norm\".*\"tokens_per_s\".*\"step_time\"' '$W/run/metrics.jsonl') -eq 6 ]"
check "checkpoint step_00000006 is complete" "[ -f '$W/run/step_00000006/COMPLETE' ]"
"$ZOFF" sample --load "$W/run" --max-new-tokens 20 --prompt "int " >"$W/sample.txt" 2>&1
check "sample generates text" "[ \$? -eq 0 ] && [ \$(wc -c < '$W/sample.txt') -gt 4 ]"
# no token asked: the prompt alone (the weights' upload once outlived their host copy here)
"$ZOFF" sample --load "$W/run" --max-new-tokens 0 --prompt "int " >"$W/sample0.txt" 2>&1
rc=$?
check "sample --max-new-tokens 0 prints the prompt, exit 0" "[ $rc -eq 0 ] && [ \"\$(cat '$W/sample0.txt')\" = 'int ' ]"
"$ZOFF" sample --load "$W/run" --max-new-tokens 12 --top-p 0.9 --top-k 0 --prompt "int " >"$W/sample_p.txt" 2>&1
check "sample --top-p 0.9 generates text" "[ \$? -eq 0 ] && [ \$(wc -c < '$W/sample_p.txt') -gt 4 ]"
"$ZOFF" sample --load "$W/run" --top-p 0 >"$W/sample_p0.txt" 2>&1
rc=$?
check "sample --top-p 0 is refused, exit 2, naming the flag" "[ $rc -eq 2 ] && grep -q -- '--top-p' '$W/sample_p0.txt'"

# 2. exact resume: 3 steps, then resume to 6 == 6 straight (losses bit-identical)
# (again with 4 KiB load pieces, ZOFF_TEST_CKPT_PIECE_BYTES: the load's pipeline over dozens of pieces per array)
# A schedule of its own, 200 steps: the built-in config's spans --train-iters, 3 here and 6 there;
# the resume (no --config) takes the checkpoint's.
echo '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.1}},
       "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 200, "warmup_num_steps": 2}},
       "gradient_clipping": 1.0}' > "$W/sched.json"
"$ZOFF" train "${TINY[@]}" --config "$W/sched.json" --train-iters 6 --save "$W/straight" >/dev/null 2>&1
"$ZOFF" train "${TINY[@]}" --config "$W/sched.json" --train-iters 3 --save "$W/resume" >/dev/null 2>&1
cp -r "$W/resume" "$W/resume4k"
"$ZOFF" train "${TINY[@]}" --train-iters 6 --save "$W/resume" --load "$W/resume" >/dev/null 2>&1
check "resume run exits 0 and ends at step 6" "[ -f '$W/resume/step_00000006/COMPLETE' ]"
ZOFF_TEST_CKPT_PIECE_BYTES=4096 "$ZOFF" train "${TINY[@]}" --train-iters 6 --save "$W/resume4k" --load "$W/resume4k" \
  >/dev/null 2>&1
grep '"loss"' "$W/straight/metrics.jsonl" | sed 's/"tokens_per_s".*//' > "$W/a.txt"
grep '"loss"' "$W/resume/metrics.jsonl" | sed 's/"tokens_per_s".*//' > "$W/b.txt"
grep '"loss"' "$W/resume4k/metrics.jsonl" | sed 's/"tokens_per_s".*//' > "$W/b4k.txt"
check "resumed losses, lr and grad norms are bit-identical to the straight run" "cmp -s '$W/a.txt' '$W/b.txt'"
check "... with 4 KiB load pieces too" "cmp -s '$W/a.txt' '$W/b4k.txt'"

# 3. bad config: unknown key -> exit 2, message names the key, nothing written
echo '{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 0, "bogus_key": 1}}' > "$W/bad.json"
"$ZOFF" train "${TINY[@]}" --config "$W/bad.json" --save "$W/badcfg" >"$W/err.txt" 2>&1
rc=$?
check "unknown config key exits 2" "[ $rc -eq 2 ]"
check "message names zero_optimization.bogus_key" "grep -q 'zero_optimization.bogus_key' '$W/err.txt'"
check "nothing written for a bad config" "[ ! -e '$W/badcfg' ]"
"$ZOFF" train "${TINY[@]}" --eval-iters 0 --eval-interval 2 --save "$W/evalint" >"$W/err.txt" 2>&1
rc=$?
# byte shards for a run whose tokenizer is gpt2 (the default): refused, both tokenizers named
"$ZOFF" train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4 \
  --data-path "$W/corpus_train.bin" --eval-iters 0 --train-iters 1 --save "$W/tokmix" >"$W/tokmix.txt" 2>&1
rc=$?
check "byte shards, gpt2 tokenizer: exit 2, names both tokenizers and --tokenizer, nothing written" \
  "[ $rc -eq 2 ] && grep -q 'corpus_train.bin was written by the byte tokenizer (256 tokens), not this model.s gpt2 (50257).*--tokenizer' '$W/tokmix.txt' && [ ! -e '$W/tokmix' ]"
# OneCycle's momentum after the cycle, grown past 1 by decay_mom_rate before the last step: refused at start
echo '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 1,
  "decay_step_size": 1, "decay_mom_rate": 0.05}}, "zero_optimization": {"stage": 0}}' > "$W/mom.json"
"$ZOFF" train "${TINY[@]}" --config "$W/mom.json" --train-iters 6 --save "$W/mom" >"$W/mom.txt" 2>&1
rc=$?
check "OneCycle whose momentum reaches 1 by step 6 (0.9 x 1.15): exit 2, names decay_mom_rate and the step, nothing written" \
  "[ $rc -eq 2 ] && grep -q 'decay_mom_rate 0.05 takes .* to 1.035 by optimizer step 6' '$W/mom.txt' && [ ! -e '$W/mom' ]"
"$ZOFF" train "${TINY[@]}" --config "$W/mom.json" --train-iters 4 --save "$W/mom3" >"$W/mom.txt" 2>&1
check "... and 4 steps of it run (momentum 0.8 at the start and the lr's peak, 0.9 at the cycle's end, then 0.945), beta1 in the metrics" \
  "[ \$? -eq 0 ] && [ \"\$(grep -o '\"beta1\":[0-9.]*' '$W/mom3/metrics.jsonl' | tr '\n' ' ')\" = '\"beta1\":0.800000 \"beta1\":0.800000 \"beta1\":0.900000 \"beta1\":0.945000 ' ]"
check "--eval-interval with --eval-iters 0: exit 2, naming both, nothing written" \
  "[ $rc -eq 2 ] && grep -q -- '--eval-interval.*--eval-iters is 0' '$W/err.txt' && [ ! -e '$W/evalint' ]"

# 4. batch contradiction
echo '{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}' > "$W/contra.json"
"$ZOFF" train "${TINY[@]}" --config "$W/contra.json" --save "$W/contra" >"$W/err.txt" 2>&1
check "batch contradiction exits 2 with the key named" "[ \$? -eq 2 ] && grep -q 'train_batch_size' '$W/err.txt'"

# 5. missing / truncated data
"$ZOFF" train "${TINY[@]/$W\/corpus_train.bin/$W/nope.bin}" --save "$W/nodata" >"$W/err.txt" 2>&1
check "missing data file: exit 2 naming the file" "[ \$? -eq 2 ] && grep -q 'nope.bin' '$W/err.txt'"
head -c 2000 "$W/corpus_train.bin" > "$W/trunc.bin"
"$ZOFF" train "${TINY[@]/$W\/corpus_train.bin/$W/trunc.bin}" --save "$W/trunc" >"$W/err.txt" 2>&1
check "truncated shard: exit 2 naming the file" "[ \$? -eq 2 ] && grep -q 'trunc.bin' '$W/err.txt'"
check "nothing written for bad data" "[ ! -e '$W/nodata' ] && [ ! -e '$W/trunc' ]"

# 6. unwritable output directory
mkdir -p "$W/ro" && touch "$W/ro/file"
"$ZOFF" train "${TINY[@]}" --train-iters 1 --save "$W/ro/file/sub" >"$W/err.txt" 2>&1
check "unwritable --save: exit 2 naming the directory" "[ \$? -eq 2 ] && grep -q 'ro/file' '$W/err.txt'"

# 7. corrupt checkpoint: refused, nothing overwritten
cp -r "$W/run" "$W/corrupt"
f="$W/corrupt/step_00000006/rank_00000.zckpt"
printf '\xff\xff\xff\xff' | dd of="$f" bs=1 seek=5000 conv=notrunc 2>/dev/null
sum_before=$(md5sum "$f" | cut -d' ' -f1)
"$ZOFF" train "${TINY[@]}" --train-iters 8 --save "$W/corrupt" --load "$W/corrupt" >"$W/err.txt" 2>&1
rc=$?
check "corrupt checkpoint: non-zero exit with a checksum message" "[ $rc -ne 0 ] && grep -qi 'checksum\\|corrupt' '$W/err.txt'"
check "corrupt checkpoint left as it was, no newer step written" \
  "[ \"\$(md5sum '$f' | cut -d' ' -f1)\" = '$sum_before' ] && [ ! -e '$W/corrupt/step_00000008' ]"

# 7b. a corrupt byte in the optimizer state, which a load reads and checks in one pass (the CRC compared at the
# entry's end): the first byte of exp_avg, the last of exp_avg_sq (the last thing read): refused alike; with 4 KiB
# load pieces (found on the load's helper thread, its message carried over) a byte in the middle of exp_avg and of
# the token embedding
for spot in "optimizer.exp_avg 0 0" "optimizer.exp_avg_sq -1 0" "optimizer.exp_avg 5000 4096" "wte.weight 5000 4096"; do
  rm -rf "$W/corrupt2"; cp -r "$W/run" "$W/corrupt2"
  f="$W/corrupt2/step_00000006/rank_00000.zckpt"
  read -r ent at pb <<< "$spot"
  "$PY" -c "
import sys; sys.path.insert(0, '$SRC/scripts'); import zckpt
e = [x for x in zckpt.read_file('$f')[1] if x['name'] == '$ent'][0]
at = e['offset'] + (e['bytes'] - 1 if $at < 0 else $at)
with open('$f', 'r+b') as h:
    h.seek(at); b = h.read(1); h.seek(at); h.write(bytes([b[0] ^ 0x5a]))
"
  ZOFF_TEST_CKPT_PIECE_BYTES=$pb "$ZOFF" train "${TINY[@]}" --train-iters 8 --save "$W/corrupt2" --load "$W/corrupt2" \
    >"$W/err.txt" 2>&1
  rc=$?
  check "corrupt byte in $ent (at $at, load pieces of $pb bytes, 0: the default): non-zero exit naming the entry's checksum" \
    "[ $rc -ne 0 ] && grep -q \"checksum mismatch in entry '$ent'\" '$W/err.txt' && [ ! -e '$W/corrupt2/step_00000008' ]"
done

# 8. mismatched checkpoint: flags that contradict the saved model
"$ZOFF" train "${TINY[@]/--hidden-size/--hidden-size}" --hidden-size 64 --train-iters 8 --save "$W/run2" --load "$W/run" >"$W/err.txt" 2>&1
check "mismatched checkpoint shape: exit 2 with an explanation" "[ \$? -eq 2 ] && grep -q 'width 32' '$W/err.txt'"

# 9. unknown option
"$ZOFF" train --no-such-flag >"$W/err.txt" 2>&1
check "unknown option exits 2 naming it" "[ \$? -eq 2 ] && grep -q 'no-such-flag' '$W/err.txt'"

# 10. NVMe offload: 3 steps + resume to 6 through the swap file == cpu offload, 6 straight
mkdir -p "$W/nvme"
nvcfg() { echo "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 2, \"sub_group_size\": 4000, \"offload_optimizer\": {\"device\": \"$1\", \"nvme_path\": \"$W/nvme\", \"buffer_count\": 4, \"pipeline_read\": true, \"pipeline_write\": true}}}"; }
nvcfg cpu > "$W/ocpu.json"; nvcfg nvme > "$W/onvme.json"
"$ZOFF" train "${TINY[@]}" --config "$W/ocpu.json" --train-iters 6 --save "$W/ocpu" >/dev/null 2>&1
"$ZOFF" train "${TINY[@]}" --config "$W/onvme.json" --train-iters 3 --save "$W/onvme" >/dev/null 2>&1
"$ZOFF" train "${TINY[@]}" --config "$W/onvme.json" --train-iters 6 --save "$W/onvme" --load "$W/onvme" >"$W/nvme.txt" 2>&1
check "nvme offload: resumed run ends at step 6 and leaves no swap file" \
  "[ -f '$W/onvme/step_00000006/COMPLETE' ] && [ -z \"\$(ls -A '$W/nvme')\" ]"
grep '"loss"' "$W/ocpu/metrics.jsonl" | sed 's/"tokens_per_s".*//' > "$W/c.txt"
grep '"loss"' "$W/onvme/metrics.jsonl" | sed 's/"tokens_per_s".*//' > "$W/n.txt"
check "nvme offload (3 + resume to 6): losses, lr and grad norms bit-identical to cpu offload" \
  "[ -s '$W/c.txt' ] && cmp -s '$W/c.txt' '$W/n.txt'"

# 11. the --save disk must hold one checkpoint, or the run is refused before it starts (not at its
# first save): the reference is the size of the files (stat) of a real checkpoint of the same run,
# its rank file and COMPLETE marker; fp32 states, and bf16 m and v (offload cpu). zoff plan prints
# the rank files' bytes for that setting ("checkpoint" in --json). (Before: the entries' data only,
# without the file's header, alignment, metadata blobs and index; tests/cli_ckpt_disk.sh.)
for st in false true; do
  echo "{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": $st},
         \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}}" > "$W/disk-$st.json"
  what="bf16_optimizer_states $st"
  ca=(--config "$W/disk-$st.json")
  rm -rf "$W/disk"
  "$ZOFF" train "${TINY[@]}" "${ca[@]}" --train-iters 1 --save "$W/disk" >/dev/null 2>&1
  rank=$(stat -c %s "$W/disk/step_00000001/rank_00000.zckpt")
  data=$((rank + $(stat -c %s "$W/disk/step_00000001/COMPLETE")))
  rm -rf "$W/disk"
  ZOFF_TEST_DISK_FREE=$((data - 1)) "$ZOFF" train "${TINY[@]}" "${ca[@]}" --train-iters 1 --save "$W/disk" >"$W/err.txt" 2>&1
  check "$what: a disk with one byte less free than a checkpoint's $data bytes: refused, naming --save and --no-checkpoint, nothing written" \
    "[ \$? -ne 0 ] && [ $data -gt 0 ] && grep -q -- '--save $W/disk' '$W/err.txt' && grep -q -- '--no-checkpoint' '$W/err.txt' && [ ! -e '$W/disk' ]"
  grep -m1 'checkpoint of this run' "$W/err.txt"
  ZOFF_TEST_DISK_FREE=$data "$ZOFF" train "${TINY[@]}" "${ca[@]}" --train-iters 1 --save "$W/disk" >"$W/err.txt" 2>&1
  check "$what: ... with exactly that much free: trains and saves" "[ \$? -eq 0 ] && [ -f '$W/disk/step_00000001/COMPLETE' ]"
  rm -rf "$W/disk"
  "$ZOFF" plan "${ca[@]}" --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4 \
    --vocab-size 256 --device cpu --no-probe --json > "$W/plan.json" 2>"$W/plan.err"
  check "$what: zoff plan's checkpoint for stage 2, offload cpu, ratio 1 is the rank file's $rank bytes" \
    "'$PY' -c 'import json, sys
rows = [r for r in json.load(open(sys.argv[1]))[\"rows\"] if r[\"stage\"] == 2 and r[\"offload\"] == \"cpu\"
        and r[\"ratio\"] == 1 and r[\"bf16_optimizer_states\"] == (sys.argv[2] == \"true\")]
print(\"plan rows:\", [r[\"breakdown\"][\"checkpoint\"] for r in rows])
sys.exit(not rows or any(r[\"breakdown\"][\"checkpoint\"] != int(sys.argv[3]) for r in rows))' '$W/plan.json' $st $rank"
done
ZOFF_TEST_DISK_FREE=1 "$ZOFF" train "${TINY[@]}" --train-iters 1 --no-checkpoint --save "$W/disk" >/dev/null 2>&1
check "--no-checkpoint: no disk needed" "[ \$? -eq 0 ]"

# bf16 with gradient accumulation at ZeRO stage 0: DeepSpeed's default (data_types.grad_accum_dtype null)
# sums the micro-batches' gradients in fp32 there (its BF16_Optimizer), zoff in bf16: said at start,
# not silently (in stages 1-3 DeepSpeed sums in bf16 too; an explicit "bf16" is the user's choice)
LOUD=(); for a in "${TINY[@]}"; do [ "$a" = --quiet ] || LOUD+=("$a"); done
i=0
for extra in '' ', "data_types": {"grad_accum_dtype": "bf16"}' ', "zero_optimization": {"stage": 1}' ', "data_types": {"grad_accum_dtype": null}'; do
  for ga in 2 1; do
    i=$((i + 1))
    echo "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": $ga, \"bf16\": {\"enabled\": true}$extra}" > "$W/acc$i.json"
    "$ZOFF" train "${LOUD[@]}" --config "$W/acc$i.json" --train-iters 1 --no-checkpoint --save "$W/acc$i" >"$W/acc$i.txt" 2>&1
    rc=$?
    want=0; { [ -z "$extra" ] || [ "${extra#*null}" != "$extra" ]; } && [ "$ga" = 2 ] && want=1
    got=$(grep -c "note: bf16 at zero_optimization.stage 0 with gradient_accumulation_steps 2: zoff sums the micro-batches' gradients in bf16, .*where DeepSpeed (data_types.grad_accum_dtype null) sums them in fp32" "$W/acc$i.txt")
    check "bf16, accumulation $ga$extra: exit 0 (got $rc), the note on fp32 accumulation $want time(s) (got $got)" \
      "[ $rc -eq 0 ] && [ $got -eq $want ]"
  done
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
