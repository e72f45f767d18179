#!/usr/bin/env bash
# What a new user hits (issue 21 items 1, 2, 5 and parts of 6), end to end through the zoff
# command; every check failed before its fix:
#   - what `zoff plan --write-config` recommends (stage 2, optimizer on NVMe) `zoff train` runs
#     on the same machine figures (ZOFF_TEST_MEM_AVAILABLE = plan's --host-memory); the train
#     command it prints keeps plan's --micro-batch-size and --max-position-embeddings;
#   - a SIGKILLed NVMe run leaves no swap file, and a new run after it neither;
#   - `zoff plan` on the CPU backend does not apply `ulimit -l` (pinned is ordinary memory);
#   - "nothing fits" advises nothing that is already set;
#   - bare `zoff` prints the usage and exits 2, writing nothing;
#   - one exit code for every config error (2), a missing or directory --config included;
#   - an empty or malformed config names the position once;
#   - --quiet prints nothing on success (the NVMe swapper's note included);
#   - -q is --quiet in every command that takes --quiet (train, tokenize, export, eval, sample, plan,
#     bench step|adam|nvme|ckpt), their results on stdout kept;
#   - a wrong input or output path exits 2, as a wrong config does;
#   - a resumed run already at --train-iters says there is nothing to train;
#   - data smaller than a batch names the data (which split of --data-path, or --val-path) and,
#     for validation, --eval-iters 0;
#   - the summary of a one-step run says "1 step";
#   - a device out of memory names --checkpoint-activations and zoff plan;
#   - a checkpoint step that is not there: the error lists the complete ones;
#   - --init-from a folder reads its model.safetensors, and a checkpoint folder says how to use it;
#     --load of a model folder names --init-from;
#   - --init-from without shape flags takes the file's model (heads: metadata or config.json);
#   - one run at a time trains into a --save folder (a lock the kernel drops at any exit);
#   - zoff sample reads exported weights (a safetensors file or model folder) as well as checkpoints;
#   - zoff tokenize reads a directory or a quoted glob;
#   - a mistyped option names the option it most likely meant, in every command, and a
#     mistyped command (or benchmark) the command; zoff help CMD is zoff CMD --help;
#   - a flag of DeepSpeed's launchers, Megatron-DeepSpeed or the HF Trainer says where that
#     setting is in zoff (--lr: optimizer.params.lr in the config, --max-steps: --train-iters);
#   - a mistyped ZOFF_CKPT_IO is refused before training, not at the first save;
#   - an invalid ZOFF_COMM_TIMEOUT is refused before any work, as an invalid --comm-timeout is.
# Usage: cli_newuser.sh ZOFF SRCDIR
set -u
ZOFF=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); SRC="$2"
W=$(mktemp -d "${TMPDIR:-/tmp}/zoff-newuser-XXXXXX")
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check

byte_corpus "$SRC" "$W"
DATA=(--tokenizer byte --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 0 --quiet)

# ---- 1. plan --write-config -> train, stage 2 with the optimizer on NVMe
# A 105.6M-parameter GPT-2 (1 layer, width 1536, GPT-2's vocabulary; 16 tokens a step, so the
# step is quick) and 1700 MiB of host memory: the plan fits only with the optimizer state on
# disk (on the CPU backend the device's part is host memory too). Before the fix train counted
# that state as host memory (24 B/param = 2.4 GiB) and refused what the plan had recommended.
mkdir -p "$W/swap"
echo '{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "optimizer": {"type": "AdamW"},
       "zero_optimization": {"stage": 2}}' > "$W/s2.json"
SHAPE=(--num-layers 1 --hidden-size 1536 --num-attention-heads 12 --seq-length 16)
HOST=$((1700 * 1024 * 1024))
"$ZOFF" plan --config "$W/s2.json" "${SHAPE[@]}" --host-memory "$HOST" --margin 0.05 --device cpu --no-probe \
  --nvme-path "$W/swap" --write-config "$W/plan.json" >"$W/plan.txt" 2>&1
rc=$?
check "plan recommends stage 2 with offload_optimizer nvme and writes it" \
  "[ $rc -eq 0 ] && '$PY' -c 'import json,sys; z=json.load(open(sys.argv[1]))[\"zero_optimization\"]; \
   sys.exit(not (z[\"stage\"] == 2 and z[\"offload_optimizer\"][\"device\"] == \"nvme\"))' '$W/plan.json'"
# --nvme-path over a config that names another nvme_path: the plan measures --nvme-path's disk, and
# the written config (so the printed train command) must put the swap file there. Before: the
# config's own nvme_path was kept, a folder the plan had not measured.
mkdir -p "$W/swap2"
echo "{\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true}, \"optimizer\": {\"type\": \"AdamW\"},
       \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$W/other\"}}}" > "$W/s2o.json"
"$ZOFF" plan --config "$W/s2o.json" "${SHAPE[@]}" --host-memory "$HOST" --margin 0.05 --device cpu --no-probe \
  --nvme-path "$W/swap2" --write-config "$W/plan2.json" >"$W/plan2.txt" 2>&1
rc=$?
check "plan --nvme-path D over a config's other nvme_path: the disk measured at D, the written nvme_path D (before: the config's)" \
  "[ $rc -eq 0 ] && grep -q 'free at $W/swap2' '$W/plan2.txt' && grep -q '^wrote $W/plan2.json: zoff train --config $W/plan2.json ' '$W/plan2.txt' \
   && '$PY' -c 'import json,sys; z=json.load(open(sys.argv[1]))[\"zero_optimization\"]; \
   sys.exit(not (z[\"offload_optimizer\"][\"device\"] == \"nvme\" and z[\"offload_optimizer\"][\"nvme_path\"] == sys.argv[2]))' '$W/plan2.json' '$W/swap2'"
check "... and plan --nvme-path D without one in the config writes D too" \
  "'$PY' -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))[\"zero_optimization\"][\"offload_optimizer\"][\"nvme_path\"] != sys.argv[2])' '$W/plan.json' '$W/swap'"
ZOFF_TEST_MEM_AVAILABLE=$HOST "$ZOFF" train --config "$W/plan.json" "${SHAPE[@]}" --vocab-size 50257 "${DATA[@]}" \
  --train-iters 1 --save "$W/planrun" >"$W/planrun.txt" 2>&1
rc=$?
check "train runs what plan wrote for one step on the same host memory (exit 0, checkpoint complete)" \
  "[ $rc -eq 0 ] && [ -f '$W/planrun/step_00000001/COMPLETE' ]"
[ $rc -eq 0 ] || tail -5 "$W/planrun.txt"
check "and its messages do not advise the NVMe offload it already uses" \
  "! grep -q 'keep the optimizer state on NVMe' '$W/planrun.txt'"
rm -rf "$W/planrun"

# The train command plan prints after --write-config takes what plan took from its flags and the
# file does not hold (--write-config keeps the config's batch): --micro-batch-size,
# --max-position-embeddings. Before: left out, so that command trained another batch (8, the
# default config's, where the plan was for 2: device out of memory where the plan fitted).
"$ZOFF" plan --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 32 \
  --vocab-size 256 --micro-batch-size 2 --device cpu --no-probe --write-config "$W/mb.json" >"$W/mb.txt" 2>&1
cmd=$(sed -n 's/^wrote [^:]*: zoff train //p' "$W/mb.txt")
check "the command plan prints keeps --micro-batch-size 2 and --max-position-embeddings 32" \
  "grep -q -- '--max-position-embeddings 32 --micro-batch-size 2' <<<'$cmd'"
eval "\"\$ZOFF\" train $cmd --tokenizer byte --data-path '$W/corpus_train.bin' --eval-iters 0 --train-iters 1 \
  --no-checkpoint --save '$W/mbrun'" >"$W/mbrun.txt" 2>&1
check "and that command trains micro-batches of 2, the plan's" \
  "[ $? -eq 0 ] && grep -q 'batch 2 x 1 accumulation' '$W/mbrun.txt' && [ -n '$cmd' ]"

# ---- 2. SIGKILL of an NVMe run: no swap file outlives the process
echo "{\"train_micro_batch_size_per_gpu\": 4, \"zero_optimization\": {\"stage\": 2, \"sub_group_size\": 8000,
       \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$W/swap\"}}}" > "$W/nvme.json"
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "${DATA[@]}")
"$ZOFF" train "${TINY[@]}" --config "$W/nvme.json" --train-iters 1000000 --save "$W/killed" >/dev/null 2>&1 &
pid=$!
holds=0 # wait until the process holds its swap file open (it has no name: /proc/PID/fd)
for _ in $(seq 1 300); do
  if ls -l "/proc/$pid/fd" 2>/dev/null | grep -q "zoff-optimizer-$pid-.*\.swp"; then holds=1; break; fi
  sleep 0.1
done
sleep 0.5
kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
check "the NVMe run held its swap file open before the kill" "[ $holds -eq 1 ]"
check "after SIGKILL no swap file of the killed process is left in nvme_path" \
  "[ -z \"\$(ls '$W/swap' | grep -- '-$pid-')\" ]"
"$ZOFF" train "${TINY[@]}" --config "$W/nvme.json" --train-iters 2 --save "$W/after" >/dev/null 2>&1
rc=$?
check "a new NVMe run after the kill trains and leaves nvme_path empty" \
  "[ $rc -eq 0 ] && [ -z \"\$(ls -A '$W/swap')\" ]"

