#!/usr/bin/env bash
# Steps during a periodic background save against the other steps of the same run (paired
# within the run), for one or more zoff binaries alternated round by round.
#
#   bash bench/ckpt_overlap.sh [--rounds 3] [--dir /tmp/zoff-overlap] NAME=BINARY[:NICE] ...
#   e.g. bash bench/ckpt_overlap.sh new=build/zoff new10=build/zoff:10 old=/path/to/old/zoff
#
# GPT-2 12 x 768 (checkpoint 1.02 GB), byte tokenizer, seq 64, micro-batch 1, bf16, stage 2,
# optimizer on the CPU; 13 steps, a save every 4 (after steps 4, 8, 12: steps 5, 9, 13 overlap
# them). Per run: the three overlapped steps' step_time and ckpt_wait, and their median against
# the median of the other steps >= 2. NICE sets ZOFF_CKPT_WRITER_NICE for that binary.
set -uo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
D=/tmp/zoff-overlap; ROUNDS=3; K=4; STEPS=13; RUNS=()
while [ $# -gt 0 ]; do
  case "$1" in --rounds) ROUNDS="$2"; shift ;; --dir) D="$2"; shift ;; *=*) RUNS+=("$1") ;;
    *) echo "unknown option $1" >&2; exit 2 ;; esac
  shift
done
[ ${#RUNS[@]} -gt 0 ] || RUNS=("new=$SRC/build/zoff")
FIRST="${RUNS[0]#*=}"; FIRST="${FIRST%%:*}"
source "$SRC/bench/ckpt_common.sh"
trap 'rm -rf "$D"' EXIT
ckpt_bench_setup "$D" "$FIRST" || exit 1
for r in $(seq 1 "$ROUNDS"); do
  for spec in "${RUNS[@]}"; do
    name="${spec%%=*}"; bin="${spec#*=}"; nice=0
    case "$bin" in *:*) nice="${bin##*:}"; bin="${bin%:*}" ;; esac
    rm -rf "$D/run"
    la=$(cut -d' ' -f1 /proc/loadavg)
    ZOFF_CKPT_WRITER_NICE="$nice" "$bin" train --num-layers 12 --hidden-size 768 --num-attention-heads 12 \
      --seq-length 64 --tokenizer byte --data-path "$D/corpus_train.bin" --eval-iters 0 --quiet \
      --config "$D/cfg.json" --train-iters "$STEPS" --save-interval "$K" --save "$D/run" 2>"$D/err.txt" ||
      { cat "$D/err.txt"; exit 1; }
    python3 - "$D/run/metrics.jsonl" "$K" "$name" "$r" "$la" <<'EOP'
import json, statistics, sys
K = int(sys.argv[2])
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_time"' in l]
rows = [r for r in rows if r["step"] >= 2]
after = [r for r in rows if (r["step"] - 1) % K == 0]
other = [r for r in rows if (r["step"] - 1) % K != 0]
sa, so = statistics.median(r["step_time"] for r in after), statistics.median(r["step_time"] for r in other)
print("round %s %-8s load %s: overlapped steps %s s (median %.3f, ckpt_wait %s), others median %.3f -> %.2fx" % (
    sys.argv[4], sys.argv[3], sys.argv[5], " ".join("%.2f" % r["step_time"] for r in after), sa,
    " ".join("%.2f" % r.get("ckpt_wait", 0) for r in after), so, sa / so), flush=True)
EOP
  done
done
