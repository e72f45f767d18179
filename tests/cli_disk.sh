#!/usr/bin/env bash
# Writers that run out of room without a full disk of their own (docs/reliability.md, section 4):
# a file size limit (ulimit -f, RLIMIT_FSIZE, as some batch systems set), and injected write faults
# (ZOFF_IO_FAULT) in the writers the checkpoint tests do not cover. Each failure must exit 1 with
# the file named, the error and what to do, leave no temp file, and keep what was there before.
# Portable: no mount, no root. Usage: cli_disk.sh ZOFF SRCDIR
set -u
ZOFF=$(readlink -f "$1"); SRC=$(readlink -f "$2") # the checks run in their own folder
. "$SRC/tests/cli_lib.sh"
W=$(mktemp -d /tmp/zoff-cli-disk-XXXXXX)
trap "rm -rf \"$W\"" EXIT; [ -n "${KEEP:-}" ] && trap - EXIT
byte_corpus "$SRC" "$W"
cd "$W" || exit 1
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4
      --tokenizer byte --data-path corpus_train.bin --val-path corpus_val.bin --eval-iters 0 --quiet)
no_temp() { ! find "$W" -name '*tmp*' -o -name '*incomplete*' | grep -q .; } # every writer's temp names

# 1. a file size limit (ulimit -f, in KiB): before, SIGXFSZ killed zoff mid-write (exit 153, no
#    message) and left the temp file behind
mkdir tok && printf 'old shard' > tok/c_train.bin
(ulimit -f 64; "$ZOFF" tokenize --tokenizer byte --quiet --output-prefix tok/c corpus.txt) >err.txt 2>&1
check "tokenize past ulimit -f: exit 1 naming the shard, the error and the limit" \
  "[ $? -eq 1 ] && grep -q 'tok/c_train.bin.*File too large.*ulimit -f' err.txt"
check "tokenize past ulimit -f: the old shard kept, no temp file" "[ \"\$(cat tok/c_train.bin)\" = 'old shard' ] && no_temp"

"$ZOFF" train "${TINY[@]}" --train-iters 2 --save run >/dev/null 2>&1 || bad "a first run trains"
(ulimit -f 64; "$ZOFF" train "${TINY[@]}" --train-iters 4 --save run --load run) >err.txt 2>&1
check "a checkpoint save past ulimit -f: exit 1 naming the rank file, the error and the limit" \
  "[ $? -eq 1 ] && grep -q 'rank_00000.zckpt.*File too large.*ulimit -f' err.txt"
check "a checkpoint save past ulimit -f: says which step is saved and how to go on (before: not said)" \
  "grep -q 'step 2 is saved under run: once that is fixed, go on with --load run' err.txt"
check "a checkpoint save past ulimit -f: no temp dir, step 2 still the newest and it resumes" \
  "no_temp && [ \"\$(ls -d run/step_*)\" = run/step_00000002 ] && '$ZOFF' train ${TINY[*]} --train-iters 3 --save run --load run >/dev/null 2>&1"

"$ZOFF" export --load run --output hf/ --quiet && cp hf/model.safetensors before.st
(ulimit -f 8; "$ZOFF" export --load run --output hf/ --quiet) >err.txt 2>&1
check "export past ulimit -f: exit 1 naming the file, the error and the limit" \
  "[ $? -eq 1 ] && grep -q 'hf/model.safetensors.*File too large.*ulimit -f' err.txt"
check "export past ulimit -f: the earlier export kept, no temp file" "cmp -s before.st hf/model.safetensors && no_temp"

# A model folder (export --output DIR/) is all or nothing too: before, model.safetensors and
# config.json were renamed into place before the tokenizer's files were written, and a write that
# failed there left the new weights beside the old config.json (or a fresh folder without a
# tokenizer). The model file (bf16, 0.8 MB) fits under the limit, vocab.json (1 MB) does not.
head -c 100000 corpus.txt > g.txt && "$ZOFF" tokenize --tokenizer gpt2 --quiet --output-prefix g g.txt
G=(--num-layers 1 --hidden-size 8 --num-attention-heads 2 --seq-length 16 --tokenizer gpt2 --data-path g_train.bin
   --eval-iters 0 --quiet --save grun)
