#!/usr/bin/env bash
# Background saves through the engine's copy-on-update snapshot (zoff_engine_snapshot_*): the
# optimizer updates run while the writer writes, and the files still equal the synchronous
# writer's byte for byte. ZOFF_TEST_SNAPSHOT_HOLD=1 holds the writer until an update has staged
# every block (or spent the budget), whatever the timing. Usage: cli_ckpt_snapshot.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-snap-XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check; $PY
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
unset ZOFF_CKPT_FAULT ZOFF_IO_FAULT ZOFF_TEST_CKPT_WRITER_PAUSE_MS

byte_corpus "$SRC" "$W"
# $1: extra zero_optimization keys. Width 128: the state is several 1 MiB blocks per array
cfg() {
  cat <<EOF
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "bf16": {"enabled": true${2:-}},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "sub_group_size": 100000${1:-}}}
EOF
}
cfg "" > "$W/plain.json"
cfg ', "zoff_delayed_param_update": true, "zoff_delayed_param_update_warmup": 1' > "$W/dpu.json"
cfg "" ', "bf16_optimizer_states": true' > "$W/bf16s.json" # m and v in bf16: 2-byte blocks
T=(train --num-layers 2 --hidden-size 128 --num-attention-heads 2 --seq-length 16 --tokenizer byte
   --data-path "$W/corpus_train.bin" --eval-iters 0)
# bytes of the state the snapshot stages when it stages everything: the fp32 master (4 bytes for each element of
# exp_avg), exp_avg and exp_avg_sq as stored
state_bytes() {
  "$PY" "$SRC/scripts/zckpt.py" list "$1" | awk '$1 == "optimizer.exp_avg" {n = $5; gsub(/[][]/, "", n); s += 4 * n}
    $1 == "optimizer.exp_avg" || $1 == "optimizer.exp_avg_sq" {s += $(NF-3)} END {print s}'
}
staged_of() { grep "\"ckpt_step\":$2," "$1" | sed 's/.*"ckpt_staged":\([0-9]*\).*/\1/'; }

# 1. every block staged by the update (the writer held until then): == --sync-save, byte for byte
for mode in plain dpu bf16s; do
  C=(--config "$W/$mode.json" --train-iters 7 --save-interval 3)
  ZOFF_TEST_SNAPSHOT_HOLD=1 "$ZOFF" "${T[@]}" "${C[@]}" --save "$W/s-$mode" >"$W/s-$mode.log" 2>&1
  check "$mode: snapshot run exits 0" "[ $? -eq 0 ]"
  "$ZOFF" "${T[@]}" "${C[@]}" --sync-save --quiet --save "$W/y-$mode" >/dev/null 2>&1
  for st in 3 6; do
    f=$(printf 'step_%08d/rank_00000.zckpt' "$st")
    want=$(state_bytes "$W/y-$mode/$f"); got=$(staged_of "$W/s-$mode/metrics.jsonl" "$st")
    check "$mode: step $st's save staged the whole state ($got of $want bytes)" "[ -n '$got' ] && [ '$got' = '$want' ]"
    check "$mode: step $st by the snapshot == the synchronous writer's, byte for byte" "cmp -s '$W/s-$mode/$f' '$W/y-$mode/$f'"
  done
  check "$mode: the update did not wait for the writer" \
    "grep '\"ckpt_step\":3,' '$W/s-$mode/metrics.jsonl' | grep -q '\"ckpt_update_wait\":0.000000'"
  # the save starts just before the next step's update (its pipelined update then overlaps that step's forward),
  # except with the delayed update, whose job runs during the next forward: at the boundary
  in_step=true; [ "$mode" = dpu ] && in_step=false
  check "$mode: the save started $([ $in_step = true ] && echo 'inside the next step' || echo 'at the boundary')" \
    "grep '\"ckpt_step\":3,' '$W/s-$mode/metrics.jsonl' | grep -q '\"ckpt_start_in_step\":$in_step}'"
