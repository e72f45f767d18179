#!/usr/bin/env bash
# Crash test of `zoff train`: kill it with SIGKILL at many random points (many of them inside
# a checkpoint save), resume each time with --load, and check that
#   1. after every kill, every DIR/step_* directory is a complete, valid checkpoint: it has a
#      well-formed COMPLETE marker and every rank file and CRC verifies (scripts/zckpt.py, an
#      independent reader of the format); temp dirs (step_X.tmp-*) are allowed and ignored;
#   2. the final checkpoint equals that of an uninterrupted run bit for bit (every entry:
#      weights, optimizer state, metadata incl. data-loader position, config);
#   3. every line of metrics.jsonl is whole JSON, and each step's loss, lr and grad_norm equal
#      the uninterrupted run's (a redone step repeats its line with the same numbers).
# SIGTERM (save and exit 143) is mixed in as another way to stop.
#
#   bash scripts/crash_test.sh [options]
#     --zoff PATH          the zoff binary (default: build/zoff)
#     --kills N            at most this many interruptions; after them the run may finish
#                          (default 60; fewer happen when the run gets to its last step first)
#     --steps N            training steps (default 60)
#     --config NAME|FILE   plain (stage 0, fp32; default) | offload (stage 2, CPU offload, fp16
#                          dynamic loss scale) | a DeepSpeed JSON file
#     --keep-last N        pass --keep-last N to zoff train (prune under kill too)
#     --seed N             of the kill schedule (default: random; printed, to replay)
#     --work DIR           work directory (default: a new temp dir, removed unless --keep)
#     --keep               keep the work directory
#     -v, --verbose        one line per launch
# Prints "crash_test: PASS ..." or "crash_test: FAIL ..." and exits 0 / 1.
set -uo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
ZOFF="$SRC/build/zoff"; KILLS=60; STEPS=60; CONFIG=plain; SEED=""; WORK=""; KEEP=0; VERBOSE=0; KEEP_LAST=()
while [ $# -gt 0 ]; do
  case "$1" in
    --zoff) ZOFF="$2"; shift ;;
    --kills) KILLS="$2"; shift ;;
    --steps) STEPS="$2"; shift ;;
    --config) CONFIG="$2"; shift ;;
    --seed) SEED="$2"; shift ;;
    --keep-last) KEEP_LAST=(--keep-last "$2"); shift ;;
    --work) WORK="$2"; shift ;;
    --keep) KEEP=1 ;;
    -v|--verbose) VERBOSE=1 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "crash_test: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$ZOFF" ] || { echo "crash_test: no zoff binary at $ZOFF (build first, or --zoff PATH)" >&2; exit 2; }