# ---- 6. --quiet prints nothing on success, NVMe notes included (the swapper's line came twice)
"$ZOFF" train "${TINY[@]}" --config "$W/nvme.json" --train-iters 2 --save "$W/quiet" >"$W/quiet.out" 2>"$W/quiet.err"
rc=$?
check "--quiet NVMe run: exit 0 and nothing on stdout or stderr" \
  "[ $rc -eq 0 ] && [ ! -s '$W/quiet.out' ] && [ ! -s '$W/quiet.err' ]"

# ---- 6a. -q is --quiet in every command that takes --quiet (train, tokenize, export), one rule
#      (cli_flag_name); before, each refused it: "unknown option '-q'", exit 2
QT=(); for a in "${TINY[@]}"; do [ "$a" = --quiet ] && QT+=(-q) || QT+=("$a"); done
"$ZOFF" train "${QT[@]}" --train-iters 1 --no-checkpoint --save "$W/qshort" >"$W/qshort.out" 2>&1
check "train -q: exit 0 and nothing printed (before: unknown option '-q', exit 2)" "[ \$? -eq 0 ] && [ ! -s '$W/qshort.out' ]" \
  || cat "$W/qshort.out"
printf 'a few words\n' > "$W/q.txt"
"$ZOFF" tokenize --tokenizer byte --val-fraction 0 -q --output-prefix "$W/qtok" "$W/q.txt" >"$W/qtok.out" 2>&1
check "tokenize -q: exit 0, nothing printed, the shard written" "[ \$? -eq 0 ] && [ ! -s '$W/qtok.out' ] && [ -s '$W/qtok_train.bin' ]"
"$ZOFF" export --load "$W/quiet" --output "$W/q.safetensors" -q >"$W/qexp.out" 2>&1
check "export -q: exit 0, nothing printed, the file written" "[ \$? -eq 0 ] && [ ! -s '$W/qexp.out' ] && [ -s '$W/q.safetensors' ]"
# eval, sample, plan and the benchmarks take it too, from the same rule (cli_quiet_flag): their notes
# on stderr go, the result on stdout stays as it was (before: "unknown option '-q'", exit 2). Each case
# is run without -q first, so the note it must drop is known to be there.
EV=(eval --load "$W/quiet" --data-path "$W/corpus_val.bin,$W/qtok_train.bin") # the second: 12 tokens, < T + 1
"$ZOFF" "${EV[@]}" >"$W/qev.out" 2>"$W/qev.err"; rc1=$?
"$ZOFF" "${EV[@]}" -q >"$W/qevq.out" 2>"$W/qevq.err"; rc2=$?
check "eval -q: exit 0, the short shard's note gone, the result line on stdout" \
  "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q 'qtok_train.bin has 12 tokens, fewer than a window' '$W/qev.err' \
   && [ ! -s '$W/qevq.err' ] && grep -q '^zoff eval: loss [0-9.]*, perplexity' '$W/qevq.out'" || cat "$W/qevq.err"
"$ZOFF" eval --quiet --json --load "$W/quiet" --data-path "$W/corpus_val.bin,$W/qtok_train.bin" >"$W/qevj.out" 2>"$W/qevj.err"
check "eval --quiet --json: the JSON object, nothing on stderr" \
  "[ \$? -eq 0 ] && [ ! -s '$W/qevj.err' ] && '$PY' -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d[\"tokens\"] > 0' '$W/qevj.out'"
LONG="one two three four five six seven eight nine ten" # 48 byte tokens, past the 16 of context
"$ZOFF" sample --load "$W/quiet" --prompt "$LONG" --max-new-tokens 4 >"$W/qsa.out" 2>"$W/qsa.err"; rc1=$?
"$ZOFF" sample --load "$W/quiet" --prompt "$LONG" --max-new-tokens 4 -q >"$W/qsaq.out" 2>"$W/qsaq.err"; rc2=$?
check "sample -q: exit 0, the cut prompt's note gone, the same text on stdout" \
  "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q 'note: the prompt is 48 tokens' '$W/qsa.err' && [ ! -s '$W/qsaq.err' ] \
   && grep -q '^$LONG' '$W/qsaq.out' && cmp -s '$W/qsa.out' '$W/qsaq.out'" || cat "$W/qsaq.err"
echo '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "contiguous_gradients": true}}' > "$W/qplan.json"
PL=(plan --config "$W/qplan.json" --num-layers 2 --hidden-size 32 --num-attention-heads 2 --device cpu --no-probe)
"$ZOFF" "${PL[@]}" >"$W/qpl.out" 2>"$W/qpl.err"; rc1=$?
"$ZOFF" "${PL[@]}" -q >"$W/qplq.out" 2>"$W/qplq.err"; rc2=$?
# (the machine line measures free memory and disk, which move between the two runs)
check "plan -q: exit 0, the config's 'accepted, no effect' note gone, the same table on stdout" \
  "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q 'accepted, no effect' '$W/qpl.err' && [ ! -s '$W/qplq.err' ] \
   && [ -s '$W/qplq.out' ] && cmp -s <(grep -v '^machine:' '$W/qpl.out') <(grep -v '^machine:' '$W/qplq.out')" \
  || cat "$W/qplq.err"
mkdir -p "$W/qbench"
BC=(bench ckpt --dir "$W/qbench" --num-layers 1 --hidden-size 32 --num-attention-heads 2 --vocab-size 256
    --max-position-embeddings 16 --rounds 1 --json)
"$ZOFF" "${BC[@]}" >"$W/qbc.out" 2>"$W/qbc.err"; rc1=$?
"$ZOFF" "${BC[@]}" -q >"$W/qbcq.out" 2>"$W/qbcq.err"; rc2=$?
check "bench ckpt -q: exit 0, its heading on stderr gone, the JSON on stdout" \
  "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q '^zoff bench ckpt: GPT-2 1 layer' '$W/qbc.err' && [ ! -s '$W/qbcq.err' ] \
   && '$PY' -c 'import json,sys; json.load(open(sys.argv[1]))' '$W/qbcq.out'" || cat "$W/qbcq.err"
"$ZOFF" bench step --device cpu --num-layers 1 --hidden-size 32 --vocab-size 256 --seq-length 16 --micro-batch-size 1 \
  --iters 1 --rounds 1 --configs device-optimizer --profile-iters 0 --peak-gemm 0 --json -q >"$W/qbs.out" 2>"$W/qbs.err"
check "bench step -q: exit 0, the JSON on stdout, nothing on stderr" \
  "[ \$? -eq 0 ] && [ ! -s '$W/qbs.err' ] && '$PY' -c 'import json,sys; json.load(open(sys.argv[1]))[\"configs\"]' '$W/qbs.out'"
"$ZOFF" bench adam --params 10k --iters 1 --rounds 1 --mode fp32-grads --json -q >"$W/qba.out" 2>"$W/qba.err"
check "bench adam -q: exit 0, the JSON on stdout, nothing on stderr" \
  "[ \$? -eq 0 ] && [ ! -s '$W/qba.err' ] && '$PY' -c 'import json,sys; json.load(open(sys.argv[1]))' '$W/qba.out'"
"$ZOFF" bench nvme --dir "$W/qbench" --size 1MiB --no-fio --no-step --rounds 1 --json -q >"$W/qbn.out" 2>"$W/qbn.err"
check "bench nvme -q: exit 0, the JSON on stdout, nothing on stderr" \
  "[ \$? -eq 0 ] && [ ! -s '$W/qbn.err' ] && '$PY' -c 'import json,sys; json.load(open(sys.argv[1]))' '$W/qbn.out'" \
  || cat "$W/qbn.err"
"$ZOFF" eval --quiet=1 --load "$W/quiet" --data-path "$W/corpus_val.bin" >/dev/null 2>"$W/qeq.err"
check "eval --quiet=1: a switch takes no value: exit 2, unknown option, --quiet named" \
  "[ \$? -eq 2 ] && grep -q \"unknown option '--quiet=1' (did you mean --quiet?\" '$W/qeq.err'" || cat "$W/qeq.err"
for c in tokenize export; do # one rule (cli_quiet_flag): before, their --quiet=1 was taken as --quiet
  "$ZOFF" $c --quiet=1 >/dev/null 2>"$W/qeq_$c.err"
  check "$c --quiet=1: exit 2, unknown option, --quiet named (as eval)" \
    "[ \$? -eq 2 ] && grep -q \"unknown option '--quiet=1' (did you mean --quiet?\" '$W/qeq_$c.err'" || cat "$W/qeq_$c.err"
done
check "... and each of their helps lists -q, --quiet" \
  "(for c in train tokenize export eval sample plan 'bench step' 'bench adam' 'bench nvme' 'bench ckpt'; do \
      \"\$ZOFF\" \$c --help | grep -q '^  -q, --quiet ' || exit 1; done)"

