#!/usr/bin/env bash
# zoff tokenize on a large corpus: threads (--threads N writes the same shards for any N) and
# memory that does not grow with the corpus (the text read and the tokens written a piece at a
# time). Usage: cli_tokenize.sh ZOFF SRCDIR
set -u
ZOFF=$(readlink -f "$1"); SRC=$(readlink -f "$2")
. "$SRC/tests/cli_lib.sh"
if ! "$PY" -c 'import resource, subprocess' 2>/dev/null; then
    echo "cli_tokenize: SKIPPED: needs python3 to measure the peak memory of a run"
    exit 77
fi
W=$(mktemp -d /tmp/zoff-cli-tokenize-XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W" || exit 1

# varied text: the sources and docs (code, prose, unicode in the docs), about 4 MB
for i in 1 2; do cat "$SRC"/src/*/*.c "$SRC"/docs/*.md "$SRC"/README.md; done > text.txt
printf 'no newline at the end, a long last line' > last.txt

# 1. --threads N: the same shards (tokens, order, train/val split) as one thread
for t in 1 2 3; do
    "$ZOFF" tokenize --threads $t --quiet --shard-size 300000 --val-fraction 0.07 --output-prefix t$t \
        text.txt last.txt >out$t.txt 2>&1 || { bad "tokenize --threads $t: exit 0"; cat out$t.txt; }
done
same=1; n=0
for f in t1_*.bin; do n=$((n + 1)); cmp -s "$f" "t2${f#t1}" && cmp -s "$f" "t3${f#t1}" || same=0; done
check "--threads 2 and 3 write the same $n shards, byte for byte, as --threads 1 (before: no --threads)" \
  "[ $same -eq 1 ] && [ $n -ge 4 ] && [ \$(ls t2_*.bin | wc -l) -eq $n ] && [ \$(ls t3_*.bin | wc -l) -eq $n ]"
OMP_NUM_THREADS=2 "$ZOFF" tokenize --quiet --shard-size 300000 --val-fraction 0.07 --output-prefix te text.txt last.txt
same=1; for f in t1_*.bin; do cmp -s "$f" "te${f#t1}" || same=0; done
check "OMP_NUM_THREADS=2 without --threads: the same shards" "[ $same -eq 1 ]"

"$ZOFF" tokenize --threads 0 --output-prefix bad text.txt >err.txt 2>&1
check "--threads 0: exit 2, says what it must be, nothing written" \
  "[ $? -eq 2 ] && grep -q -- \"--threads '0' must be a whole number in \[1, 1024\]\" err.txt && ! ls bad_* 2>/dev/null"
"$ZOFF" tokenize --threads two --output-prefix bad text.txt >err.txt 2>&1
check "--threads two: exit 2" "[ $? -eq 2 ] && grep -q -- '--threads' err.txt && ! ls bad_* 2>/dev/null"
"$ZOFF" tokenize --help | grep -q -- '--threads N' && ok "--help lists --threads" || bad "--help lists --threads"

# 2. memory: the peak resident memory of a run on 64 MB of text is about that of a run on 16 MB
#    (before: the whole file mapped and every token held, 3 bytes per byte of text with the byte
#    tokenizer: about 140 MB more)
for i in $(seq 1 16); do cat text.txt; done | head -c 64000000 > big.txt
head -c 16000000 big.txt > small.txt
peak() { # peak resident KiB of one zoff tokenize run
    "$PY" -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 else -1)' \
      "$ZOFF" tokenize --tokenizer byte --threads 2 --quiet --output-prefix "$1" "$2"
}
ps=$(peak s small.txt); pb=$(peak b big.txt)
echo "peak resident memory: ${ps} KiB for 16 MB of text, ${pb} KiB for 64 MB"
check "tokenize 64 MB of text: peak memory within 16 MiB of a 16 MB run's" \
  "[ $ps -gt 0 ] && [ $pb -gt 0 ] && [ $((pb - ps)) -lt 16384 ]"
check "tokenize 64 MB of text: every byte a token (train + val)" \
  "[ \$(( \$(stat -c %s b_train.bin) + \$(stat -c %s b_val.bin) - 2048 )) -eq 128000000 ]"

# 3. text without whitespace (minified JSON): cut between a letter or digit and punctuation, so its
#    memory is bounded too (before: the whole file read before the first cut)
"$PY" -c 'import sys
u = "{\"id\":12345,\"it'"'"'s\":[1.5,-2e-3,\"x\"],\"name\":\"caf\u00e9\"},"
sys.stdout.write((u * (32000000 // len(u) + 1))[:32000000])' > min32.json
head -c 8000000 min32.json > min8.json
pm() { # peak resident KiB of a gpt2 run
    "$PY" -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 else -1)' \
      "$ZOFF" tokenize --tokenizer gpt2 --threads 2 --quiet --val-fraction 0 --output-prefix "$1" "$2"
}
p8=$(pm m8 min8.json); p32=$(pm m32 min32.json)
echo "peak resident memory, no whitespace: ${p8} KiB for 8 MB, ${p32} KiB for 32 MB"
check "tokenize 32 MB of text without whitespace: peak memory within 16 MiB of an 8 MB run's" \
  "[ $p8 -gt 0 ] && [ $p32 -gt 0 ] && [ $((p32 - p8)) -lt 16384 ]"
"$ZOFF" tokenize --tokenizer gpt2 --threads 1 --quiet --val-fraction 0 --output-prefix m1 min8.json
check "8 MB without whitespace: the same tokens at 1 and 2 threads" "cmp -s m1_train.bin m8_train.bin"

# 4. Ctrl-C with more than 32 shards' temporary files on disk (a large corpus, --shard-size): none
#    left behind (before: the temp-file registry had 32 places, the 33rd file on stayed)
set -m # a background job with the default SIGINT
"$ZOFF" tokenize --tokenizer byte --threads 2 --quiet --shard-size 1000000 --output-prefix many big.txt \
    >/dev/null 2>&1 &
p=$!; i=0
while ! compgen -G 'many_train_000040.bin.incomplete-*' >/dev/null && kill -0 $p 2>/dev/null && [ $i -lt 200000 ]; do
    i=$((i + 1))
done
kill -STOP -- -$p 2>/dev/null; kill -INT -- -$p 2>/dev/null; kill -CONT -- -$p 2>/dev/null
wait $p; rc=$?
set +m; [ $rc -eq 130 ] && ! compgen -G "many_*" >/dev/null || { echo "rc=$rc i=$i"; ls many_* | head -3; }
check "Ctrl-C with 41 shard temp files on disk: exit 130, no temp file left" \
  "[ $rc -eq 130 ] && ! compgen -G 'many_*' >/dev/null"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
