#!/usr/bin/env bash
# Data-parallel step time on this machine (CPU backend): 1 rank at micro-batch 2b
# against 2 ranks (mpirun -np 2) at micro-batch b, ZeRO stage 2 with the optimizer
# offloaded to the host, without and with round_robin_gradients; the three runs are
# interleaved ROUNDS times and the medians of the steps after the first two are
# reported, with each rank's gradient-stream timeline (grad_timeline_rank_N.jsonl).
# Usage: scripts/bench_dp.sh ZOFF [ROUNDS] [STEPS]     (docs/performance.md, "Data parallel")
set -eu
ZOFF=$(realpath "$1"); ROUNDS=${2:-3}; STEPS=${3:-10}
SRC=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/zoff-bench-dp-XXXXXX)
trap 'rm -rf "$W"' EXIT
cat "$SRC"/src/*/*.c "$SRC"/src/*/*/*.c "$SRC"/include/zoff/*.h > "$W/corpus.txt"
"$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$W/corpus" "$W/corpus.txt" >/dev/null
MODEL=(--num-layers 6 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --tokenizer byte
       --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 0 --quiet)
cfg() { # name micro round_robin
  echo "{\"train_micro_batch_size_per_gpu\": $2, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}},
         \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2, \"round_robin_gradients\": $3,
         \"offload_optimizer\": {\"device\": \"cpu\"}}}" > "$W/$1.json"
}
cfg one 8 false; cfg two 4 false; cfg tworr 4 true
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader
     --mca btl_vader_single_copy_mechanism none -x OMP_WAIT_POLICY=passive -np 2)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  "$ZOFF" train "${MODEL[@]}" --config "$W/one.json" --train-iters "$STEPS" --save "$W/one_$r"
  "${MPI[@]}" "$ZOFF" train "${MODEL[@]}" --config "$W/two.json" --train-iters "$STEPS" --save "$W/two_$r"
  "${MPI[@]}" "$ZOFF" train "${MODEL[@]}" --config "$W/tworr.json" --train-iters "$STEPS" --save "$W/tworr_$r"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$W" "$ROUNDS" <<'EOF'
import glob, json, statistics, sys
W, R = sys.argv[1], int(sys.argv[2])
def steps(path):
    return [json.loads(l) for l in open(path) if '"loss"' in l][2:]
def med(xs):
    return statistics.median(xs) if xs else float("nan")
print("\n| run | step (s) | forward | backward | wait grads | host step | wait weights | tokens/s |")
print("|---|---|---|---|---|---|---|---|")
for name, label in (("one", "1 rank, micro-batch 8"), ("two", "2 ranks x 4, contiguous"), ("tworr", "2 ranks x 4, round-robin")):
    s = [x for r in range(1, R + 1) for x in steps("%s/%s_%d/metrics.jsonl" % (W, name, r))]
    print("| %s | %.3f | %.3f | %.3f | %.4f | %.3f | %.4f | %.0f |" % (label, med([x["step_time"] for x in s]),
          med([x["forward"] for x in s]), med([x["backward"] for x in s]), med([x["wait_grads"] for x in s]),
          med([x["host_step"] for x in s]), med([x["wait_weights"] for x in s]), med([x["tokens_per_s"] for x in s])))
print("\nPer round (the three runs back to back): median step time, and the 2-rank runs' speed-up over 1 rank")
print("\n| round | 1 rank (s) | 2 ranks contiguous (s) | 2 ranks round-robin (s) | speed-up contiguous | speed-up round-robin |")
print("|---|---|---|---|---|---|")
ups = {"two": [], "tworr": []}
for r in range(1, R + 1):
    m = {n: med([x["step_time"] for x in steps("%s/%s_%d/metrics.jsonl" % (W, n, r))]) for n in ("one", "two", "tworr")}
    for n in ups: ups[n].append(m["one"] / m[n])
    print("| %d | %.3f | %.3f | %.3f | %.2fx | %.2fx |" % (r, m["one"], m["two"], m["tworr"], m["one"] / m["two"], m["one"] / m["tworr"]))
print("| median | | | | %.2fx | %.2fx |" % (med(ups["two"]), med(ups["tworr"])))
print("\nPer-rank gradient stream, boundary backward (medians over steps; times from the start of backward):")
print("\n| run | rank | wait grads (s) | backward (s) | ranges it copies | MB copied | first copy done | last copy done |")
print("|---|---|---|---|---|---|---|---|")
for name, label in (("two", "contiguous"), ("tworr", "round-robin")):
    for rank in (0, 1):
        rows = [json.loads(l) for r in range(1, R + 1)
                for l in open("%s/%s_%d/grad_timeline_rank_%05d.jsonl" % (W, name, r, rank)).read().splitlines()[2:]]
        nr = len(rows[0]["ranges"])
        copies = med([sum(1 for g in x["ranges"] if g[6] > 0) for x in rows])
        mb = med([sum(g[6] for g in x["ranges"]) / 1e6 for x in rows])
        first = med([min((g[5] for g in x["ranges"] if g[6] > 0), default=float("nan")) for x in rows])
        last = med([max((g[5] for g in x["ranges"] if g[6] > 0), default=float("nan")) for x in rows])
        print("| %s | %d | %.4f | %.3f | %d of %d | %.2f | %.3f | %.3f |" % (label, rank, med([x["wait_grads"] for x in rows]),
              med([x["backward"] for x in rows]), copies, nr, mb, first, last))
    # one step's ranges, as a timeline: which rank copies how much of each range, and when
    x0 = [json.loads(open("%s/%s_1/grad_timeline_rank_%05d.jsonl" % (W, name, rank)).read().splitlines()[-1]) for rank in (0, 1)]
    print("\n%s, last step of round 1: range (reported at ms) -> rank 0 KB copied / done at ms, rank 1 KB / done at ms" % label)
    for a, b in zip(x0[0]["ranges"], x0[1]["ranges"]):
        print("    [%8d, +%7d) at %6.1f ms: rank 0 %7.1f KB @ %6.1f ms | rank 1 %7.1f KB @ %6.1f ms" % (
            a[0], a[1], 1e3 * a[2], a[6] / 1e3, 1e3 * a[5], b[6] / 1e3, 1e3 * b[5]))
EOF
