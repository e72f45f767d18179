#!/usr/bin/env bash
# ZeRO stage 3 parameter offload: offload_param "cpu" against "nvme" (ZeRO-Infinity), one rank,
# CPU backend, the optimizer on the host in both; the two runs sit next to each other ROUNDS times
# (the order alternating) and the ratio of each round's medians (steps after the first two) is
# summarised by `zoff bench pairs`: median with min and max, and a note when they spread too wide. Disk traffic per step of the nvme run:
# the 16-bit partition read once per forward and once per backward (groups gathered on use,
# max_in_cpu 0) and written once after the update.
# Usage: bench/stage3_param_nvme.sh ZOFF [ROUNDS] [STEPS] [DIR]   (docs/performance.md, "NVMe offload")
set -eu
ZOFF=$(realpath "$1"); ROUNDS=${2:-3}; STEPS=${3:-8}; DIR=${4:-/tmp}
SRC=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d "$DIR/zoff-bench-s3-XXXXXX")
trap 'rm -rf "$W"' EXIT
cat "$SRC"/src/*/*.c "$SRC"/src/*/*/*.c "$SRC"/include/zoff/*.h > "$W/corpus.txt"
"$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$W/corpus" "$W/corpus.txt" >/dev/null
MODEL=(--num-layers 6 --hidden-size 384 --num-attention-heads 6 --seq-length 128 --tokenizer byte
       --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 0)
cfg() { # name offload_param-json
  echo "{\"train_micro_batch_size_per_gpu\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}},
         \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 3,
         \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": $2}}" > "$W/$1.json"
}
cfg cpu '{"device": "cpu"}'
cfg nvme "{\"device\": \"nvme\", \"nvme_path\": \"$W/swap\", \"max_in_cpu\": 0, \"buffer_count\": 4}"
echo "machine: $(nproc) cores; swap files in $DIR ($(df -T "$DIR" | awk 'NR==2 {print $2}')); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  order="cpu nvme"; [ $((r % 2)) -eq 0 ] && order="nvme cpu"
  for c in $order; do
    "$ZOFF" train "${MODEL[@]}" --config "$W/$c.json" --train-iters "$STEPS" --save "$W/${c}_$r" >"$W/${c}_$r.txt" 2>&1
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
grep -h "parameters on" "$W/cpu_1.txt" | head -1 || true
grep -h "^zoff: memory" "$W/cpu_1.txt" "$W/nvme_1.txt" || true
/usr/bin/python3 - "$W" "$ROUNDS" > "$W/report.txt" <<'PY'
import json, statistics, sys
W, R = sys.argv[1], int(sys.argv[2])
def steps(path): return [json.loads(l) for l in open(path) if '"loss"' in l][2:]
med = lambda xs: statistics.median(xs) if xs else float("nan")
rows = {}
print("\n| offload_param | step (s) | forward | backward | host step | tokens/s |")
print("|---|---|---|---|---|---|")
for c in ("cpu", "nvme"):
    s = [x for r in range(1, R + 1) for x in steps("%s/%s_%d/metrics.jsonl" % (W, c, r))]
    rows[c] = s
    print("| %s | %.3f | %.3f | %.3f | %.3f | %.0f |" % (c, med([x["step_time"] for x in s]), med([x["forward"] for x in s]),
          med([x["backward"] for x in s]), med([x["host_step"] for x in s]), med([x["tokens_per_s"] for x in s])))
with open("%s/pairs.txt" % W, "w") as f:
    for r in range(1, R + 1):
        a = med([x["step_time"] for x in steps("%s/cpu_%d/metrics.jsonl" % (W, r))])
        b = med([x["step_time"] for x in steps("%s/nvme_%d/metrics.jsonl" % (W, r))])
        f.write("%.9g %.9g\n" % (b, a))
same = all(abs(x["loss"] - y["loss"]) == 0 for x, y in zip(steps("%s/cpu_1/metrics.jsonl" % W), steps("%s/nvme_1/metrics.jsonl" % W)))
print("losses of round 1 identical (cpu vs nvme): %s" % same)
PY
cat "$W/report.txt"
"$ZOFF" bench pairs < "$W/pairs.txt" | /usr/bin/python3 -c '
import json, sys
p = json.load(sys.stdin)
print("nvme / cpu step time, paired per round: median %.2f (min %.2f, max %.2f, %d rounds)" % (
    p["ratio_median"], p["ratio_min"], p["ratio_max"], p["rounds"]))
if not p["steady"]: print("  " + p["verdict"])'