# ---- 6b. a sub_group_size far below the 4 KiB each state array of a sub-group is padded to on NVMe:
#      a note at start with the state's size and the swap file's, and the sub_group_size that keeps the
#      padding below the data (before: a swap file 16x the state, unexplained). The reference: 34176
#      parameters x 3 fp32 arrays = 400.50 KiB; ceil(34176 / 64) = 534 sub-groups of at most 64
#      elements, each array one 4096-byte block: 534 x 3 x 4096 = 6.26 MiB; 4096 / 4 = 1024 elements.
LOUD=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16) # TINY without --quiet
for a in "${DATA[@]}"; do [ "$a" = --quiet ] || LOUD+=("$a"); done
sed 's/"sub_group_size": 8000/"sub_group_size": 64/' "$W/nvme.json" > "$W/nvme64.json"
sed 's/"sub_group_size": 8000/"sub_group_size": 1024/' "$W/nvme.json" > "$W/nvme1k.json"
"$ZOFF" train "${LOUD[@]}" --config "$W/nvme64.json" --train-iters 1 --no-checkpoint --save "$W/sg64" >"$W/sg64.txt" 2>&1
check "sub_group_size 64 with offload_optimizer nvme: exit 0, a note naming 400.50 KiB of state in 6.26 MiB, 534 sub-groups, at least 1024 elements" \
  "[ \$? -eq 0 ] && [ \$(grep -c 'note: offload_optimizer nvme: the swap file holds' '$W/sg64.txt') -eq 1 ] \
   && grep -q 'holds 400.50 KiB of optimizer state in 6.26 MiB: each of its 534 sub-groups pads each state array to 4096 bytes' '$W/sg64.txt' \
   && grep -q 'sub_group_size of at least 1024 elements (now 64) keeps it below the data' '$W/sg64.txt'" || cat "$W/sg64.txt"
"$ZOFF" train "${LOUD[@]}" --config "$W/nvme1k.json" --train-iters 1 --no-checkpoint --save "$W/sg1k" >"$W/sg1k.txt" 2>&1
check "sub_group_size 1024: no such note" "[ \$? -eq 0 ] && ! grep -q 'note: offload_optimizer nvme' '$W/sg1k.txt'" || cat "$W/sg1k.txt"
"$ZOFF" train "${TINY[@]}" --config "$W/nvme64.json" --train-iters 1 --no-checkpoint --save "$W/sg64q" >"$W/sg64q.txt" 2>&1
check "sub_group_size 64 with --quiet: nothing printed" "[ \$? -eq 0 ] && [ ! -s '$W/sg64q.txt' ]" || cat "$W/sg64q.txt"

# ---- 6c. the same for offload_param nvme (stage 3): each parameter group's slot in the swap file is
#      padded to 4 KiB, and the groups are the model's layers (embeddings, each block, ln_f), which
#      sub_group_size does not change; max_in_cpu keeps them in host memory. The reference: width 4,
#      2 layers, 16 positions, 256 tokens, fp32: embeddings (256 + 16) x 4 = 1088 elements (4352 bytes,
#      2 blocks), each block 12 x 4^2 + 13 x 4 = 244 (976 bytes, 1 block), ln_f 8 (32 bytes, 1 block):
#      1584 elements = 6336 bytes = 6.19 KiB in (2 + 1 + 1 + 1) x 4096 = 20.00 KiB, 4 slots.
echo "{\"train_micro_batch_size_per_gpu\": 4, \"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 64,
       \"offload_optimizer\": {\"device\": \"cpu\"},
       \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"$W/pswap\", \"max_in_cpu\": 0}}}" > "$W/pn0.json"
sed 's/"max_in_cpu": 0/"max_in_cpu": 1584/' "$W/pn0.json" > "$W/pnall.json"
NARROW=(--num-layers 2 --hidden-size 4 --num-attention-heads 1 --seq-length 16)
for a in "${DATA[@]}"; do [ "$a" = --quiet ] || NARROW+=("$a"); done
"$ZOFF" train "${NARROW[@]}" --config "$W/pn0.json" --train-iters 1 --no-checkpoint --save "$W/pn0" >"$W/pn0.txt" 2>&1
check "offload_param nvme of a width-4 model: exit 0, one note naming 6.19 KiB of parameters in 20.00 KiB, 4 slots, max_in_cpu of at least 1584 elements" \
  "[ \$? -eq 0 ] && [ \$(grep -c 'note: offload_param nvme: the swap file holds' '$W/pn0.txt') -eq 1 ] \
   && grep -q 'holds 6.19 KiB of parameters in 20.00 KiB: each of its 4 slots' '$W/pn0.txt' \
   && grep -q 'max_in_cpu of at least 1584 elements (now 0) keeps these parameters in host memory' '$W/pn0.txt'" || cat "$W/pn0.txt"
"$ZOFF" train "${NARROW[@]}" --config "$W/pnall.json" --train-iters 1 --no-checkpoint --save "$W/pnall" >"$W/pnall.txt" 2>&1
check "max_in_cpu 1584: no such note" "[ \$? -eq 0 ] && ! grep -q 'note: offload_param nvme' '$W/pnall.txt'" || cat "$W/pnall.txt"
"$ZOFF" train "${NARROW[@]}" --quiet --config "$W/pn0.json" --train-iters 1 --no-checkpoint --save "$W/pn0q" >"$W/pn0q.txt" 2>&1
check "offload_param nvme note with --quiet: nothing printed" "[ \$? -eq 0 ] && [ ! -s '$W/pn0q.txt' ]" || cat "$W/pn0q.txt"

# ---- 5. zoff plan on the CPU backend ignores ulimit -l
echo '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW"}, "bf16": {"enabled": true},
       "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}}' > "$W/pin.json"
(ulimit -l 64 && "$ZOFF" plan --config "$W/pin.json" --device cpu --no-probe --json) >"$W/pin.out" 2>"$W/pin.err"
rc=$?
check "plan --device cpu under ulimit -l 64 KiB: no row fails on pinned memory, the limit is unlimited" \
  "[ $rc -eq 0 ] && '$PY' -c 'import json,sys; d=json.load(open(sys.argv[1])); \
   sys.exit(not (d[\"machine\"][\"pinned_limit\"] == -1 and all(r[\"fits_detail\"][\"pinned\"] for r in d[\"rows\"])))' \
   '$W/pin.out'"
(ulimit -l 64 && "$ZOFF" plan --config "$W/pin.json" --device cpu --no-probe) >"$W/pin.txt" 2>&1
check "its text names why (CPU backend: pinned is ordinary memory) and marks no row no:pin" \
  "grep -q 'pinned is ordinary memory' '$W/pin.txt' && ! grep -q 'no:pin' '$W/pin.txt'"
check "one rank is counted as one: 'x 1 rank,' and '(x1 rank;' (before: '1 ranks')" \
  "grep -q 'x 1 rank, activation' '$W/pin.txt' && grep -q '(x1 rank;' '$W/pin.txt' && ! grep -q ' 1 ranks' '$W/pin.txt'"

# ---- 5b. --ranks 2 in a build without MPI: the recommendation says MPI is what is missing (before:
# "nothing this zoff can run fits" with advice on memory, while every row fits and none runs)
"$ZOFF" plan --no-probe --num-layers 2 --hidden-size 64 --num-attention-heads 4 --ranks 2 >"$W/r2.txt" 2>&1
if "$ZOFF" version | grep -q '^mpi: not built'; then
  check "plan --ranks 2 without MPI: the recommendation names the missing MPI, no memory advice" \
    "grep -q '^recommended: none: 2 ranks need a build with MPI.*--ranks 1' '$W/r2.txt' \
     && ! grep -q 'micro-batch-size\\|nothing this zoff can run fits' '$W/r2.txt'"
else
  check "plan --ranks 2 with MPI: a setting is recommended" "grep -q '^recommended: stage' '$W/r2.txt'"
fi

# ---- 5c. a shape the model refuses: said once, "zoff plan: model shape: ..." (before: "zoff plan: model:
# zoff plan: model shape: ...")
"$ZOFF" plan --no-probe --num-layers 2 --hidden-size 65 --num-attention-heads 4 >"$W/p65.out" 2>"$W/p65.err"
rc=$?
check "plan of a width its heads do not divide: exit 2, the command named once" \
  "[ $rc -eq 2 ] && [ ! -s '$W/p65.out' ] && [ \$(grep -o 'zoff plan' '$W/p65.err' | wc -l) -eq 1 ] \
   && grep -q '^zoff plan: model shape: shape.hidden_size (65) is not divisible' '$W/p65.err'"

# ---- 5d. a list with an empty item (before: skipped, as if 0.5,1 had been given)
for r in 0.5,,1 0.5, ,1; do
  "$ZOFF" plan --no-probe --ratios "$r" >"$W/rat.out" 2>"$W/rat.err"
  rc=$?
  check "plan --ratios '$r': exit 2, names the empty item, no table" \
    "[ $rc -eq 2 ] && [ ! -s '$W/rat.out' ] && grep -q -- \"--ratios: '$r' has an empty item\" '$W/rat.err'"
done
"$ZOFF" bench step --ratios 0,,1 >"$W/rat.out" 2>"$W/rat.err"
rc=$?
check "bench step --ratios 0,,1: exit 2, the same rule" "[ $rc -eq 2 ] && grep -q 'has an empty item (item 2)' '$W/rat.err'"

# ---- 6. nothing fits: no advice to do what is already set
"$ZOFF" plan --num-layers 48 --hidden-size 4096 --num-attention-heads 32 --micro-batch-size 1 \
  --checkpoint-activations --host-memory 4GiB --device cpu --no-probe >"$W/nofit.txt" 2>&1
check "nothing fits with micro-batch 1 and checkpointing set: neither is advised" \
  "grep -q 'nothing this zoff can run fits' '$W/nofit.txt' && ! grep -q -- '--micro-batch-size\\|--checkpoint-activations' \
   <(grep 'nothing this zoff' '$W/nofit.txt') && ! grep -q 'ulimit -l' <(grep 'nothing this zoff' '$W/nofit.txt')"