done
check "the log says what was staged" "grep -q 'staged for the updates' '$W/s-plain.log'"
# the arena is asked for after step 1 and faulted in on a background thread (test_engine checks its pages); a save
# says how much of it was ready, the first only (0..the arena: the thread stops where it got to when the save begins)
check "the first save says how much of its arena was faulted in ahead" \
  "grep '\"ckpt_step\":3,' '$W/s-plain/metrics.jsonl' | grep -q '\"ckpt_prefaulted\":[0-9]'"
check "the second save says none (the first's arena, faulted in then)" \
  "grep '\"ckpt_step\":6,' '$W/s-plain/metrics.jsonl' | grep -q '\"ckpt_prefaulted\":0,'"

# 1b. width 256, sub-groups at the layer groups: the staged copies of master, m and v go to the disk from the
# snapshot's slots in place (zoff_engine_snapshot_borrow, zoff_ckpt_append_external; each block's copy shifted so
# that it lies aligned as in the file: the master per tensor), nearly all of the state; the files are still the
# synchronous writer's, byte for byte, and the bytes written in place are reported
cat > "$W/wide.json" <<EOF
{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
EOF
WT=(train --num-layers 2 --hidden-size 256 --num-attention-heads 2 --seq-length 16 --tokenizer byte
    --data-path "$W/corpus_train.bin" --eval-iters 0 --config "$W/wide.json" --train-iters 4 --save-interval 2)
ZOFF_TEST_SNAPSHOT_HOLD=1 "$ZOFF" "${WT[@]}" --save "$W/s-wide" >"$W/s-wide.log" 2>&1
check "wide: snapshot run exits 0" "[ $? -eq 0 ]"
"$ZOFF" "${WT[@]}" --sync-save --quiet --save "$W/y-wide" >/dev/null 2>&1
f=$(printf 'step_%08d/rank_00000.zckpt' 2)
inplace=$(grep '"ckpt_step":2,' "$W/s-wide/metrics.jsonl" | sed 's/.*"ckpt_in_place":\([0-9]*\).*/\1/')
fsize=$(stat -c %s "$W/s-wide/$f" 2>/dev/null || echo 0)
check "wide: staged copies written in place ($inplace of the file's $fsize bytes: at least 3/4, whole 4 KiB)" \
  "[ -n '$inplace' ] && [ \$(( 4 * $inplace )) -ge \$(( 3 * $fsize )) ] && [ \$(( $inplace % 4096 )) -eq 0 ]"
check "wide: the log says how much went in place" "grep -q 'MiB written from there in place' '$W/s-wide.log'"
check "wide: step 2 by the snapshot == the synchronous writer's, byte for byte" "cmp -s '$W/s-wide/$f' '$W/y-wide/$f'"

# 2. a 1 MiB budget (one block): the update stages one block, then waits for the writer (said once)
"$ZOFF" "${T[@]}" --config "$W/plain.json" --train-iters 7 --save-interval 3 --save-snapshot-memory 1MiB \
  --save "$W/b" >"$W/b.log" 2>&1 </dev/null &
pid=$!
ZOFF_TEST_SNAPSHOT_HOLD=1 "$ZOFF" "${T[@]}" --config "$W/plain.json" --train-iters 7 --save-interval 3 \
  --save-snapshot-memory 1MiB --save "$W/bh" >"$W/bh.log" 2>&1
rc=$?
wait "$pid"; rc2=$?
check "1 MiB budget: both runs exit 0" "[ $rc -eq 0 ] && [ $rc2 -eq 0 ]"
check "it says once per save that the staging is spent" \
  "[ \$(grep -c 'checkpoint snapshot: its staging (1.00 MiB' '$W/bh.log') -eq 2 ]"
staged_and_waited() { # (the metrics and the log's lines when not, for the record)
  local l; l=$(grep '"ckpt_step":3,' "$W/bh/metrics.jsonl")
  echo "$l" | grep -q '"ckpt_staged":[1-9]' && ! echo "$l" | grep -q '"ckpt_update_wait":0.000000' && return 0
  echo "# step-3 save: $l"; grep -i 'snapshot\|background' "$W/bh.log"; return 1
}
check "it staged blocks (reusing its one slot) and the update waited for the writer" staged_and_waited
for st in 3 6; do
  f=$(printf 'step_%08d/rank_00000.zckpt' "$st")
  check "1 MiB budget: step $st == the synchronous writer's (held and unheld writer)" \
    "cmp -s '$W/bh/$f' '$W/y-plain/$f' && cmp -s '$W/b/$f' '$W/y-plain/$f'"
done

# 3. off: no snapshot, the first update after a save waits for all of it (the metrics say so)
"$ZOFF" "${T[@]}" --config "$W/plain.json" --train-iters 4 --save-interval 3 --save-snapshot-memory off --quiet \
  --save "$W/off" >/dev/null 2>&1
check "off: step 3 == the synchronous writer's, nothing staged, the save ended inside step 4" \
  "cmp -s '$W/off/step_00000003/rank_00000.zckpt' '$W/y-plain/step_00000003/rank_00000.zckpt' && grep '\"ckpt_step\":3,' '$W/off/metrics.jsonl' | grep -q '\"ckpt_steps_overlapped\":1,\"ckpt_seconds\":[0-9.]*,\"ckpt_start\":[0-9.]*,\"ckpt_staged\":0,'"
# 4. a stop (SIGTERM) that lands inside step 3, so the loop stops right after step 3's periodic save was left due
# to start in step 4: the final save starts it and joins it (a background save of step 3, then no second one);
# step 3 == the synchronous writer's, nothing of step 4. Steps of ~0.3-1 s (a wider model); the signal is sent
# 0.15 s after step 2's metrics line, up to 3 tries if it misses step 3 (scheduling on a loaded machine).
S=(train --num-layers 2 --hidden-size 384 --num-attention-heads 6 --seq-length 256 --tokenizer byte
   --data-path "$W/corpus_train.bin" --eval-iters 0 --config "$W/plain.json" --save-interval 3)
"$ZOFF" "${S[@]}" --train-iters 4 --sync-save --quiet --save "$W/sig-y" >/dev/null 2>&1
hit=0
for try in 1 2 3; do
  rm -rf "$W/sig"
  "$ZOFF" "${S[@]}" --train-iters 6 --save "$W/sig" >"$W/sig.log" 2>&1 </dev/null &
  pid=$!
  for _ in $(seq 1 3000); do grep -q '"step":2,' "$W/sig/metrics.jsonl" 2>/dev/null && break; sleep 0.02; done
  sleep 0.15
  kill -TERM "$pid" 2>/dev/null
  wait "$pid"; rc=$?
  if grep -q 'signal 15: saving a checkpoint at step 3' "$W/sig.log"; then hit=1; break; fi
  echo "# try $try: the signal missed step 3: $(grep 'signal 15' "$W/sig.log")"
done
f=step_00000003/rank_00000.zckpt
check "stop inside step 3: the run stopped after step 3 (exit 143)" "[ $hit -eq 1 ] && [ $rc -eq 143 ]"
check "the due save of step 3 ran in the background, started when the final save joined it" \
  "grep '\"ckpt_step\":3,' '$W/sig/metrics.jsonl' | grep -q '\"ckpt_start_in_step\":true}'"
check "... and the log says where it was saved and how to go on" \
  "grep -q 'zoff: step 3 saved under .*/sig; go on with --load .*/sig\$' '$W/sig.log'"
check "its checkpoint is complete and == the synchronous writer's; no step 4" \
  "[ -f '$W/sig/step_00000003/COMPLETE' ] && cmp -s '$W/sig/$f' '$W/sig-y/$f' && ! ls -d '$W/sig/step_00000004'* >/dev/null 2>&1"

"$ZOFF" "${T[@]}" --config "$W/plain.json" --train-iters 1 --save-snapshot-memory 12XB --save "$W/bad" >"$W/bad.log" 2>&1
check "a bad --save-snapshot-memory: exit 2 and a message naming it and the units a size takes" \
  "[ $? -eq 2 ] && grep -q 'save-snapshot-memory .12XB.: invalid size unit.*the units' '$W/bad.log'"

echo "# $pass passed, $fail failed"
[ "$fail" -eq 0 ]