PY=$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3 || true)
[ -n "$PY" ] || { echo "crash_test: python3 is needed (scripts/zckpt.py)" >&2; exit 2; }
ZCKPT="$SRC/scripts/zckpt.py"
[ -n "$SEED" ] || SEED=$(( $(date +%s%N) % 1000000007 ))
RANDOM=$SEED
if [ -z "$WORK" ]; then WORK=$(mktemp -d "${TMPDIR:-/tmp}/zoff-crash-XXXXXX"); fi
mkdir -p "$WORK"
cleanup() { [ "$KEEP" -eq 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT
fail() { echo "crash_test: FAIL: $*  (seed $SEED; rerun with --seed $SEED --keep; work dir $WORK)"; KEEP=1; exit 1; }

# ---- data and config
cat "$SRC"/src/*/*.c > "$WORK/corpus.txt"
"$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$WORK/corpus" "$WORK/corpus.txt" >"$WORK/tokenize.log" 2>&1 ||
  fail "zoff tokenize: $(tail -3 "$WORK/tokenize.log")"
case "$CONFIG" in
  plain) CFG=() ;;
  offload)
    cat >"$WORK/offload.json" <<'EOF'
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 60, "warmup_num_steps": 5}},
 "fp16": {"enabled": true, "initial_scale_power": 20, "loss_scale_window": 4, "hysteresis": 1},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "sub_group_size": 4000}}
EOF
    CFG=(--config "$WORK/offload.json") ;;
  *) [ -f "$CONFIG" ] || fail "--config $CONFIG: not plain, offload or a file"; CFG=(--config "$CONFIG") ;;
esac
TRAIN=(train --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4
       --tokenizer byte --data-path "$WORK/corpus_train.bin" --val-path "$WORK/corpus_val.bin" --eval-iters 0
       --quiet --train-iters "$STEPS" --save-interval 1 "${KEEP_LAST[@]}" "${CFG[@]}")
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" # small model: threads only add timing noise
unset ZOFF_CKPT_FAULT ZOFF_IO_FAULT

# ---- the uninterrupted reference
t0=$(date +%s%N)
"$ZOFF" "${TRAIN[@]}" --save "$WORK/ref" >"$WORK/ref.log" 2>&1 || fail "reference run: $(tail -3 "$WORK/ref.log")"
ref_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
FINAL=$(printf 'step_%08d' "$STEPS")
[ -f "$WORK/ref/$FINAL/COMPLETE" ] || fail "reference run wrote no $FINAL"
# timing of this machine: startup (incl. the first step) and one step + save
t0=$(date +%s%N)
"$ZOFF" "${TRAIN[@]}" --train-iters 1 --save "$WORK/one" >/dev/null 2>&1
one_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
rm -rf "$WORK/one"
step_ms=$(( (ref_ms - one_ms) / (STEPS > 1 ? STEPS - 1 : 1) ))
[ "$step_ms" -ge 1 ] || step_ms=1
# a sleep without fork/exec (millisecond kill timing): read with a timeout on an idle fd
exec {SLEEP_FD}<> <(:)
msleep() { read -rt "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))" -u "$SLEEP_FD" || :; }

# ---- the interrupted run
RUN="$WORK/run"
kills=0; during_save=0; sigterms=0; launches=0
declare -A seen_tmp=()
verify() { # after every interruption
  local out
  if [ -d "$RUN" ]; then
    out=$("$PY" "$ZCKPT" verify "$RUN" --cache "$WORK/verified.txt" 2>&1) || fail "after interruption $kills ($1): $out"
  fi
}
# until the final checkpoint exists: launch (resuming when there is a checkpoint), interrupt
# (while fewer than KILLS interruptions so far), check the directory
while [ ! -f "$RUN/$FINAL/COMPLETE" ]; do
  load=()
  for d in "$RUN"/step_*/COMPLETE; do # any complete step? (no forks: timing matters below)
    d="${d%/COMPLETE}"; d="${d##*/step_}"
    [[ "$d" =~ ^[0-9]+$ ]] || continue # not a temp dir (which holds COMPLETE just before its rename)
    load=(--load "$RUN")
  done
  launches=$((launches + 1))
  "$ZOFF" "${TRAIN[@]}" --save "$RUN" "${load[@]}" >"$WORK/run.log" 2>&1 &
  pid=$!
  if [ "$kills" -ge "$KILLS" ]; then
    wait "$pid" 2>/dev/null; rc=$?
    [ "$rc" -eq 0 ] || fail "final uninterrupted resume exited $rc: $(tail -3 "$WORK/run.log")"
    break
  fi
  mode=$((RANDOM % 8)); ms=""
  if [ "$mode" -le 3 ]; then
    # a random point of startup (loading the checkpoint) and the next three steps
    ms=$(( (RANDOM * 32768 + RANDOM) % (one_ms + 3 * step_ms) ))
    msleep "$ms"
  else
    # inside a save: wait until a temp checkpoint dir appears (polled with a builtin), then a
    # random part of one step + save more (mode 4: at once), so kills spread over writing the
    # rank file, fsync, the marker, the rename
    deadline=$((SECONDS + 20))
    until compgen -G "$RUN/step_*.tmp-$pid" >/dev/null || ! kill -0 "$pid" 2>/dev/null; do
      [ "$SECONDS" -lt "$deadline" ] || break
    done
    if [ "$mode" -gt 4 ]; then ms=$((RANDOM % step_ms)); msleep "$ms"; fi
  fi
  sig=KILL
  [ $((RANDOM % 10)) -eq 0 ] && sig=TERM
  if kill -s "$sig" "$pid" 2>/dev/null; then
    wait "$pid" 2>/dev/null; rc=$?
    compgen -G "$RUN/step_*.tmp-$pid" >/dev/null && during_save=$((during_save + 1))
    if [ "$sig" = TERM ]; then
      sigterms=$((sigterms + 1))
      # SIGTERM: the step in progress finishes, a checkpoint is saved, exit 143 (or 0 when it
      # arrived after the last step's save began)
      [ "$rc" -eq 143 ] || [ "$rc" -eq 0 ] || fail "SIGTERM: exit $rc (expected 143): $(tail -3 "$WORK/run.log")"
    else
      [ "$rc" -eq 137 ] || [ "$rc" -eq 0 ] || fail "SIGKILL: exit $rc: $(tail -3 "$WORK/run.log")"
    fi
    [ "$rc" -eq 0 ] || kills=$((kills + 1))
  else
    wait "$pid" 2>/dev/null; rc=$?
    [ "$rc" -eq 0 ] || fail "run exited $rc before it was interrupted: $(tail -3 "$WORK/run.log")"
  fi
  [ "$VERBOSE" -eq 0 ] || echo "launch $launches: mode $mode${ms:+ delay ${ms}ms} SIG$sig -> exit $rc; $(ls "$RUN" | grep -c 'step_[0-9]*$') complete, $(ls "$RUN" | grep -c '\.tmp-') temp"
  verify "$sig"
  for d in "$RUN"/step_*.tmp-*; do [ -e "$d" ] && seen_tmp["${d##*/}"]=1; done
done
verify final
# temp dirs that kills left behind are removed by the next successful save (prune's own temp
# dirs excepted: a kill during the last prune leaves one)
left=$(ls "$RUN" | grep '\.tmp-' | grep -v '\.tmp-prune-' || true)
[ -z "$left" ] || fail "temp dirs left after the final save: $left"

# ---- compare with the reference
[ -f "$RUN/$FINAL/COMPLETE" ] || fail "interrupted run has no $FINAL"
out=$("$PY" "$ZCKPT" compare "$WORK/ref/$FINAL" "$RUN/$FINAL" 2>&1) || fail "final checkpoint differs: $out"
out=$("$PY" - "$WORK/ref/metrics.jsonl" "$RUN/metrics.jsonl" <<'EOF' 2>&1
import json, sys
def load(p):
    rows = []
    for i, line in enumerate(open(p, encoding="utf-8"), 1):
        try:
            rows.append(json.loads(line))
        except ValueError:
            sys.exit("%s:%d: not a whole JSON line: %r" % (p, i, line[:80]))
    return rows
ref = {r["step"]: r for r in load(sys.argv[1]) if "loss" in r}
run = [r for r in load(sys.argv[2]) if "loss" in r]
for r in run:
    a = ref.get(r["step"])
    if a is None or any(a[k] != r[k] for k in ("loss", "lr", "grad_norm", "loss_scale", "skipped")):
        sys.exit("step %d differs from the uninterrupted run: %s vs %s" % (r["step"], {k: r[k] for k in ("loss", "lr", "grad_norm")}, a and {k: a[k] for k in ("loss", "lr", "grad_norm")}))
missing = sorted(set(ref) - {r["step"] for r in run})
if missing:
    sys.exit("metrics lines lost for steps %s" % missing)
print("%d metric lines, %d distinct steps" % (len(run), len({r["step"] for r in run})))
EOF
) || fail "metrics.jsonl: $out"
steps=$(ls -d "$RUN"/step_* 2>/dev/null | grep -c '/step_[0-9]*$')
echo "crash_test: PASS: config $CONFIG, $STEPS steps (startup ${one_ms} ms, step + save ${step_ms} ms), $kills interruptions ($during_save inside a save, $sigterms SIGTERM), $launches launches; $steps complete checkpoints verified after every interruption; final checkpoint bit-identical to the uninterrupted run; $out; ${#seen_tmp[@]} temp dir(s) left by kills, removed by later saves; seed $SEED"