"$ZOFF" plan --num-layers 48 --hidden-size 4096 --num-attention-heads 32 --host-memory 4GiB --device cpu \
  --no-probe >"$W/nofit2.txt" 2>&1
check "nothing fits with micro-batch 8, no checkpointing: both are advised" \
  "grep 'nothing this zoff' '$W/nofit2.txt' | grep -q -- 'micro-batch-size (now 8)' && \
   grep 'nothing this zoff' '$W/nofit2.txt' | grep -q -- '--checkpoint-activations'"
# accumulation with the full device buffer (zoff_grad_buckets true): "always" is advised, also for several ranks
# at a Twin-Flow ratio below 1 (zoff_placement_grad_buckets_for: any ranks, any ratio)
echo '{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}' > "$W/acc.json"
"$ZOFF" plan --config "$W/acc.json" --num-layers 48 --hidden-size 4096 --num-attention-heads 32 --checkpoint-activations \
  --ranks 2 --host-memory 4GiB --device cpu --no-probe >"$W/nofit3.txt" 2>&1
check "nothing fits with accumulation 4, 2 ranks, ratio 0.5: zoff_grad_buckets \"always\" is advised" \
  "grep 'nothing this zoff' '$W/nofit3.txt' | grep -q 'zoff_grad_buckets \"always\"'"

# ---- 6. bare zoff
(cd "$W" && mkdir bare && cd bare && "$ZOFF" >../bare.out 2>../bare.err)
rc=$?
check "bare zoff: usage on stderr, exit 2, nothing written" \
  "[ $rc -eq 2 ] && grep -q 'usage: zoff <command>' '$W/bare.err' && [ -z \"\$(ls -A '$W/bare')\" ]"

# ---- 6. config errors: one exit code (2), the position said once
: > "$W/empty.json"
printf '{\n  "zero_optimization": {"stage": 2,}\n}\n' > "$W/comma.json"
for c in "$W/missing.json" "$W" "$W/empty.json" "$W/comma.json"; do
  for cmd in train plan; do
    "$ZOFF" $cmd --config "$c" "${TINY[@]:0:8}" --device cpu >"$W/cfg.out" 2>"$W/cfg.err" </dev/null
    rc=$?
    check "zoff $cmd --config $(basename "$c"): exit 2 with the file named" \
      "[ $rc -eq 2 ] && grep -qF '$(basename "$c")' '$W/cfg.err'"
  done
done
"$ZOFF" train --config "$W/empty.json" >/dev/null 2>"$W/cfg.err"
check "an empty config is named as empty, with no position" \
  "grep -q 'empty.json is empty' '$W/cfg.err' && ! grep -q ':1:0' '$W/cfg.err'"
"$ZOFF" train --config "$W/comma.json" >/dev/null 2>"$W/cfg.err"
check "a syntax error says file:line:column once" \
  "grep -q 'comma.json:2:[0-9]*: JSON syntax error' '$W/cfg.err' && ! grep -q 'at line' '$W/cfg.err'"

# ---- a wrong input or output path: exit 2 ("fix it and run again", zoff --help), like a wrong
# config. Before the fix a missing shard, a pattern that matched nothing, a missing --load or
# --init-from, an --output or --save in a folder that is not there exited 1, the status of a
# failed run (an I/O error), and zoff sample 2.
mkdir -p "$W/noshards" "$W/tkdir_train.bin" && touch "$W/noshards.txt"
"$ZOFF" train "${TINY[@]}" --train-iters 1 --save "$W/planrun0" >/dev/null 2>&1 # a checkpoint to export
SHAPE4=("${TINY[@]:0:8}" --tokenizer byte --eval-iters 0 --quiet --device cpu)
while IFS='|' read -r what named args; do
  eval "set -- $args"
  "$ZOFF" "$@" >"$W/path.out" 2>"$W/path.err" </dev/null
  rc=$?
  check "$what: exit 2 naming $named, nothing written" \
    "[ $rc -eq 2 ] && grep -qF '$named' '$W/path.err' && [ ! -e '$W/pathout' ] && [ ! -e '$W/nofolder' ]"
done <<'EOF_CASES'
train, a --data-path file that does not exist|nope.bin|train "${SHAPE4[@]}" --data-path "$W/nope.bin" --save "$W/pathout"
train, a --data-path pattern that matches nothing|nope_*.bin|train "${SHAPE4[@]}" --data-path "$W/nope_*.bin" --save "$W/pathout"
train, a --data-path directory without shards|noshards|train "${SHAPE4[@]}" --data-path "$W/noshards" --save "$W/pathout"
train, a --load that does not exist|noload|train "${TINY[@]}" --load "$W/noload" --save "$W/pathout"
train, an --init-from that does not exist|nope.safetensors|train "${TINY[@]}" --init-from "$W/nope.safetensors" --save "$W/pathout"
export, a --load that does not exist|noload|export --load "$W/noload" --output "$W/pathout"
sample, a --load that does not exist|noload|sample --load "$W/noload" --device cpu
train, a --save that is a file|noshards.txt is a file, not a directory|train "${TINY[@]}" --train-iters 1 --save "$W/noshards.txt"
train, a --save under a file|noshards.txt|train "${TINY[@]}" --train-iters 1 --save "$W/noshards.txt/pathout"
export, an --output in a folder that is not there|nofolder|export --load "$W/planrun0" --output "$W/nofolder/pathout.safetensors"
tokenize, an --output-prefix in a folder that is not there|nofolder|tokenize --tokenizer byte --output-prefix "$W/nofolder/pathout" "$SRC/README.md"
export, an --output folder (ending in /) that is a file|noshards.txt/ names a folder, but|export --load "$W/planrun0" --output "$W/noshards.txt/"
export, an --output in a folder that is not there, said before a missing --load|nofolder|export --load "$W/noload" --output "$W/nofolder/x.safetensors"
plan, a --write-config in a folder that is not there|nofolder|plan --write-config "$W/nofolder/plan.json"
tokenize, an --output-prefix whose _train.bin is a folder|tkdir_train.bin, where a shard goes, is a folder|tokenize --tokenizer byte --output-prefix "$W/tkdir" "$SRC/README.md"
tokenize, an --output-prefix that is a folder|noshards is a folder: the shards would be|tokenize --tokenizer byte --output-prefix "$W/noshards" "$SRC/README.md"
tokenize, an --output-prefix ending in /|noshards/ ends in|tokenize --tokenizer byte --output-prefix "$W/noshards/" "$SRC/README.md"
plan, a --write-config that is a folder|noshards is a folder; give the path of a file|plan --no-probe --write-config "$W/noshards"
plan, a --write-config ending in /|noshards/ ends in|plan --no-probe --write-config "$W/noshards/"
EOF_CASES
"$ZOFF" plan --write-config "$W/nofolder/plan.json" >"$W/path.out" 2>&1
check "plan --write-config in a folder that is not there: said before any planning (no table printed)" \
  "[ \$(grep -c . '$W/path.out') -eq 1 ] && grep -q 'output directory .*nofolder does not exist' '$W/path.out'"

# ---- a step that is not there: the error lists the steps that are (before: only "No such file")
"$ZOFF" export --load "$W/planrun0" --step 3 --output "$W/pathout" >/dev/null 2>"$W/step.err"
rc=$?
check "export --step 3 of a run saved at step 1: exit 2, lists step 1" \
  "[ $rc -eq 2 ] && grep -q 'step_00000003: No such file or directory; its folder holds complete checkpoints at step 1\$' '$W/step.err' \
   && [ ! -e '$W/pathout' ]"
"$ZOFF" sample --load "$W/noshards/step_00000002" --device cpu >/dev/null 2>"$W/step.err"
rc=$?
check "sample --load DIR/step_00000002 of a folder without checkpoints: exit 2, says it holds none" \
  "[ $rc -eq 2 ] && grep -q 'its folder holds no complete checkpoint' '$W/step.err'"
# a short name (step_1 for step_00000001, the spelling a user types from --step or the logs):
# before, "No such file or directory" alone; now the folder's spelling and the path to give
"$ZOFF" sample --load "$W/planrun0/step_1" --device cpu >/dev/null 2>"$W/step.err"
rc=$?
check "sample --load DIR/step_1 of a run saved at step 1: exit 2, gives DIR/step_00000001" \
  "[ $rc -eq 2 ] && grep -q 'step_1: No such file or directory; step folders are named step_00000001: --load .*planrun0/step_00000001\$' '$W/step.err'"
"$ZOFF" sample --load "$W/planrun0/step_3" --device cpu >/dev/null 2>"$W/step.err"
rc=$?
check "sample --load DIR/step_3 of a run saved at step 1: exit 2, lists step 1 and the folders' spelling" \
  "[ $rc -eq 2 ] && grep -q 'step_3: No such file or directory; its folder holds complete checkpoints at step 1 (folders named like step_00000001)\$' '$W/step.err'"