"$ZOFF" train "${G[@]}" --train-iters 1 >/dev/null 2>&1 && "$ZOFF" export --load grun --output ghf/ --quiet || bad "a gpt2 model exports"
md5sum ghf/* > ghf.md5
"$ZOFF" train "${G[@]}" --train-iters 2 --load grun >/dev/null 2>&1 || bad "a gpt2 model trains on"
(ulimit -f 1000; "$ZOFF" export --load grun --output ghf/ --dtype bf16 --quiet) >err.txt 2>&1
check "export into a model folder past ulimit -f: exit 1 naming vocab.json and the limit" \
  "[ $? -eq 1 ] && grep -q 'cannot write ghf/vocab.json.*File too large.*ulimit -f' err.txt"
check "export into a model folder past ulimit -f: every file of the earlier export as it was, no temp file" \
  "md5sum -c --quiet ghf.md5 && [ \$(ls ghf | wc -l) -eq 5 ] && no_temp"
(ulimit -f 1000; "$ZOFF" export --load grun --output ghf2/ --dtype bf16 --quiet) >/dev/null 2>&1
check "export into a new model folder past ulimit -f: exit 1, no folder left" "[ $? -eq 1 ] && [ ! -e ghf2 ]"

# 2. plan --write-config on a full disk: the file named (not only its temp), the disk said full,
#    the old file kept
printf '{"old": 1}' > ds.json
ZOFF_IO_FAULT=ENOSPC@10:ds.json "$ZOFF" plan --num-layers 2 --hidden-size 32 --num-attention-heads 2 \
  --write-config ds.json >/dev/null 2>err.txt
check "plan --write-config on a full disk: exit 1, 'cannot write ds.json', the disk is full" \
  "[ $? -eq 1 ] && grep -q 'cannot write ds.json .*No space left on device; the disk is full' err.txt"
check "plan --write-config on a full disk: the old file kept, no temp file" "[ \"\$(cat ds.json)\" = '{\"old\": 1}' ] && no_temp"

# 3. the monitors (tensorboard, csv_monitor) on a full disk: before, a csv row cut by a full disk
#    stayed, and the resumed run's next row was appended to it ("1" + "12,5.2" = "112,5.2": a point
#    at 112 samples that was never trained); the event file likewise ended in half a record
printf '{"train_micro_batch_size_per_gpu": 4, "tensorboard": {"enabled": true, "output_path": "mon", "job_name": "tb"},
 "csv_monitor": {"enabled": true, "output_path": "mon", "job_name": "csv"}}' > mon.json
CSV=mon/csv/Train_Samples_train_loss.csv
"$ZOFF" train "${TINY[@]}" --config mon.json --train-iters 3 --save mrun >/dev/null 2>&1 || bad "3 steps with the monitors"
at=$(( $(stat -c %s $CSV) + 1 )) # one byte into the next row
ZOFF_IO_FAULT=ENOSPC@$at:Train_Samples_train_loss.csv "$ZOFF" train "${TINY[@]}" --config mon.json \
  --train-iters 6 --save mrun --load mrun >err.txt 2>&1
check "csv_monitor on a full disk: exit 1 naming the csv file, the disk full" \
  "[ $? -eq 1 ] && grep -q 'csv_monitor: cannot write .*Train_Samples_train_loss.csv: No space left on device; the disk is full' err.txt"
check "csv_monitor on a full disk: says which step is saved and how to go on" \
  "grep -q 'step 3 is saved under mrun: once that is fixed, go on with --load mrun' err.txt"
check "csv_monitor on a full disk: the file ends in a whole row" "[ \"\$(tail -c 2 $CSV | od -An -c | tr -d ' ')\" = '\\r\\n' ]"
"$ZOFF" train "${TINY[@]}" --config mon.json --train-iters 6 --save mrun --load mrun >/dev/null 2>&1 || bad "the resume to 6"
# every row is "samples,loss" at the samples before a step (0, 4, ... 20: micro-batch 4), each step there
rows=$(tail -n +2 $CSV | tr -d '\r' | grep -cvE '^(0|4|8|12|16|20),[0-9.e+-]+$')
check "after the resume every csv row is a step's, each step has one" \
  "[ $rows -eq 0 ] && [ \"\$(tail -n +2 $CSV | cut -d, -f1 | sort -nu | tr '\n' ' ')\" = '0 4 8 12 16 20 ' ]"
ZOFF_IO_FAULT=ENOSPC@100:events.out.tfevents "$ZOFF" train "${TINY[@]}" --config mon.json \
  --train-iters 9 --save mrun --load mrun >err.txt 2>&1
check "tensorboard on a full disk: exit 1 naming the event file, the disk full" \
  "[ $? -eq 1 ] && grep -q 'tensorboard: cannot write .*events.out.tfevents.*the disk is full' err.txt"
# TFRecord framing: 8-byte length, 4-byte CRC, the event, 4-byte CRC; every file is whole records
cat > frames.py <<'PY'
import glob, struct, sys
for path in glob.glob("mon/tb/events.out.tfevents.*"):
    b, i = open(path, "rb").read(), 0
    while i + 12 <= len(b):
        i += 12 + struct.unpack_from("<Q", b, i)[0] + 4
    if i != len(b):
        sys.exit("%s: %d bytes, records end at %d" % (path, len(b), i))
PY
check "tensorboard on a full disk: every event file ends in a whole record" "'$PY' frames.py"

# 5. Ctrl-C (SIGINT) or a stopped job (SIGTERM) while a temp file is being written: exit 130 / 143
#    and the temp file removed (before: tokenize's P_train.bin.incomplete-PID.tmp.XXXXXX, export's
#    FILE.tmp-PID and bench ckpt's zoff-bench-ckpt.XXXXXX folder stayed, as large as the output).
#    The process is stopped (SIGSTOP) as soon as its temp file appears, then signalled (with its
#    children: bench nvme's fio).
set -m # background jobs with the default SIGINT (a script's are started with SIGINT ignored)
interrupt() { # SIG GLOB CMD...: run CMD, signal it once GLOB matches; its exit status in $rc
  local sig="$1" glob="$2"; shift 2
  "$@" >/dev/null 2>&1 &
  local p=$! i=0
  while ! compgen -G "$glob" >/dev/null && kill -0 $p 2>/dev/null && [ $i -lt 200000 ]; do i=$((i + 1)); done
  kill -STOP -- -$p 2>/dev/null; kill -"$sig" -- -$p 2>/dev/null; kill -CONT -- -$p 2>/dev/null # its process group, as a terminal does
  wait $p; rc=$?; [ -n "${KEEP:-}" ] && { echo "rc=$rc i=$i"; find "$W" -name "*tmp*" -o -name "*incomplete*"; } >&2
}
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14; do cat corpus.txt; done > big.txt
interrupt INT 'tok/c_train.bin.*' "$ZOFF" tokenize --tokenizer byte --quiet --output-prefix tok/c big.txt
check "tokenize interrupted (SIGINT) while writing its shard: exit 130, the old shard kept, no temp file" \
  "[ $rc -eq 130 ] && [ \"\$(cat tok/c_train.bin)\" = 'old shard' ] && no_temp"
"$ZOFF" train --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1 \
  --tokenizer byte --data-path corpus_train.bin --eval-iters 0 --quiet --train-iters 1 --save wide >/dev/null 2>&1
interrupt INT 'w.safetensors.tmp-*' "$ZOFF" export --load wide --output w.safetensors
check "export interrupted (SIGINT) while writing: exit 130, no file, no temp file" "[ $rc -eq 130 ] && [ ! -e w.safetensors ] && no_temp"
mkdir bench
interrupt TERM 'bench/zoff-bench-ckpt.*' "$ZOFF" bench ckpt --dir bench --num-layers 2 --hidden-size 64 \
  --num-attention-heads 2 --vocab-size 256 --max-position-embeddings 64 --rounds 1
check "bench ckpt stopped (SIGTERM): exit 143, its folder removed" "[ $rc -eq 143 ] && [ -z \"\$(ls bench)\" ]"
if command -v fio >/dev/null 2>&1; then
  interrupt INT 'bench/zoff-bench-fio-*.dat' "$ZOFF" bench nvme --dir bench --size 8MiB --rounds 1
  check "bench nvme interrupted (SIGINT) in fio's pass: exit 130, fio's file removed" \
    "[ $rc -eq 130 ] && [ -z \"\$(ls bench)\" ]"
else echo "skip - bench nvme interrupted: no fio here"; fi
set +m

# 4. the same on a really full disk (a tmpfs of 8 KiB for the csv files, in a private mount
#    namespace; skipped where mounting is not allowed): the row the disk cut is gone after the resume
cat > inner.sh <<'INNER'
set -u
ZOFF="$1"; mkdir -p m; mount -t tmpfs -o size=8k tmpfs m || exit 77
printf '{"train_micro_batch_size_per_gpu": 4, "csv_monitor": {"enabled": true, "output_path": "m", "job_name": "c"}}' > full.json
T=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --tokenizer byte --data-path corpus_train.bin
   --eval-iters 0 --quiet --config full.json --save frun --save-interval 5)
"$ZOFF" train "${T[@]}" --train-iters 1000 >ferr.txt 2>&1; rc=$?
mount -o remount,size=1m m
last=$(ls -d frun/step_* | tail -1); n=$(( 10#${last##*_} + 5 ))
"$ZOFF" train "${T[@]}" --train-iters $n --load frun >/dev/null 2>&1 || echo "resume failed"
# the samples before each step 1..n: 0, 4, ..., 4(n-1), each a row "samples,loss" (some twice: redone steps)
want=$(seq 0 4 $(( 4 * (n - 1) )) | tr '\n' ' ')
got=$(tail -n +2 m/c/Train_Samples_train_loss.csv | tr -d '\r' | grep -E '^[0-9]+,[0-9.e+-]+$' | cut -d, -f1 | sort -nu | tr '\n' ' ')
rows=$(tail -n +2 m/c/Train_Samples_train_loss.csv | grep -cvE '^[0-9]+,[0-9.e+-]+.$')
echo "rc=$rc rows=$rows $( [ "$want" = "$got" ] && echo same || echo "differ: got $got" )"
umount m
INNER
if unshare --user --map-root-user --mount true 2>/dev/null; then NS=(unshare --user --map-root-user --mount)
elif [ "$(id -u)" -eq 0 ] && unshare --mount true 2>/dev/null; then NS=(unshare --mount)
else NS=(); fi
out=""; rc=77
if [ ${#NS[@]} -gt 0 ]; then out=$("${NS[@]}" bash inner.sh "$ZOFF" 2>&1); rc=$?; fi
if [ $rc -eq 77 ]; then echo "skip - csv_monitor on a really full disk: cannot mount a tmpfs here"
else
  check "csv_monitor on a really full disk: exit 1 naming the csv file, the disk full" \
    "echo '$out' | grep -q '^rc=1 ' && grep -q 'csv_monitor: cannot write .*No space left on device; the disk is full' ferr.txt"
  check "csv_monitor on a really full disk: after the resume every row is whole, at a step's samples" \
    "echo '$out' | grep -q ' rows=0 same$'"
  echo "$out" | grep -q ' rows=0 same$' || echo "  $out" | cut -c1-400
fi

# 5. the benchmarks on a full disk (a tmpfs of 2 MiB, the same namespace): the advice is the
#    benchmark's (free space in --dir, another --dir, a smaller size), not a training run's (before:
#    "keep fewer checkpoints (--keep-last)" and "point its nvme_path (offload_optimizer or offload_param)")
cat > inner_bench.sh <<'INNER'
set -u
ZOFF="$1"; mkdir -p b; mount -t tmpfs -o size=2m tmpfs b || exit 77
"$ZOFF" bench ckpt --dir b --num-layers 2 --hidden-size 128 --num-attention-heads 2 --vocab-size 256 \
  --max-position-embeddings 64 --rounds 1 >/dev/null 2>bc.txt; echo "ckpt=$?"
"$ZOFF" bench nvme --dir b --size 8MiB --no-fio --no-step --rounds 1 >/dev/null 2>bn.txt; echo "nvme=$?"
"$ZOFF" bench nvme --dir b --size 256KiB --no-fio --rounds 1 --iters 1 --num-layers 2 --hidden-size 256 \
  --num-attention-heads 2 --vocab-size 256 >/dev/null 2>bs.txt; echo "steps=$?"
echo "left=$(ls -A b | wc -l)"
umount b
INNER
out=""; rc=77
if [ ${#NS[@]} -gt 0 ]; then out=$("${NS[@]}" bash inner_bench.sh "$ZOFF" 2>&1); rc=$?; fi
if [ $rc -eq 77 ]; then echo "skip - the benchmarks on a really full disk: cannot mount a tmpfs here"
else
  check "bench ckpt on a full --dir: exit 1, refused before writing (its 2 MiB < a round), the advice free space in b, another --dir, a smaller model" \
    "echo '$out' | grep -q '^ckpt=1$' && grep -q 'bench ckpt: --dir b has 2.00 MiB free, but each round writes at least .*; free space in b, give another --dir, or measure a smaller model (--num-layers' bc.txt \
     && ! grep -q 'keep-last' bc.txt" || cat bc.txt
  check "bench nvme on a full --dir: exit 1, the swap file's size, the advice free space in b, another --dir, a smaller --size" \
    "echo '$out' | grep -q '^nvme=1$' && grep -q 'disk full: swap file b/.* needs .*: free space in b, give another --dir, or a smaller --size' bn.txt \
     && ! grep -q 'nvme_path' bn.txt" || cat bn.txt
  check "bench nvme's steps on a full --dir: exit 1, the same advice (not another nvme_path)" \
    "echo '$out' | grep -q '^steps=1$' && grep -q 'steps: .*disk full: swap file .*: free space in b, give another --dir, or a smaller --size (for the steps, a smaller model' bs.txt \
     && ! grep -q 'nvme_path' bs.txt" || cat bs.txt
  check "the benchmarks on a full --dir leave nothing there" "echo '$out' | grep -q '^left=0$'" || echo "$out"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
