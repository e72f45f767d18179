#!/usr/bin/env bash
# Training step time while a periodic checkpoint is being written by the background writer,
# against no periodic save and against the synchronous writer (--sync-save), runs interleaved;
# and fio's sequential write bound of the same directory.
#
#   bash bench/ckpt_background.sh [--zoff build/zoff] [--dir /tmp/zoff-bgbench] [--rounds 2]
#                                 [--steps 7] [--interval 3] [--layers 12] [--hidden 768]
#
# Model: GPT-2 shape LAYERS x HIDDEN, byte tokenizer, seq 64, micro-batch 1, bf16, ZeRO stage 2
# with the optimizer on the CPU (the configuration whose periodic saves go to the background).
# A periodic save every INTERVAL steps. Per run, from metrics.jsonl (step 1 warms up and is left
# out): the median step_time of the steps right after a save point (with the background writer
# their forward/backward overlap the save and their ckpt_wait is what was not hidden) and of
# the others; and the run's wall time after start-up, whose excess over the run without
# periodic saves, per save, is what a save costs the training. Medians over the rounds.
set -uo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
ZOFF="$SRC/build/zoff"; DIR=/tmp/zoff-bgbench; ROUNDS=2; STEPS=7; K=3; LAYERS=12; HIDDEN=768
while [ $# -gt 0 ]; do
  case "$1" in
    --zoff) ZOFF="$2"; shift ;; --dir) DIR="$2"; shift ;; --rounds) ROUNDS="$2"; shift ;;
    --steps) STEPS="$2"; shift ;; --interval) K="$2"; shift ;; --layers) LAYERS="$2"; shift ;; --hidden) HIDDEN="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
PY=$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3)
source "$SRC/bench/ckpt_common.sh"
trap 'rm -rf "$DIR"' EXIT
ckpt_bench_setup "$DIR" "$ZOFF" || exit 1
T=(train --num-layers "$LAYERS" --hidden-size "$HIDDEN" --num-attention-heads 12 --seq-length 64 --tokenizer byte
   --data-path "$DIR/corpus_train.bin" --eval-iters 0 --quiet --config "$DIR/cfg.json" --train-iters "$STEPS")
stats() { # metrics.jsonl interval -> median step_time of steps >= 2 right after a save point (the
          # ones a save overlaps) and of the others, median ckpt_wait of the first, start-up time
  "$PY" - "$1" "$2" <<'EOF'
import json, statistics, sys
K = int(sys.argv[2])
rows = [json.loads(l) for l in open(sys.argv[1])]
up = [r["startup_time"] for r in rows if "startup_time" in r][-1]
rows = [r for r in rows if "step_time" in r and r["step"] >= 2]
after = [r for r in rows if (r["step"] - 1) % K == 0]
other = [r for r in rows if (r["step"] - 1) % K != 0]
m = lambda v: statistics.median(v) if v else float("nan")
print("%.3f %.3f %.3f %.3f" % (m([r["step_time"] for r in after]), m([r["step_time"] for r in other]),
                               m([r.get("ckpt_wait", 0) for r in after]), up))
EOF
}
declare -A loop=() during=() plain=()
for r in $(seq 1 "$ROUNDS"); do
  for mode in none background sync; do
    case "$mode" in none) extra=() ;; background) extra=(--save-interval "$K") ;;
                    sync) extra=(--save-interval "$K" --sync-save) ;; esac
    rm -rf "$DIR/run"
    t0=$(date +%s%N)
    "$ZOFF" "${T[@]}" "${extra[@]}" --save "$DIR/run" 2>"$DIR/err.txt" || { cat "$DIR/err.txt"; exit 1; }
    wall=$(( ($(date +%s%N) - t0) / 1000000 ))
    read -r sa so cw up < <(stats "$DIR/run/metrics.jsonl" "$K")
    size=$(du -sb "$DIR/run/step_$(printf %08d "$STEPS")" | cut -f1)
    lp=$(awk -v w="$wall" -v u="$up" 'BEGIN{printf "%.3f", w / 1000 - u}')
    echo "round $r $mode: wall after start-up $lp s; step_time median: steps after a save point $sa s," \
         "others $so s; ckpt_wait $cw s; checkpoint $size bytes"
    loop[$mode]="${loop[$mode]:-} $lp"; during[$mode]="${during[$mode]:-} $sa"; plain[$mode]="${plain[$mode]:-} $so"
  done
done
med() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
saves=$(( (STEPS - 1) / K ))
ln=$(med "${loop[none]}"); lb=$(med "${loop[background]}"); ls=$(med "${loop[sync]}")
dn=$(med "${during[none]} ${plain[none]}"); db=$(med "${during[background]}")
echo "medians over $ROUNDS round(s), $saves periodic save(s) per run:"
echo "  step time: no periodic save $dn s; a step while a background save is in flight $db s" \
     "($(awk -v a="$db" -v c="$dn" 'BEGIN{printf "%.2f", a/c}')x)"
echo "  run after start-up: none $ln s, background $lb s (+$(awk -v a="$lb" -v c="$ln" -v n="$saves" 'BEGIN{printf "%.2f", (a-c)/n}') s per save)," \
     "sync $ls s (+$(awk -v a="$ls" -v c="$ln" -v n="$saves" 'BEGIN{printf "%.2f", (a-c)/n}') s per save)"
if command -v fio >/dev/null; then
  fio --name=bound --directory="$DIR" --rw=write --bs=8M --size="${size:-1G}" --direct=1 --end_fsync=1 \
      --ioengine=psync --output-format=terse --terse-version=3 2>/dev/null |
    awk -F';' '{printf "fio sequential write bound (O_DIRECT, 8 MiB, fsync): %.3f GB/s\n", $48 * 1024 / 1e9}'
fi