# ---- --init-from a folder: its model.safetensors (what export --output DIR/ writes, a Hugging Face
# model folder), the same run as naming the file; a zoff checkpoint folder: the two ways to use it
# (before: "is not a regular file")
"$ZOFF" export --load "$W/planrun0" --output "$W/hfdir/" --quiet >/dev/null 2>&1
for how in dir file; do
  from="$W/hfdir"; [ $how = file ] && from="$W/hfdir/model.safetensors"
  "$ZOFF" train "${TINY[@]}" --train-iters 1 --init-from "$from" --no-checkpoint --save "$W/init_$how" >/dev/null 2>"$W/init_$how.err"
  echo $? > "$W/init_$how.rc"
done
check "--init-from DIR: exit 0, the first loss of --init-from DIR/model.safetensors" \
  "[ \$(cat '$W/init_dir.rc') -eq 0 ] && [ -n \"\$(grep -o '\"loss\":[^,]*' '$W/init_dir/metrics.jsonl')\" ] && \
   [ \"\$(grep -o '\"loss\":[^,]*' '$W/init_dir/metrics.jsonl')\" = \"\$(grep -o '\"loss\":[^,]*' '$W/init_file/metrics.jsonl')\" ]"
"$ZOFF" train "${TINY[@]}" --train-iters 1 --init-from "$W/planrun0" --save "$W/init_ck" >/dev/null 2>"$W/init_ck.err"
rc=$?
check "--init-from a checkpoint folder: exit 2, names --load and export --format fp32, nothing written" \
  "[ $rc -eq 2 ] && grep -q 'is a zoff checkpoint (step 1): --load .* resumes it; .*zoff export --load .* --format fp32' '$W/init_ck.err' \
   && [ ! -e '$W/init_ck' ]"
# and the other way round: --load of a model folder (README: `zoff sample --load gpt2/`, `zoff train
# --init-from gpt2/`) names --init-from (before: "no complete checkpoint ...; check the path" only)
"$ZOFF" train "${TINY[@]}" --train-iters 1 --load "$W/hfdir" >/dev/null 2>"$W/load_hf.err"
rc=$?
check "train --load of a model folder: exit 2, says it holds safetensors weights and names --init-from" \
  "[ $rc -eq 2 ] && grep -q 'no complete checkpoint in .*hfdir.*; it holds safetensors weights .*zoff train --init-from' '$W/load_hf.err'"

# ---- --init-from without shape flags: the file's model gives the sizes (before: the defaults,
# 4 layers x 128, then "tensor 'h.2.ln_1.weight' is missing ... train with --num-layers 2 ...").
# The head count, which the tensors do not tell, comes from zoff's metadata or a config.json
# beside the file that describes the same model; else the error names --num-attention-heads.
"$ZOFF" train "${DATA[@]}" --train-iters 1 --init-from "$W/hfdir" --no-checkpoint --save "$W/init_bare" \
  >/dev/null 2>"$W/init_bare.err"
rc=$?
check "--init-from DIR alone: exit 0, the first loss of the run with --num-layers 2 --hidden-size 32 ..." \
  "[ $rc -eq 0 ] && [ \"\$(grep -o '\"loss\":[^,]*' '$W/init_bare/metrics.jsonl')\" = \"\$(grep -o '\"loss\":[^,]*' '$W/init_dir/metrics.jsonl')\" ]"
mkdir -p "$W/nometa"
# the same tensors with no zoff metadata, as another program would write them
"$PY" - "$W/hfdir/model.safetensors" "$W/nometa/model.safetensors" <<'PYSTRIP'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["__metadata__"] = {"format": "pt"}
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (-len(t) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PYSTRIP
nometa_run() { # $1: name
  "$ZOFF" train "${DATA[@]}" --train-iters 1 --init-from "$W/nometa" --no-checkpoint --save "$W/init_$1" \
    >/dev/null 2>"$W/init_$1.err"
}
nometa_run nm1; rc=$?
check "a file that does not give its head count: exit 2, names --num-attention-heads, nothing written" \
  "[ $rc -eq 2 ] && grep -q 'does not say how many attention heads.*give --num-attention-heads' '$W/init_nm1.err' && [ ! -e '$W/init_nm1' ]"
echo '{"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2}' > "$W/nometa/config.json"
nometa_run nm2; rc=$?
check "its Hugging Face config.json gives it: exit 0, the same first loss" \
  "[ $rc -eq 0 ] && [ \"\$(grep -o '\"loss\":[^,]*' '$W/init_nm2/metrics.jsonl')\" = \"\$(grep -o '\"loss\":[^,]*' '$W/init_dir/metrics.jsonl')\" ]"
echo '{"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12}' > "$W/nometa/config.json"
nometa_run nm3; rc=$?
check "a config.json of another model is not taken: exit 2, names --num-attention-heads" \
  "[ $rc -eq 2 ] && grep -q 'give --num-attention-heads' '$W/init_nm3.err'"
"$ZOFF" train --data-path "$W/corpus_train.bin" --eval-iters 0 --quiet --train-iters 1 --init-from "$W/hfdir" \
  --no-checkpoint --save "$W/init_tok" >/dev/null 2>"$W/init_tok.err"
rc=$?
check "its vocabulary (256) below the tokenizer's (gpt2): exit 2, names --tokenizer byte" \
  "[ $rc -eq 2 ] && grep -q \"vocabulary of 256 is smaller than the 50257 tokens of tokenizer gpt2: .*--tokenizer byte\" '$W/init_tok.err'"

"$ZOFF" train "${DATA[@]}" --seq-length 32 --train-iters 1 --init-from "$W/hfdir" --save "$W/init_seq" >/dev/null 2>"$W/init_seq.err"
rc=$?
check "--seq-length beyond the file's positions: exit 2, names them, not a flag not given" \
  "[ $rc -eq 2 ] && grep -q 'seq-length 32 exceeds the 16 positions of --init-from .*give --seq-length 16 or less' '$W/init_seq.err'"

# A file whose tensors give a shape no model can have (a vocabulary of 0 rows): the error says so,
# not "train with ... --vocab-size 0" (before: it suggested those flags, which are refused).
"$PY" - "$W/hfdir/model.safetensors" "$W/novocab.safetensors" <<'PYNOVOCAB'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
meta = h.pop("__metadata__", None)
data, out = b[8 + n:], b""
for k in sorted(h, key=lambda k: h[k]["data_offsets"][0]):  # wte's rows dropped, the rest moved up
    lo, hi = h[k]["data_offsets"]
    if k.endswith("wte.weight"): h[k]["shape"][0], hi = 0, lo
    h[k]["data_offsets"] = [len(out), len(out) + hi - lo]
    out += data[lo:hi]
if meta: h["__metadata__"] = meta
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (-len(t) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(t)) + t + out)
PYNOVOCAB
"$ZOFF" train "${DATA[@]}" --train-iters 1 --init-from "$W/novocab.safetensors" --save "$W/init_novocab" \
  >/dev/null 2>"$W/init_novocab.err"
rc=$?
check "a file of 0 vocabulary rows: exit 2, says no GPT-2 can be built of it, suggests no flags" \
  "[ $rc -eq 2 ] && grep -q 'give no GPT-2 zoff can build (2 layers, width 32, 16 positions, vocabulary 0)' '$W/init_novocab.err' \
   && ! grep -q 'train with' '$W/init_novocab.err' && [ ! -e '$W/init_novocab' ]"

# ---- two runs into one --save folder (before: both trained; the second failed at its first save,
# "step_00000004 already exists", both having appended to one metrics.jsonl). The first holds a
# lock for its whole run; the second is refused at once; after a SIGKILL the folder is free.
"$ZOFF" train "${TINY[@]}" --train-iters 1000000 --save "$W/busy" >/dev/null 2>&1 &
busy_pid=$!
for _ in $(seq 1 600); do grep -q '"loss"' "$W/busy/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
"$ZOFF" train "${TINY[@]}" --train-iters 1 --save "$W/busy" >/dev/null 2>"$W/busy2.err"
rc=$?
check "a second run into a --save in use: exit 2, names the running one (pid $busy_pid)" \
  "[ $rc -eq 2 ] && grep -q \"is in use by another zoff train (pid $busy_pid on \" '$W/busy2.err'"
kill -9 $busy_pid 2>/dev/null; wait $busy_pid 2>/dev/null
"$ZOFF" train "${TINY[@]}" --train-iters 1 --save "$W/busy" >/dev/null 2>"$W/busy3.err"
rc=$?
check "after that run is SIGKILLed, the folder takes a new run (exit 0)" \
  "[ $rc -eq 0 ] && [ -f '$W/busy/step_00000001/COMPLETE' ]"

# ---- zoff sample from exported weights (before: "cannot open checkpoint ...: not a checkpoint")
"$ZOFF" sample --load "$W/planrun0" --temperature 0 --max-new-tokens 24 --prompt "int " >"$W/sck.txt" 2>/dev/null
"$ZOFF" sample --load "$W/hfdir" --temperature 0 --max-new-tokens 24 --prompt "int " >"$W/shf.txt" 2>"$W/shf.err"
rc=$?
check "sample --load an export folder: exit 0, the checkpoint's greedy text" \
  "[ $rc -eq 0 ] && [ -s '$W/sck.txt' ] && cmp -s '$W/sck.txt' '$W/shf.txt'"
