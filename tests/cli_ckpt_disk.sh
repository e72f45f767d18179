#!/usr/bin/env bash
# Checkpoint disk budgeting, as a user planning a long run meets it: zoff plan's checkpoint size
# against the files a real save writes (sizes from stat, not from zoff), zoff train's start-time
# warning when the saves of a run will not fit the --save disk (ZOFF_TEST_DISK_FREE pretends a free
# space: deterministic), with and without --keep-last. Usage: cli_ckpt_disk.sh ZOFF SRCDIR
set -u
ZOFF=$(readlink -f "$1"); SRC=$(readlink -f "$2")
. "$SRC/tests/cli_lib.sh"
W=$(mktemp -d /tmp/zoff-cli-ckptdisk-XXXXXX)
trap 'rm -rf "$W"' EXIT; [ -n "${KEEP:-}" ] && trap - EXIT
byte_corpus "$SRC" "$W"
cd "$W" || exit 1
SHAPE=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4)
TINY=("${SHAPE[@]}" --tokenizer byte --data-path corpus_train.bin --val-path corpus_val.bin --eval-iters 0 --quiet)
files() { stat -c %s "$@" | awk '{ s += $1 } END { print s + 0 }'; } # bytes of the files named

# 1. zoff plan's "checkpoint" is the bytes of the rank_NNNNN.zckpt files a save of that setting writes
#    (before: only the fp32 master + m + v data, 25% short here: no header, alignment, metadata,
#    index; and Lion's and Adagrad's checkpoints, which hold the engine's three arrays, counted as
#    two). Configs: the defaults, bf16 m and v (offload cpu, ratio 1), Lion (offload cpu), and the
#    delayed update (its device weights' entry: plan says "at most" and counts it).
printf '{"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true, "bf16_optimizer_states": true},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}' > bf.json
printf '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "Lion"},
 "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}}' > lion.json
printf '{"train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": true}, "zero_optimization": {"stage": 2,
 "offload_optimizer": {"device": "cpu"}, "zoff_delayed_param_update": true, "zoff_delayed_param_update_warmup": 1}}' > dpu.json
for c in defaults:0:none bf:2:cpu lion:1:cpu dpu:2:cpu; do
  IFS=: read -r name stage off <<< "$c"
  ca=(); [ "$name" != defaults ] && ca=(--config "$name.json")
  "$ZOFF" train "${TINY[@]}" "${ca[@]}" --train-iters 3 --save-interval 2 --save "r-$name" >/dev/null 2>&1 || bad "$name: trains"
  real=$(files r-$name/step_00000002/rank_*.zckpt)
  "$ZOFF" plan "${SHAPE[@]}" "${ca[@]}" --vocab-size 256 --device cpu --no-probe --json > "plan-$name.json" 2>/dev/null
  got=$("$PY" -c 'import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["stage"] == int(sys.argv[2]) and r["offload"] == sys.argv[3]
        and r["ratio"] in (None, 1)]
print(" ".join(sorted(set(str(r["breakdown"]["checkpoint"]) for r in rows))))' "plan-$name.json" "$stage" "$off")
  check "$name: zoff plan's checkpoint for stage $stage, offload $off is the $real bytes of the save's rank files (plan: $got)" \
    "[ $real -gt 0 ] && [ '$got' = '$real' ]"
done
"$ZOFF" plan "${SHAPE[@]}" --vocab-size 256 --device cpu --no-probe > plan.txt 2>&1
real=$(files r-defaults/step_00000002/rank_*.zckpt)
check "zoff plan's text says the checkpoint's bytes exactly, and that a save with --keep-last N is written beside N" \
  "grep -q \"checkpoint .* per save, all ranks ($real bytes exactly in its rank_NNNNN.zckpt files.*a save with --keep-last N is written beside N of them\" plan.txt"
"$ZOFF" plan "${SHAPE[@]}" --config dpu.json --vocab-size 256 --device cpu --no-probe > plan.txt 2>&1
check "with the delayed update zoff plan says 'at most' (the device weights' entry is in the saves after its warm-up)" \
  "grep -q 'checkpoint .* per save, all ranks (at most [0-9]* bytes in its rank' plan.txt"

