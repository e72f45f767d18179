#!/usr/bin/env bash
# What periodic background saves cost the training steps, for one or more zoff binaries (or
# flag sets) alternated round by round.
#
#   bash bench/ckpt_overlap.sh [--rounds 3] [--steps 20] [--interval 6] [--seq 64] [--micro 1] [--shape 12x768x12] [--ratio R] [--detail] \
#       [--dir /tmp/zoff-overlap] NAME=BINARY[:NICE][+FLAG[+FLAG...]] ...
#   e.g. bash bench/ckpt_overlap.sh snap=build/zoff wait=build/zoff+--save-snapshot-memory+off
#
# The interval must leave each save time to finish (else the next save waits for it: that wait,
# "ckpt_join_wait", counts in the span; the run warns): on the 16-core H100 box with 18-32 ms steps and
# 0.5-0.9 s saves, --steps 130 --interval 40.
# GPT-2 12 x 768 (checkpoint 1.49 GB; --shape LAYERSxHIDDENxHEADS another, e.g. 48x1600x25: 1.5B, 18.7 GB), byte tokenizer, seq 64, micro-batch 1 (the step is the host
# update alone: the save competes with it for every core and all the memory bandwidth; --seq and
# --micro give the device work to overlap), bf16, stage 2, optimizer on the CPU; --steps steps, a
# save every --interval; --ratio R: offload_optimizer.ratio R (Twin-Flow: the device keeps 1 - R of the
# update, copied at each save's start). --detail: each save's start and the steps of its span. NICE sets ZOFF_CKPT_WRITER_NICE
# for that binary; +FLAG words are added to its zoff train command line.
#
# Per run, the figure the target is about, "span": each save's metrics line (written when the
# trainer joins the writer: ckpt_step S, ckpt_steps_overlapped k, ckpt_start = the main
# thread's part of starting it, counted apart where it ran between steps: builds since the
# deferred start run it inside step S+1, "ckpt_start_in_step") gives the steps S+1..S+k that ran while it was in flight, from
# the save's start to the writer done; span = (ckpt_start + their step_time summed + the wait for
# it at the next save, ckpt_join_wait, when it outlasted its interval) / (k x the median step_time
# of the steps >= 2 in no save's span), over all saves of the run and over those after the first
# (builds before the arena's prefault faulted it in at the first); where such waits occurred, also
# the span without them (what an interval every save fits in would give). Also the old
# per-step figure: the median of the steps right after each save against that median. A
# binary without the metrics line (before the snapshot) counts one step per save, start 0. And the
# same by the wall clock between the steps' ends (metrics "clock"), which also counts what the
# training loop does between steps (the save's start, joining a finished writer).
set -uo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
D=/tmp/zoff-overlap; ROUNDS=3; K=6; STEPS=20; SEQ=64; MICRO=1; SHAPE=12x768x12; RATIO=""; DETAIL=0; RUNS=()
while [ $# -gt 0 ]; do
  case "$1" in --rounds) ROUNDS="$2"; shift ;; --dir) D="$2"; shift ;; --steps) STEPS="$2"; shift ;;
    --interval) K="$2"; shift ;; --seq) SEQ="$2"; shift ;; --micro) MICRO="$2"; shift ;; --detail) DETAIL=1 ;;
    --shape) SHAPE="$2"; shift ;; --ratio) RATIO="$2"; shift ;;
    *=*) RUNS+=("$1") ;;
    *) echo "unknown option $1" >&2; exit 2 ;; esac
  shift