# --top-p above 1 and at 0 are out of one range, said alike (before: "[0, 1]" for 1.01, "(0, 1]" for 0)
for p in 1.01 0; do "$ZOFF" sample --load "$W/planrun0" --top-p $p >/dev/null 2>"$W/topp$p.err"; echo $? >>"$W/topp.rc"; done
check "sample --top-p 1.01 and 0: exit 2, both 'out of range (0, 1]'" \
  "[ \"\$(tr -d '\\n' < '$W/topp.rc')\" = 22 ] && grep -q -- '--top-p: 1.01 is out of range (0, 1]' '$W/topp1.01.err' \
   && grep -q -- '--top-p: 0 is out of range (0, 1]' '$W/topp0.err'"
"$ZOFF" sample --load "$W/planrun0" --tokenizer gpt2 >/dev/null 2>"$W/stk.err"
rc=$?
check "sample --tokenizer with a checkpoint: exit 2, says a checkpoint records its own" \
  "[ $rc -eq 2 ] && grep -q 'a checkpoint records its own' '$W/stk.err'"
"$ZOFF" sample --load "$W/hfdir" --tokenizer gpt2 >/dev/null 2>"$W/stk2.err"
rc=$?
check "sample --tokenizer other than the file's: exit 2, names both" \
  "[ $rc -eq 2 ] && grep -q 'trained with tokenizer byte.*not --tokenizer gpt2' '$W/stk2.err'"

# ---- a trial run writes no checkpoint with --no-checkpoint (a 13B state does not fit a 64 GiB disk)
"$ZOFF" train "${TINY[@]}" --train-iters 2 --no-checkpoint --save "$W/nock" >/dev/null 2>"$W/nock.err"
rc=$?
check "--no-checkpoint: metrics.jsonl with 2 steps and no checkpoint in --save" \
  "[ $rc -eq 0 ] && [ \$(grep -c '\"loss\"' '$W/nock/metrics.jsonl') -eq 2 ] && \
   [ -z \"\$(ls '$W/nock' | grep -v '^metrics.jsonl\$')\" ]"
"$ZOFF" train "${TINY[@]}" --train-iters 1 --no-checkpoint --save "$W/nock" >"$W/nock.out" 2>&1
rc=$?
check "a second --no-checkpoint run into that --save keeps the first's metrics as metrics.prev.jsonl" \
  "[ $rc -eq 0 ] && [ \$(grep -c '\"loss\"' '$W/nock/metrics.prev.jsonl') -eq 2 ] && [ \$(grep -c '\"loss\"' '$W/nock/metrics.jsonl') -eq 1 ]"
# the same one-generation rule for the per-rank files of an earlier --no-checkpoint run on 2 ranks
# (rank 1's metrics_rank_00001.jsonl, both ranks' grad_timeline_rank_N.jsonl; written here by hand):
# a new run on one rank sets them all aside as *.prev.jsonl (before: left as they were, as if this run's)
printf '{"step":1,"loss":5.0}\n{"step":2,"loss":4.0}\n' > "$W/nock/metrics_rank_00001.jsonl"
for r in 0 1; do printf '{"step":1,"rank":%d}\n{"step":2,"rank":%d}\n' $r $r > "$W/nock/grad_timeline_rank_0000$r.jsonl"; done
"$ZOFF" train "${TINY[@]}" --train-iters 1 --no-checkpoint --save "$W/nock" >"$W/nock.out" 2>&1
rc=$?
check "a new run into a folder of an earlier 2-rank run's per-rank files keeps each as *.prev.jsonl, the old names gone" \
  "[ $rc -eq 0 ] && [ \$(grep -c '\"loss\"' '$W/nock/metrics_rank_00001.prev.jsonl' 2>/dev/null) -eq 2 ] \
   && [ \$(grep -c '\"rank\":0' '$W/nock/grad_timeline_rank_00000.prev.jsonl' 2>/dev/null) -eq 2 ] \
   && [ \$(grep -c '\"rank\":1' '$W/nock/grad_timeline_rank_00001.prev.jsonl' 2>/dev/null) -eq 2 ] \
   && [ ! -e '$W/nock/metrics_rank_00001.jsonl' ] && [ ! -e '$W/nock/grad_timeline_rank_00000.jsonl' ] \
   && [ ! -e '$W/nock/grad_timeline_rank_00001.jsonl' ] && [ \$(grep -c '\"loss\"' '$W/nock/metrics.jsonl') -eq 1 ]"
# ... and says why for each (not --quiet): rank 0 is in this run, but a run on one rank writes no timeline
# (before: "that rank is not in this run" for rank 0's timeline too, and "on 1 ranks")
printf '{"step":1,"loss":5.0}\n' > "$W/nock/metrics_rank_00001.jsonl"
for r in 0 1; do printf '{"step":1,"rank":%d}\n' $r > "$W/nock/grad_timeline_rank_0000$r.jsonl"; done
LOUD=(); for a in "${TINY[@]}"; do [ "$a" = --quiet ] || LOUD+=("$a"); done
"$ZOFF" train "${LOUD[@]}" --train-iters 1 --no-checkpoint --save "$W/nock" >"$W/nock.out" 2>&1
rc=$?
check "... the message says why: rank 0's timeline (one rank writes none), rank 1's files (not in this run)" \
  "[ $rc -eq 0 ] && grep -q \"new run on 1 rank: rank 0's .*grad_timeline_rank_00000.jsonl is now .*(a run on one rank writes no gradient timeline)\" '$W/nock.out' \
   && grep -q \"new run on 1 rank: rank 1's .*metrics_rank_00001.jsonl is now .*(that rank is not in this run)\" '$W/nock.out' \
   && ! grep -q \"rank 0's.*not in this run\" '$W/nock.out'" || grep 'is now' "$W/nock.out"
"$ZOFF" train "${TINY[@]}" --no-checkpoint --save-interval 1 --save "$W/nock2" >/dev/null 2>"$W/nock.err"
rc=$?
check "--no-checkpoint with --save-interval: exit 2 naming both, nothing written" \
  "[ $rc -eq 2 ] && grep -q -- '--no-checkpoint.*--save-interval' '$W/nock.err' && [ ! -e '$W/nock2' ]"
"$ZOFF" train "${TINY[@]}" --no-checkpoint --sync-save --save "$W/nock3" >/dev/null 2>"$W/nock.err"
rc=$?
check "--no-checkpoint with --sync-save: exit 2 naming both, nothing written" \
  "[ $rc -eq 2 ] && grep -q -- '--no-checkpoint.*--sync-save' '$W/nock.err' && [ ! -e '$W/nock3' ]"

# ---- resuming a run with a --train-iters it has reached: say so (before: "trained 0 steps", nothing else)
"$ZOFF" train "${TINY[@]}" --train-iters 2 --save "$W/done2" >/dev/null 2>&1
"$ZOFF" train "${TINY[@]}" --train-iters 2 --load "$W/done2" --save "$W/done2" >/dev/null 2>"$W/done2.err"
rc=$?
check "--load of a run at step 2 with --train-iters 2: exit 0, says there is nothing to train and how to go on" \
  "[ $rc -eq 0 ] && grep -q 'at step 2 already.*--train-iters 2 counts steps from the run.s start: nothing to train (give --train-iters above 2' '$W/done2.err'"
"$ZOFF" train "${TINY[@]}" --train-iters 3 --load "$W/done2" --save "$W/done2" >/dev/null 2>"$W/done3.err"
rc=$?
check "... and with --train-iters 3 it trains to step 3 without that line" \
  "[ $rc -eq 0 ] && [ -f '$W/done2/step_00000003/COMPLETE' ] && ! grep -q 'nothing to train' '$W/done3.err'"

# ---- one step is "1 step" (before: "trained 1 steps")
"$ZOFF" train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --tokenizer byte \
  --data-path "$W/corpus_train.bin" --eval-iters 0 --train-iters 1 --no-checkpoint --save "$W/one" >/dev/null 2>"$W/one.err"
check "a run of one step says 'trained 1 step in'" "grep -q '^zoff: trained 1 step in ' '$W/one.err'"

# ---- a device budget too small: exit 1 and the ways out, zoff plan among them (before: "lower the
# batch size, enable offload", not --checkpoint-activations, not plan)
"$ZOFF" train "${TINY[@]}" --vocab-size 256 --micro-batch-size 64 --device-memory 1MiB --train-iters 1 --save "$W/oom" \
  >/dev/null 2>"$W/oom.err"
rc=$?
check "--device-memory 1MiB: exit 1, names --checkpoint-activations and zoff plan" \
  "[ $rc -eq 1 ] && grep -q 'device out of memory allocating .*--checkpoint-activations.*zoff plan with the same flags' '$W/oom.err'"
check "... and how to move more to the host, whether offload is on or not (before: 'enable offload')" \
  "grep -q 'move more to the host (offload_optimizer, a lower offload_optimizer.ratio, stage 3 with offload_param' '$W/oom.err'"

# ---- data smaller than a batch: the error says which data (a split of --data-path or --val-path) and,
# for validation, that --eval-iters 0 runs without (before: "the all split", no way out named)
printf 'a few bytes of text, fewer than a batch\n' > "$W/tiny.txt"
"$ZOFF" tokenize --tokenizer byte --val-fraction 0 --quiet --output-prefix "$W/tiny" "$W/tiny.txt" >/dev/null 2>&1
SM=(--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4 --tokenizer byte
    --train-iters 1 --quiet)
"$ZOFF" train "${SM[@]}" --data-path "$W/corpus_train.bin" --val-path "$W/tiny_train.bin" --save "$W/small1" \
  >/dev/null 2>"$W/small1.err"
