#!/bin/bash
# zoff tokenize (GPT-2 BPE) at 1 thread and at T threads against the independent Python reference
# (tests/fixtures/gen_bpe_fixture.py: OpenAI's encoder.py algorithm with the `regex` module, one
# process, as encoder.py runs) on the same text. The three run next to each other, --rounds times
# (the order rotating), and each ratio is taken of a round's pair and reported as the median with
# its min and max by `zoff bench pairs`. zoff's rate is its own summary line's (reading, encoding
# and writing the shards; not loading the tables), the reference's is its encode() call's. The
# first round also checks that the three give the same tokens.
#
# usage: bench/tokenize_speed.sh [--zoff BIN] [--text FILE] [--mb N] [--threads T] [--rounds R]
#   --text FILE  the text (UTF-8); default: N MB of this repository's sources and docs, repeated
#   --mb N       the default text's size in MB (default 8)
#   --threads T  zoff's many-thread run (default: nproc)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
zoff=${ZOFF:-$here/../build/zoff}
text="" mb=8 threads=$(nproc) rounds=3
while [ $# -gt 0 ]; do
    case "$1" in
        --zoff) zoff=$2; shift 2 ;;
        --text) text=$2; shift 2 ;;
        --mb) mb=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "tokenize_speed.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -x "$zoff" ] || { echo "tokenize_speed.sh: $zoff is not built (cmake --build build)" >&2; exit 2; }
/usr/bin/python3 -c 'import regex' 2>/dev/null ||
    { echo "tokenize_speed.sh: the reference needs python3-regex (apt-get install python3-regex)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "$text" ]; then
    text=$tmp/text.txt
    while [ "$(stat -c %s "$text" 2>/dev/null || echo 0)" -lt $((mb * 1000000)) ]; do
        cat "$here"/../src/*/*.c "$here"/../docs/*.md "$here"/../README.md >> "$text"
    done
    head -c $((mb * 1000000)) "$text" > "$tmp/t" && mv "$tmp/t" "$text"
fi
zoff_round() { # THREADS ROUND: MB/s from the summary line
    "$zoff" tokenize --tokenizer gpt2 --threads "$1" --val-fraction 0 --output-prefix "$tmp/z$1" "$text" \
        | sed -n 's/.*(\([0-9.]*\) MB\/s)$/\1/p' > "$tmp/zoff$1_$2"
}
ref_round() { # ROUND: MB/s of encode(); in round 1 the ids too
    /usr/bin/python3 - "$here/../tests/fixtures" "$text" "$tmp" "$1" <<'PY' > "$tmp/ref_$1"
import os, sys, time
sys.path.insert(0, sys.argv[1])
import gen_bpe_fixture as g
enc = g.load_encoder()
raw = open(sys.argv[2], "rb").read()
t = raw.decode("utf-8")
t0 = time.perf_counter()
ids = enc.encode(t)
dt = time.perf_counter() - t0
if sys.argv[4] == "1":
    import array
    array.array("H", ids).tofile(open(os.path.join(sys.argv[3], "ref_ids.u16"), "wb"))
print(len(raw) / dt / 1e6)
PY
}
for r in $(seq 1 "$rounds"); do
    case $((r % 3)) in
        1) zoff_round 1 "$r"; zoff_round "$threads" "$r"; ref_round "$r" ;;
        2) zoff_round "$threads" "$r"; ref_round "$r"; zoff_round 1 "$r" ;;
        0) ref_round "$r"; zoff_round 1 "$r"; zoff_round "$threads" "$r" ;;
    esac
    if [ "$r" -eq 1 ]; then # the shards: header, <|endoftext|>, then the text's tokens
        tail -c +1027 "$tmp/z1_train.bin" > "$tmp/z1.u16"; tail -c +1027 "$tmp/z${threads}_train.bin" > "$tmp/zt.u16"
        same=no; cmp -s "$tmp/z1.u16" "$tmp/ref_ids.u16" && cmp -s "$tmp/zt.u16" "$tmp/ref_ids.u16" && same=yes
    fi
done
col() { for r in $(seq 1 "$rounds"); do cat "$tmp/$1_$r"; done; }
paste -d' ' <(col "zoff$threads") <(col zoff1) | "$zoff" bench pairs > "$tmp/threads.json"
paste -d' ' <(col zoff1) <(col ref) | "$zoff" bench pairs > "$tmp/one_ref.json"
paste -d' ' <(col "zoff$threads") <(col ref) | "$zoff" bench pairs > "$tmp/all_ref.json"
/usr/bin/python3 - "$tmp" "$text" "$threads" "$rounds" "$same" <<'PY'
import json, os, sys
d, text, threads, rounds, same = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
j = {k: json.load(open(f"{d}/{k}.json")) for k in ("threads", "one_ref", "all_ref")}
print(f"{os.path.getsize(text) / 1e6:.1f} MB of text, {rounds} rounds next to each other, "
      f"{os.cpu_count()} CPUs; the same tokens from all three: {same}")
print(f"  zoff tokenize --threads 1     {j['one_ref']['a_median']:8.1f} MB/s")
print(f"  zoff tokenize --threads {threads:<5d} {j['threads']['a_median']:8.1f} MB/s  "
      f"{j['threads']['ratio_median']:.2f}x one thread ({j['threads']['ratio_min']:.2f}..{j['threads']['ratio_max']:.2f})")
print(f"  Python reference (encoder.py) {j['one_ref']['b_median']:8.2f} MB/s")
for k, name in (("one_ref", "1 thread"), ("all_ref", f"{threads} threads")):
    print(f"  zoff at {name} / the reference: {j[k]['ratio_median']:.1f}x ({j[k]['ratio_min']:.1f}..{j[k]['ratio_max']:.1f})")
for k in j:
    if not j[k]["steady"]:
        print(f"    {k}: {j[k]['verdict']}")
sys.exit(0 if same == "yes" else 1)
PY
