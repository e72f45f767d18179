#!/usr/bin/env bash
# Writers that run out of room without a full disk of their own (docs/reliability.md, section 4):
# a file size limit (ulimit -f, RLIMIT_FSIZE, as some batch systems set), and injected write faults
# (ZOFF_IO_FAULT) in the writers the checkpoint tests do not cover. Each failure must exit 1 with
# the file named, the error and what to do, leave no temp file, and keep what was there before.
# Portable: no mount, no root. Usage: cli_disk.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
. "$SRC/tests/cli_lib.sh"
W=$(mktemp -d /tmp/zoff-cli-disk-XXXXXX)
trap 'rm -rf "$W"' EXIT
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
check "a checkpoint save past ulimit -f: no temp dir, step 2 still the newest and it resumes" \
  "no_temp && [ \"\$(ls -d run/step_*)\" = run/step_00000002 ] && '$ZOFF' train ${TINY[*]} --train-iters 3 --save run --load run >/dev/null 2>&1"

"$ZOFF" export --load run --output hf/ --quiet && cp hf/model.safetensors before.st
(ulimit -f 8; "$ZOFF" export --load run --output hf/ --quiet) >err.txt 2>&1
check "export past ulimit -f: exit 1 naming the file, the error and the limit" \
  "[ $? -eq 1 ] && grep -q 'hf/model.safetensors.*File too large.*ulimit -f' err.txt"
check "export past ulimit -f: the earlier export kept, no temp file" "cmp -s before.st hf/model.safetensors && no_temp"

# 2. plan --write-config on a full disk: the file named (not only its temp), the disk said full,
#    the old file kept
printf '{"old": 1}' > ds.json
ZOFF_IO_FAULT=ENOSPC@10:ds.json "$ZOFF" plan --num-layers 2 --hidden-size 32 --num-attention-heads 2 \
  --write-config ds.json >/dev/null 2>err.txt
check "plan --write-config on a full disk: exit 1, 'cannot write ds.json', the disk is full" \
  "[ $? -eq 1 ] && grep -q 'cannot write ds.json .*No space left on device; the disk is full' err.txt"
check "plan --write-config on a full disk: the old file kept, no temp file" "[ \"\$(cat ds.json)\" = '{\"old\": 1}' ] && no_temp"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