rc=$?
check "--val-path smaller than a batch: exit 2, names --val-path and --eval-iters 0, nothing written" \
  "[ $rc -eq 2 ] && grep -q 'validation data: .*--val-path has .* tokens.*--eval-iters 0 for no validation' '$W/small1.err' \
   && [ ! -e '$W/small1' ]"
"$ZOFF" train "${SM[@]}" --data-path "$W/tiny_train.bin" --save "$W/small2" >/dev/null 2>"$W/small2.err"
rc=$?
check "--data-path smaller than a batch: exit 2, names the training split of --data-path" \
  "[ $rc -eq 2 ] && grep -q 'training data: .*the training split (all but the last 5% of --data-path' '$W/small2.err' \
   && ! grep -q 'all split' '$W/small2.err'"

# validation smaller than one batch speaks of one validation batch, with one list of advice (before:
# "one step needs batch 4 x 1 process(es) = 4 windows; use more data or a smaller batch/sequence
# length; or ...", a training step's words for a validation batch, which any rank count reads whole)
check "--val-path smaller than a batch: one validation batch of 4, one list of advice, no training step" \
  "grep -q -- '--val-path has 40 tokens (1 shard(s)), which give 2 windows of seq_len+1 = 17 tokens, fewer than one validation batch of 4; give more tokens, a smaller --micro-batch-size or --seq-length, or --eval-iters 0 for no validation\$' '$W/small1.err' \
   && ! grep -q 'step\\|process\\|use more data' '$W/small1.err'"
head -c 1000 "$W/corpus.txt" > "$W/k1.txt" # 1000 tokens: the last 5%, 50 tokens, hold 3 windows of 17
"$ZOFF" tokenize --tokenizer byte --val-fraction 0 --quiet --output-prefix "$W/k1" "$W/k1.txt" >/dev/null 2>&1
"$ZOFF" train "${SM[@]}" --data-path "$W/k1_train.bin" --save "$W/small3" >/dev/null 2>"$W/small3.err"
rc=$?
check "a validation split (5% of --data-path) smaller than one batch: exit 2, one validation batch, --val-path and --eval-iters 0" \
  "[ $rc -eq 2 ] && grep -q -- \"validation data: data loader: the validation split (the last 5% of --data-path's tokens) has 50 tokens (1 shard(s)), which give 3 windows of seq_len+1 = 17 tokens, fewer than one validation batch of 4; give --val-path shards of their own, more tokens, a smaller --micro-batch-size or --seq-length, or --eval-iters 0 for no validation\$\" '$W/small3.err' \
   && ! grep -q 'step\\|process\\|use more data' '$W/small3.err' && [ ! -e '$W/small3' ]"

# ---- zoff tokenize of a directory or a quoted glob, as --data-path takes them (before: "not a
# regular file", "No such file or directory"): the same shards as the files named one by one in
# name order; hidden files, .bin shards and subdirectories are not read
mkdir -p "$W/texts/sub" "$W/notexts/sub"
printf 'the second text\n' > "$W/texts/b.txt"; printf 'the first text\n' > "$W/texts/a.txt"
printf 'the third\n' > "$W/texts/c.md"; printf 'hidden\n' > "$W/texts/.h.txt"; printf 'nested\n' > "$W/texts/sub/d.txt"
cp "$W/corpus_val.bin" "$W/texts/old_train.bin"; printf 'nested\n' > "$W/notexts/sub/e.txt"
TK=(--tokenizer byte --val-fraction 0 --quiet)
"$ZOFF" tokenize "${TK[@]}" --output-prefix "$W/tk_list" "$W/texts/a.txt" "$W/texts/b.txt" "$W/texts/c.md" >/dev/null 2>&1
"$ZOFF" tokenize "${TK[@]:0:4}" --output-prefix "$W/tk_dir" "$W/texts" >"$W/tk_dir.out" 2>&1
rc=$?
check "tokenize DIR: exit 0, its three files in name order (the same shard as naming them)" \
  "[ $rc -eq 0 ] && grep -q '3 file(s)' '$W/tk_dir.out' && cmp -s '$W/tk_list_train.bin' '$W/tk_dir_train.bin'"
# --quiet is quiet, as export's (before: the 3-line summary still printed); warnings still print (below)
"$ZOFF" tokenize "${TK[@]}" --output-prefix "$W/tk_q" "$W/texts" >"$W/tk_q.out" 2>&1
rc=$?
check "tokenize --quiet: exit 0, nothing printed, the shard written" \
  "[ $rc -eq 0 ] && [ ! -s '$W/tk_q.out' ] && cmp -s '$W/tk_list_train.bin' '$W/tk_q_train.bin'"
"$ZOFF" tokenize "${TK[@]}" --output-prefix "$W/tk_glob" "$W/texts/*.txt" >/dev/null 2>&1
"$ZOFF" tokenize "${TK[@]}" --output-prefix "$W/tk_ab" "$W/texts/a.txt" "$W/texts/b.txt" >/dev/null 2>&1
check "tokenize 'DIR/*.txt': the files it matches, in name order" "cmp -s '$W/tk_ab_train.bin' '$W/tk_glob_train.bin'"
"$ZOFF" tokenize "${TK[@]}" --output-prefix "$W/tk_none" "$W/notexts" >/dev/null 2>"$W/tk_none.err"
rc=$?
check "tokenize of a directory with no files to read: exit 2, says so, nothing written" \
  "[ $rc -eq 2 ] && grep -q 'notexts: the directory holds no files to read' '$W/tk_none.err' && ! ls '$W'/tk_none* 2>/dev/null | grep -q bin"
"$ZOFF" tokenize "${TK[@]}" --output-prefix "$W/tk_none" "$W/texts/*.rst" >/dev/null 2>"$W/tk_none.err"
rc=$?
check "tokenize of a glob that matches nothing: exit 2, says so" \
  "[ $rc -eq 2 ] && grep -q 'no files match this pattern' '$W/tk_none.err'"

# .bin shards: a glob skips them as a directory does; one named is refused, as is an input the run
# would write over (before: read as text, and --output-prefix P P_train.bin replaced its own input)
"$ZOFF" tokenize "${TK[@]}" --output-prefix "$W/tk_globall" "$W/texts/*.*" >/dev/null 2>"$W/tk_ga.err"
rc=$?
check "tokenize 'DIR/*.*' with a .bin shard among the matches: skips it (the same shard as naming the texts)" \
  "[ $rc -eq 0 ] && cmp -s '$W/tk_list_train.bin' '$W/tk_globall_train.bin'"
"$ZOFF" tokenize "${TK[@]}" --output-prefix "$W/tk_shard" "$W/texts/old_train.bin" >/dev/null 2>"$W/tk_sh.err"
rc=$?
check "tokenize of a token shard named: exit 2, says it is a shard, nothing written" \
  "[ $rc -eq 2 ] && grep -q 'old_train.bin is a token shard' '$W/tk_sh.err' && ! ls '$W'/tk_shard* >/dev/null 2>&1"
cp "$W/tk_list_train.bin" "$W/tk_self.keep"; cp "$W/texts/a.txt" "$W/tk_list_val.bin"
"$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$W/tk_list" "$W/tk_list_train.bin" >/dev/null 2>"$W/tk_self.err"
rc=$?
"$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$W/tk_list" "$W/tk_list_val.bin" >/dev/null 2>>"$W/tk_self.err"
rc2=$?
check "tokenize of its own output (P_train.bin, a text P_val.bin): exit 2 naming --output-prefix, both kept" \
  "[ $rc -eq 2 ] && [ $rc2 -eq 2 ] && [ \$(grep -c 'one of the shards --output-prefix .*tk_list names' '$W/tk_self.err') -eq 2 ] \
   && cmp -s '$W/tk_self.keep' '$W/tk_list_train.bin' && cmp -s '$W/texts/a.txt' '$W/tk_list_val.bin'"

# ---- shards an earlier run of the same prefix left (another --shard-size): every one is named, or the
# first, how many more and their pattern (before: only the first, "one past ours")
head -c 3000 "$SRC/README.md" > "$W/st.txt"
"$ZOFF" tokenize "${TK[@]}" --shard-size 200 --output-prefix "$W/st" "$W/st.txt" >/dev/null 2>&1    # 15 shards
"$ZOFF" tokenize "${TK[@]}" --shard-size 1000 --output-prefix "$W/st" "$W/st.txt" >/dev/null 2>"$W/st.err" # 3
check "tokenize over 15 older shards of its prefix: warns of the first, 11 more and their pattern" \
  "grep -q 'st_train_000003.bin and 11 more shards of this prefix (.*st_train\\*.bin) are left from an earlier run' '$W/st.err'"
"$ZOFF" tokenize "${TK[@]}" --shard-size 700 --output-prefix "$W/st2" "$W/st.txt" >/dev/null 2>&1    # 5 shards
"$ZOFF" tokenize "${TK[@]}" --shard-size 1000 --output-prefix "$W/st2" "$W/st.txt" >/dev/null 2>"$W/st2.err" # 3
check "tokenize over 2 older shards: names both" \
  "grep -q 'st2_train_000003.bin and .*st2_train_000004.bin are left from an earlier run' '$W/st2.err'"