done
[ ${#RUNS[@]} -gt 0 ] || RUNS=("new=$SRC/build/zoff")
IFS=x read -r LAYERS HIDDEN HEADS <<< "$SHAPE"
case "$LAYERS/$HIDDEN/$HEADS" in *[!0-9/]* | */ | /* | *//*) echo "--shape $SHAPE: give LAYERSxHIDDENxHEADS, e.g. 12x768x12" >&2; exit 2 ;; esac
FIRST="${RUNS[0]#*=}"; FIRST="${FIRST%%[:+]*}"
source "$SRC/bench/ckpt_common.sh"
trap 'rm -rf "$D"' EXIT
ckpt_bench_setup "$D" "$FIRST" || exit 1
if [ -n "$RATIO" ]; then
  sed -i "s/\"device\": \"cpu\"}/\"device\": \"cpu\", \"ratio\": $RATIO}/" "$D/cfg.json"
  grep -q "\"ratio\": $RATIO}" "$D/cfg.json" || { echo "--ratio $RATIO: could not set it in $D/cfg.json" >&2; exit 2; }
fi
for r in $(seq 1 "$ROUNDS"); do
  for spec in "${RUNS[@]}"; do
    name="${spec%%=*}"; rest="${spec#*=}"; flags=""; nice=0
    case "$rest" in *+*) flags="${rest#*+}"; flags="${flags//+/ }"; rest="${rest%%+*}" ;; esac
    bin="$rest"
    case "$bin" in *:*) nice="${bin##*:}"; bin="${bin%:*}" ;; esac
    rm -rf "$D/run"
    la=$(cut -d' ' -f1 /proc/loadavg)
    # shellcheck disable=SC2086
    ZOFF_CKPT_WRITER_NICE="$nice" "$bin" train --num-layers "$LAYERS" --hidden-size "$HIDDEN" --num-attention-heads "$HEADS" \
      --seq-length "$SEQ" --micro-batch-size "$MICRO" --tokenizer byte --data-path "$D/corpus_train.bin" --eval-iters 0 --quiet \
      --config "$D/cfg.json" --train-iters "$STEPS" --save-interval "$K" --save "$D/run" $flags 2>"$D/err.txt" ||
      { cat "$D/err.txt"; exit 1; }
    la2=$(cut -d' ' -f1 /proc/loadavg)
    python3 - "$D/run/metrics.jsonl" "$K" "$name" "$r" "$la-$la2" "$DETAIL" <<'EOP'
import json, statistics, sys
K = int(sys.argv[2])
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = {r["step"]: r["step_time"] for r in lines if "step_time" in r}
saves = [r for r in lines if "ckpt_step" in r]
if not saves:  # a binary before the metrics line, or synchronous saves (their time only in the wall clock below)
    saves = [{"ckpt_step": s, "step": s + 1, "ckpt_steps_overlapped": 1, "ckpt_start": 0.0, "ckpt_seconds": float("nan"),
              "ckpt_staged": 0, "ckpt_update_wait": 0.0} for s in steps if s % K == 0 and s + 1 in steps]
inside = {s for v in saves for s in range(v["ckpt_step"] + 1, v["ckpt_step"] + v["ckpt_steps_overlapped"] + 1)}
free = [t for s, t in steps.items() if s >= 2 and s not in inside]
base = statistics.median(free)
last = max(steps)
def cost(v, waits=True):  # its start, the steps in flight, and the loop's wait for it outside a step at the next save
    join = v.get("ckpt_join_wait", 0.0) if waits and v["step"] < last else 0.0  # (not the final save's wait)
    start = 0.0 if v.get("ckpt_start_in_step") else v["ckpt_start"]  # (a start inside step S+1 is in its step_time)
    return start + join + sum(
        steps.get(s, 0.0) for s in range(v["ckpt_step"] + 1, v["ckpt_step"] + v["ckpt_steps_overlapped"] + 1))
span_t = sum(cost(v) for v in saves)
span_n = sum(v["ckpt_steps_overlapped"] for v in saves)
# the same without those waits: what an interval long enough for every save would give
waits = sum(cost(v) - cost(v, False) for v in saves)
# the saves after the first: the snapshot's arena is kept from save to save, so only the first
# pays for faulting its pages in
later_t = sum(cost(v) for v in saves[1:])
later_n = sum(v["ckpt_steps_overlapped"] for v in saves[1:])
# the same from the steps' end clocks (metrics "clock"; binaries before it: None): the wall time from
# the end of step S to the end of its last step in flight, against as many ordinary steps' wall
# times (end to end, neither step in a span); everything the loop did in between counts
clock = {r["step"]: r["clock"] for r in lines if "clock" in r}
wall = None
if clock:
    free_w = [clock[s] - clock[s - 1] for s in clock if s >= 3 and s - 1 in clock and s not in inside and
              s - 1 not in inside and not any(v["ckpt_step"] == s - 1 for v in saves)]
    wb = statistics.median(free_w)
    def wall_of(vs):
        t = sum(clock[v["ckpt_step"] + v["ckpt_steps_overlapped"]] - clock[v["ckpt_step"]] for v in vs)
        return t / (sum(v["ckpt_steps_overlapped"] for v in vs) * wb)
    wall = (wall_of(saves), wall_of(saves[1:]) if len(saves) > 1 else float("nan"))
after = [steps[v["ckpt_step"] + 1] for v in saves if v["ckpt_step"] + 1 in steps]
print("round %s %-6s load %s: span %.2fx, after the first save %s (%d saves, %d steps in flight: %.2f s vs %.2f s without; saves %s s; staged %s MB; "
      "written in place %s MB; update wait %s s) | step after a save %.2fx (%s s) | step without a save %.3f s" % (
    sys.argv[4], sys.argv[3], sys.argv[5], span_t / (span_n * base),
    "%.2fx" % (later_t / (later_n * base)) if later_n else "-", len(saves), span_n, span_t, span_n * base,
    "/".join("%.2f" % v["ckpt_seconds"] for v in saves), "/".join("%.0f" % (v["ckpt_staged"] / 1e6) for v in saves),
    "/".join("%.0f" % (v.get("ckpt_in_place", 0) / 1e6) for v in saves),
    "/".join("%.2f" % v["ckpt_update_wait"] for v in saves), statistics.median(after) / base,
    " ".join("%.2f" % a for a in after), base), flush=True)
if wall:
    print("    by the wall clock: span %.2fx, after the first save %.2fx" % wall, flush=True)
if any(v.get("ckpt_device_copied", 0) for v in saves):
    print("    the device's share copied at each save: %s MB in %s s; the training waited %s s for it" % (
        "/".join("%.0f" % (v["ckpt_device_copied"] / 1e6) for v in saves),
        "/".join("%.3f" % v.get("ckpt_device_copy_s", float("nan")) for v in saves),
        "/".join("%.3f" % v.get("ckpt_device_wait_s", v.get("ckpt_device_copy_s", float("nan"))) for v in saves)),
        flush=True)
if waits > 1e-3:  # (a finished writer is joined in microseconds)
    print("    %.2f s of it waited for a save still being written at the next one (raise --interval): span without "
          "those waits %.2fx" % (waits, (span_t - waits) / (span_n * base)), flush=True)
if sys.argv[6] == "1":
    for v in saves:
        k = v["ckpt_step"]
        print("    save at step %d (%.4f s): start %.4f s, joined after a wait of %.4f s, span steps %s s, staged %s MB (%s MB in the update's pass), arena faulted in ahead %s MB" % (
            k, steps.get(k, float("nan")), v["ckpt_start"], v.get("ckpt_join_wait", float("nan")), " ".join("%.4f" % steps.get(s, float("nan"))
                                        for s in range(k + 1, k + v["ckpt_steps_overlapped"] + 1)),
            "%.0f" % (v.get("ckpt_staged", 0) / 1e6), "%.0f" % (v.get("ckpt_staged_in_update", 0) / 1e6),
            "%.0f" % (v.get("ckpt_prefaulted", 0) / 1e6)), flush=True)
EOP
  done
done