# 1b. --json says which the checkpoint figure is (breakdown.checkpoint_bound; before: the text said
#     "at least" / "at most" but the JSON gave a bare number): exact with one rank, "at most" with
#     the delayed update, "at least" with several ranks in stages 1-3 (stage 0 stays exact)
bounds() { "$ZOFF" plan "${SHAPE[@]}" --vocab-size 256 --device cpu --no-probe --json "$@" 2>/dev/null | "$PY" -c 'import json, sys
print(",".join(sorted(set("%d:%s" % (r["stage"], r["breakdown"].get("checkpoint_bound")) for r in json.load(sys.stdin)["rows"]))))'; }
got=$(bounds)
check "plan --json, one rank: every row's checkpoint_bound is 'exact' (got: $got)" \
  "[ '$got' = '0:exact,1:exact,2:exact,3:exact' ]"
got=$(bounds --ranks 2)
check "plan --json, two ranks: 'at least' in stages 1-3, 'exact' in stage 0 (got: $got)" \
  "[ '$got' = '0:exact,1:at least,2:at least,3:at least' ]"
got=$(bounds --config dpu.json)
check "plan --json with the delayed update: the offload rows say 'at most', the others 'exact' (got: $got)" \
  "echo '$got' | grep -q '2:at most' && echo '$got' | grep -q '2:exact'"

# 2. zoff train refuses a --save disk without room for one checkpoint: the files of its last step
#    folder (rank files and COMPLETE), to the byte
one=$(files r-defaults/step_00000002/rank_*.zckpt r-defaults/step_00000002/COMPLETE) # step 2: same digits as step 3
ZOFF_TEST_DISK_FREE=$((one - 1)) "$ZOFF" train "${TINY[@]}" --train-iters 3 --save d1 >err.txt 2>&1
check "a disk with one byte less free than a checkpoint's $one bytes: refused, the bytes said, nothing written" \
  "[ \$? -eq 1 ] && grep -q \"a checkpoint of this run holds .* ($one bytes;\" err.txt && [ ! -e d1 ]"
ZOFF_TEST_DISK_FREE=$one "$ZOFF" train "${TINY[@]}" --train-iters 3 --save d1 >err.txt 2>&1
check "... exactly that much free: trains and saves, no warning (one save)" \
  "[ \$? -eq 0 ] && [ -f d1/step_00000003/COMPLETE ] && ! grep -q warning err.txt"

# 3. the start-time warning: 5 saves (every 2 steps to 9, and at the end) with room for 2 (before:
#    nothing until the third save failed, an hour in)
free=$((2 * one + one / 2))
ZOFF_TEST_DISK_FREE=$free "$ZOFF" train "${TINY[@]}" --train-iters 9 --save-interval 2 --save d2 >err.txt 2>&1
rc=$?
check "saves that do not fit: the run starts (exit 0) with one warning: 5 checkpoints, room for 2, --keep-last 1 or a larger disk" \
  "[ $rc -eq 0 ] && [ \$(grep -c warning err.txt) -eq 1 ] && grep -q 'zoff: warning: --save d2: this run writes 5 checkpoints of .* (all kept), .* at once, but the disk holding .* free: room for 2; keep fewer (--keep-last 1), or choose a --save on a larger disk' err.txt"
ZOFF_TEST_DISK_FREE=$free "$ZOFF" train "${TINY[@]}" --train-iters 9 --save-interval 2 --keep-last 1 --save d3 >err.txt 2>&1
check "... with --keep-last 1 (a save beside the newest: 2 at once): no warning" "[ \$? -eq 0 ] && ! grep -q warning err.txt"
ZOFF_TEST_DISK_FREE=$free "$ZOFF" train "${TINY[@]}" --train-iters 9 --save-interval 2 --keep-last 3 --save d4 >err.txt 2>&1
check "... with --keep-last 3 (4 at once): the warning names --keep-last 3 and suggests --keep-last 1" \
  "[ \$? -eq 0 ] && grep -q 'this run writes 5 checkpoints of .* (--keep-last 3: each written beside the 3 kept), .* room for 2; keep fewer (--keep-last 1)' err.txt"
ZOFF_TEST_DISK_FREE=$((5 * one)) "$ZOFF" train "${TINY[@]}" --train-iters 9 --save-interval 2 --save d5 >err.txt 2>&1
check "... room for all 5: no warning" "[ \$? -eq 0 ] && ! grep -q warning err.txt && [ \$(ls -d d5/step_* | wc -l) -eq 5 ]"
# a resume counts only the saves still to come: d5 at step 9 on to 13, every 2 steps: 10, 12, 13
ZOFF_TEST_DISK_FREE=$free "$ZOFF" train "${TINY[@]}" --train-iters 13 --save-interval 2 --load d5 >err.txt 2>&1
check "a resume from step 9 to 13: 3 saves to come, room for 2: warned about 3" \
  "[ \$? -eq 0 ] && grep -q 'this run writes 3 checkpoints of' err.txt"

# 4. zoff bench ckpt into a --dir without room for a round (the disk bound's file and the checkpoint,
#    at once): before, it failed in the checkpoint writer's words ("saving checkpoint step 1 under
#    D/zoff-bench-ckpt.X/ckpt ... earlier checkpoints in D/zoff-bench-ckpt.X/ckpt are untouched", a
#    folder the benchmark had made and removed); now it is refused before anything is written, in
#    the benchmark's words. The reference: the checkpoint the benchmark wrote (its --json
#    checkpoint_bytes, the files' sizes on disk) and the bound's file, whole 4 KiB blocks of it.
B=(--num-layers 2 --hidden-size 64 --num-attention-heads 2 --vocab-size 256 --max-position-embeddings 64 --rounds 1)
mkdir bdir
"$ZOFF" bench ckpt --dir bdir "${B[@]}" --json > bench.json 2>/dev/null || bad "bench ckpt runs"
S=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["checkpoint_bytes"])' bench.json)
need=$(( (S + 4095) / 4096 * 4096 + S ))
ZOFF_TEST_DISK_FREE=$((need - 1)) "$ZOFF" bench ckpt --dir bdir "${B[@]}" >/dev/null 2>err.txt
check "bench ckpt with one byte less free than a round's $need bytes: exit 1, said in the benchmark's words, nothing left" \
  "[ \$? -eq 1 ] && grep -q '^zoff bench ckpt: --dir bdir has .* free, but each round writes at least .* there at once: the checkpoint of this model (.*) and a file as large for the disk.s bound, then the safetensors export; free space in bdir, give another --dir, or measure a smaller model' err.txt \
   && ! grep -q 'earlier checkpoints\|saving checkpoint' err.txt && [ -z \"\$(ls -A bdir)\" ]"
ZOFF_TEST_DISK_FREE=$need "$ZOFF" bench ckpt --dir bdir "${B[@]}" >/dev/null 2>err.txt
check "... with exactly that much free: it runs" "[ \$? -eq 0 ]"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