# ---- zoff version takes no arguments (before: --json or any word was ignored, exit 0)
for extra in --json extra; do
  "$ZOFF" version $extra >"$W/ver.out" 2>"$W/ver.err"
  rc=$?
  check "zoff version $extra: exit 2 naming it, no version printed" \
    "[ $rc -eq 2 ] && [ ! -s '$W/ver.out' ] && grep -q \"unexpected argument '$extra'\" '$W/ver.err'"
done

# ---- a mistyped option: exit 2 and the option meant (before: only "unknown option"); the
# options come from each command's usage text, so the checks span every command
suggest() { # suggest ARGS... -- WANT: the error names WANT as the option meant
    local want="${@: -1}"; local args=("${@:1:$#-2}")
    "$ZOFF" "${args[@]}" >"$W/typo.out" 2>"$W/typo.err"
    local rc=$?
    check "zoff ${args[*]}: exit 2, did you mean ${want:-nothing}" \
      "[ $rc -eq 2 ] && [ ! -s '$W/typo.out' ] && grep -q \"unknown option '${args[${#args[@]}-1]}'\" '$W/typo.err' && \
       if [ -n '$want' ]; then grep -q -- 'did you mean $want? ' '$W/typo.err'; else ! grep -q 'did you mean' '$W/typo.err'; fi"
}
suggest train --data -- --data-path                 # the one option it begins
suggest train --train-iter -- --train-iters         # one letter short
suggest train --dat-path -- --data-path             # one letter missing inside
suggest train -data-path -- --data-path             # one dash
suggest train --seq-length=8 --hidden=64 -- --hidden-size  # with =value
suggest train --lr -- ""                            # nothing near: no guess
suggest train --num -- ""                           # begins several: no guess
suggest tokenize --output -- --output-prefix
suggest sample --load "$W/done2" --top_k -- --top-k
suggest export --out -- --output
suggest plan --hidden -- --hidden-size
suggest bench adam --mod -- --mode
suggest bench ckpt --round -- --rounds
suggest bench step --num-layer -- --num-layers
suggest bench nvme --sizee -- --size
# flags of DeepSpeed launchers, Megatron-DeepSpeed and the Hugging Face Trainer: where the setting is
elsewhere() { # elsewhere CMD FLAG -- WANT: the error says WANT
    local want="${@: -1}" cmd="$1" flag="$2"
    "$ZOFF" "$cmd" "$flag" 1 >"$W/else.out" 2>"$W/else.err"
    local rc=$?
    check "zoff $cmd $flag: exit 2, says where: $want" \
      "[ $rc -eq 2 ] && [ ! -s '$W/else.out' ] && grep -qF -- \"unknown option '$flag': \" '$W/else.err' && \
       grep -qF -- '$want' '$W/else.err'"
}
elsewhere train --deepspeed_config -- "the DeepSpeed JSON config is --config FILE"
elsewhere train --learning_rate -- "optimizer.params.lr in the --config file"
elsewhere train --max-steps -- "optimizer steps is --train-iters"
elsewhere train --bf16 -- '"bf16": {"enabled": true}'
elsewhere plan --zero_stage -- "zero_optimization.stage"
elsewhere train --output_dir -- "the output folder is --save"
# Hugging Face generate / evaluate and nanoGPT names in eval and sample (before: only "unknown option")
elsewhere eval --eval-iters -- "eval reads every window; --max-batches N stops after N batches"
elsewhere eval --per_device_eval_batch_size -- "the windows per forward are --micro-batch-size"
elsewhere sample --max_length -- "the tokens to generate are --max-new-tokens"
elsewhere sample --num_samples -- "run it again with another --seed"
elsewhere sample --do_sample -- "--temperature 0 is greedy"
elsewhere train --batch-size -- "train_micro_batch_size_per_gpu"
"$ZOFF" sample --load "$W/done2" --lr 1 >/dev/null 2>"$W/else.err"
check "sample (no --config) gives no config hint for --lr" "! grep -q 'optimizer.params' '$W/else.err'"
"$ZOFF" traine >"$W/cmd.out" 2>"$W/cmd.err"
rc=$?
check "a mistyped command: exit 2, did you mean zoff train" \
  "[ $rc -eq 2 ] && grep -q \"unknown command 'traine' (did you mean zoff train?)\" '$W/cmd.err'"
"$ZOFF" bench ada >/dev/null 2>"$W/bench.err"
rc=$?
check "a mistyped benchmark: exit 2, did you mean zoff bench adam" \
  "[ $rc -eq 2 ] && grep -q \"unknown benchmark 'ada' (did you mean zoff bench adam?)\" '$W/bench.err'"
"$ZOFF" help export >"$W/help.out" 2>&1; rc=$?
"$ZOFF" export --help >"$W/help2.out" 2>&1
check "zoff help export: exit 0, the same text as zoff export --help" \
  "[ $rc -eq 0 ] && grep -q '^usage: zoff export' '$W/help.out' && cmp -s '$W/help.out' '$W/help2.out'"

# zoff help CMD WHAT and zoff help version: the specific help (before: bench's list, the general usage)
"$ZOFF" help bench adam >"$W/help.out" 2>&1; rc=$?
"$ZOFF" bench adam --help >"$W/help2.out" 2>&1
check "zoff help bench adam: exit 0, the same text as zoff bench adam --help" \
  "[ $rc -eq 0 ] && grep -q '^usage: zoff bench adam' '$W/help.out' && cmp -s '$W/help.out' '$W/help2.out'"
"$ZOFF" help version >"$W/help.out" 2>&1; rc=$?
"$ZOFF" version --help >"$W/help2.out" 2>&1
check "zoff help version: exit 0, the same text as zoff version --help" \
  "[ $rc -eq 0 ] && grep -q '^usage: zoff version' '$W/help.out' && cmp -s '$W/help.out' '$W/help2.out'"
"$ZOFF" help traine >"$W/help.out" 2>&1; rc=$?
check "zoff help of a mistyped command: exit 2, did you mean zoff train" \
  "[ $rc -eq 2 ] && grep -q \"unknown command 'traine' (did you mean zoff train?)\" '$W/help.out'"

# ---- a mistyped ZOFF_CKPT_IO (docs/architecture.md: ZOFF_CKPT_IO=buffered) is refused before
# training, nothing written (before: the run trained, then failed at its first save, exit 2, its
# training lost and --save created)
ZOFF_CKPT_IO=bufferd "$ZOFF" train "${DATA[@]}" --num-layers 1 --hidden-size 32 --num-attention-heads 2 \
  --seq-length 16 --micro-batch-size 2 --train-iters 2 --save "$W/ckptio" >/dev/null 2>"$W/ckptio.err"
rc=$?
check "ZOFF_CKPT_IO=bufferd: exit 2 before training, naming the variable; --save not created" \
  "[ $rc -eq 2 ] && grep -q \"ZOFF_CKPT_IO='bufferd' is invalid; expected auto .* or buffered\" '$W/ckptio.err' \
   && [ ! -e '$W/ckptio' ]"
ZOFF_CKPT_IO=buffered "$ZOFF" train "${DATA[@]}" --num-layers 1 --hidden-size 32 --num-attention-heads 2 \
  --seq-length 16 --micro-batch-size 2 --train-iters 1 --save "$W/ckptio2" >/dev/null 2>&1
check "ZOFF_CKPT_IO=buffered still trains and saves" "[ $? -eq 0 ] && [ -f '$W/ckptio2/step_00000001/COMPLETE' ]"

# ---- an invalid ZOFF_COMM_TIMEOUT is refused before any work (exit 2, naming the variable and what
# it takes), as --comm-timeout abc is (before: a warning, then the run went on with 300 s)
for v in 30s 0 -5 nan; do
  ZOFF_COMM_TIMEOUT=$v "$ZOFF" train "${DATA[@]}" --num-layers 1 --hidden-size 32 --num-attention-heads 2 \
    --seq-length 16 --micro-batch-size 2 --train-iters 1 --save "$W/ct_$v" >/dev/null 2>"$W/ct.err"
  rc=$?
  check "ZOFF_COMM_TIMEOUT=$v: exit 2 before any work, naming the variable and what it takes; --save not created" \
    "[ $rc -eq 2 ] && grep -q \"ZOFF_COMM_TIMEOUT='$v' is invalid; expected a positive number of seconds\" '$W/ct.err' && [ ! -e '$W/ct_$v' ]" ||
    cat "$W/ct.err"
done
"$ZOFF" train --comm-timeout abc --train-iters 1 >/dev/null 2>&1
check "... as --comm-timeout abc (exit 2)" "[ \$? -eq 2 ]"
ZOFF_COMM_TIMEOUT=30s "$ZOFF" train "${DATA[@]}" --num-layers 1 --hidden-size 32 --num-attention-heads 2 \
  --seq-length 16 --micro-batch-size 2 --train-iters 1 --comm-timeout 60 --save "$W/ct_flag" >/dev/null 2>&1
check "--comm-timeout given: the variable is not used, the run trains" "[ \$? -eq 0 ] && [ -f '$W/ct_flag/step_00000001/COMPLETE' ]"
ZOFF_COMM_TIMEOUT=120 "$ZOFF" train "${DATA[@]}" --num-layers 1 --hidden-size 32 --num-attention-heads 2 \
  --seq-length 16 --micro-batch-size 2 --train-iters 1 --save "$W/ct_ok" >/dev/null 2>&1
check "ZOFF_COMM_TIMEOUT=120 still trains" "[ \$? -eq 0 ] && [ -f '$W/ct_ok/step_00000001/COMPLETE' ]"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
