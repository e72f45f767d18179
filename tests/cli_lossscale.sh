#!/usr/bin/env bash
# fp16 loss scaling through the CLI against an independent reference: DeepSpeed's
# DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py), written below in
# Python from its rule, not from zoff's code. The gradients decide which steps overflow (a
# scale far too large for fp16); the reference, fed those overflows, gives the scale of every
# step, which must be metrics.jsonl's loss_scale: hysteresis 1/2/3, consecutive_hysteresis
# true/false, small windows, initial_scale_power 0 and 32, static scales; an overflow at the
# minimum scale (exit 2, where DeepSpeed raises), a scale below the minimum (up to it, as
# DeepSpeed); a resume (the state exact; a static run resumed dynamic and the other way: the
# new config's scaler, said on the console); a static scale beyond fp32's range refused.
# Usage: cli_lossscale.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-lossscale-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check, $PY, byte_corpus
if ! "$PY" -c 'import json' 2>/dev/null; then echo "cli_lossscale: SKIPPED: no python3"; exit 77; fi

fixed_corpus "$SRC" "$W" # (the overflows depend on the data: not the sources, which every edit changes)
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4
      --tokenizer byte --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 0)

cat > "$W/ref.py" <<'PY'
# DeepSpeed's dynamic loss scaler, from its rule: on overflow, if the hysteresis is 1 or spent,
# the scale halves (not below min_scale; already at min_scale: an error), else the hysteresis
# budget shrinks by one; the last overflow is this iteration. Without overflow: with
# consecutive_hysteresis the budget is refilled; every scale_window iterations counted from the
# last overflow the scale doubles (and, without consecutive_hysteresis, the budget is refilled).
import json, sys

class Scaler:
    def __init__(self, scale, window, min_scale, hysteresis, consecutive):
        self.scale, self.window, self.min_scale = scale, window, min_scale
        self.delayed_shift = self.left = hysteresis
        self.consecutive = consecutive
        self.it, self.last_overflow = 0, -1

    def at_min_error_next(self):  # the next overflow would raise
        return (self.delayed_shift == 1 or self.left == 1) and self.scale == self.min_scale

    def update(self, overflow):
        if overflow:
            if self.delayed_shift == 1 or self.left == 1:
                if self.scale == self.min_scale:
                    raise RuntimeError("at minimum")
                self.scale = max(self.scale / 2, self.min_scale)
            else:
                self.left -= 1
            self.last_overflow = self.it
        else:
            if self.consecutive:
                self.left = self.delayed_shift
            if (self.it - self.last_overflow) % self.window == 0:
                if not self.consecutive:
                    self.left = self.delayed_shift
                self.scale *= 2
        self.it += 1

# ref.py METRICS FIRST_STEP SCALE WINDOW MIN HYSTERESIS CONSECUTIVE [at-min]
# SCALE 's<value>': a static scale. The rows from FIRST_STEP on are checked (a fresh scaler
# there). at-min: the rows end where the next overflow raises (the run stopped there).
m, first, sc, window, mn, hy, cons = sys.argv[1:8]
rows = [r for r in map(json.loads, open(m)) if 'loss_scale' in r and r['step'] >= int(first)]
static = sc.startswith('s')
ref = Scaler(float(sc.lstrip('s')), int(window), float(mn), int(hy), cons == 'true')
bad = []
for r in rows:
    if r['loss_scale'] != ref.scale:
        bad.append('step %d: zoff %s, DeepSpeed %s' % (r['step'], r['loss_scale'], ref.scale))
    if not static:
        try:
            ref.update(r['skipped'])
        except RuntimeError:
            bad.append('step %d: DeepSpeed stops here (an overflow at the minimum scale)' % r['step'])
            break
skipped = sum(r['skipped'] for r in rows)
if len(sys.argv) > 8 and not ref.at_min_error_next():
    bad.append('DeepSpeed would not stop after step %d' % rows[-1]['step'])
print('%d steps, %d skipped%s' % (len(rows), skipped, '; ' + '; '.join(bad[:3]) if bad else ''))
sys.exit(1 if bad or not rows else 0)
PY

# fp16 config: initial_scale_power window hysteresis consecutive min_loss_scale [loss_scale]
fp16() {
  echo "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_clipping\": 1.0,
         \"fp16\": {\"enabled\": true, \"loss_scale\": ${6:-0}, \"initial_scale_power\": $1, \"loss_scale_window\": $2,
                  \"hysteresis\": $3, \"consecutive_hysteresis\": $4, \"min_loss_scale\": $5},
         \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}}"
}
ref() { "$PY" "$W/ref.py" "$@"; }

# 1. trajectories: the scale of each step == DeepSpeed's for the overflows the gradients gave
while read -r name pow win hy cons; do
  fp16 "$pow" "$win" "$hy" "$cons" 1 > "$W/$name.json"
  "$ZOFF" train "${TINY[@]}" --config "$W/$name.json" --train-iters 60 --no-checkpoint --save "$W/$name" >/dev/null 2>&1
  out=$(ref "$W/$name/metrics.jsonl" 1 $((2 ** pow)) "$win" 1 "$hy" "$cons")
  check "2^$pow, window $win, hysteresis $hy, consecutive $cons: scales == DeepSpeed's ($out)" \
    "[ $? -eq 0 ] && grep -q '\"skipped\":true' '$W/$name/metrics.jsonl' && grep -q '\"skipped\":false' '$W/$name/metrics.jsonl'"
done <<'EOF'
ds 32 1000 2 false
h1 30 1 1 false
h2 30 2 2 false
h3 30 2 3 false
c2 30 3 2 true
c3 24 1 3 true
p0 0 2 2 false
EOF
# the console's progress line of a skipped step (not a terminal: step 1 is always printed) says
# inf/NaN, as the skip line does, not printf's "-nan" (metrics.jsonl: null)
"$ZOFF" train "${TINY[@]}" --config "$W/h1.json" --train-iters 2 --no-checkpoint --save "$W/con" >"$W/con.txt" 2>&1
check "a skipped step's progress line: 'grad_norm inf/NaN', no 'nan' on the console" \
  "grep -q '^step 1/2 loss [0-9.]* lr [0-9.e+-]* grad_norm inf/NaN tok/s' '$W/con.txt' && ! grep -qi 'grad_norm -*nan' '$W/con.txt' \
   && grep -q '\"grad_norm\":null' '$W/con/metrics.jsonl'"
fp16 16 1000 2 false 1 1024 > "$W/static.json"
"$ZOFF" train "${TINY[@]}" --config "$W/static.json" --train-iters 10 --no-checkpoint --save "$W/static" >/dev/null 2>&1
check "static loss_scale 1024: every step at 1024 ($(ref "$W/static/metrics.jsonl" 1 s1024 1 1 1 false))" \
  "ref '$W/static/metrics.jsonl' 1 s1024 1 1 1 false >/dev/null"

# 2. an overflow at min_loss_scale with the hysteresis spent: exit 2 naming the scale and the step
#    (DeepSpeed: "Current loss scale already at minimum"), the checkpoints saved before intact
fp16 30 1000 2 false 1048576 > "$W/min.json"
"$ZOFF" train "${TINY[@]}" --config "$W/min.json" --train-iters 40 --save-interval 3 --sync-save --save "$W/min" \
  >"$W/min.txt" 2>&1
rc=$?
last=$(grep -o '"step":[0-9]*,"loss"' "$W/min/metrics.jsonl" | tail -1 | grep -o '[0-9]*')
check "overflow at the minimum 2^20: exit 2 (rc $rc)" "[ $rc -eq 2 ]"
check "... says the scale exactly and the step after the last one trained ($((last + 1)))" \
  "grep -q 'overflow at the minimum loss scale 1048576 (step $((last + 1))): training cannot progress' '$W/min.txt'"
check "... where DeepSpeed stops too ($(ref "$W/min/metrics.jsonl" 1 $((2 ** 30)) 1000 1048576 2 false at-min))" \
  "ref '$W/min/metrics.jsonl' 1 $((2 ** 30)) 1000 1048576 2 false at-min >/dev/null"
check "... the checkpoints saved before it verify" "'$PY' '$SRC/scripts/zckpt.py' verify '$W/min' >/dev/null"
# a scale below min_loss_scale (initial_scale_power 20, min 2^22): DeepSpeed's max(scale / 2, min)
# takes it up to the minimum, and only an overflow there stops (before: an error at 2^20, "the
# minimum loss scale 1.04858e+06")
fp16 20 1000 1 false 4194304 > "$W/below.json"
"$ZOFF" train "${TINY[@]}" --config "$W/below.json" --train-iters 10 --no-checkpoint --save "$W/below" >"$W/below.txt" 2>&1
rc=$?
check "initial scale 2^20 below min_loss_scale 2^22: the second step at 2^22, then exit 2 at step 2 (rc $rc)" \
  "[ $rc -eq 2 ] && grep -q 'minimum loss scale 4194304 (step 2)' '$W/below.txt' && \
   ref '$W/below/metrics.jsonl' 1 1048576 1000 4194304 1 false at-min >/dev/null"

# 3. resume: the scaler's state (scale, hysteresis budget, last overflow) goes on exactly
for cons in false true; do
  fp16 30 3 3 $cons 1 > "$W/res.json"
  "$ZOFF" train "${TINY[@]}" --config "$W/res.json" --train-iters 30 --no-checkpoint --save "$W/full$cons" >/dev/null 2>&1
  for k in 17 18 19 20; do
    "$ZOFF" train "${TINY[@]}" --config "$W/res.json" --train-iters $k --save "$W/part$cons$k" >/dev/null 2>&1
    "$ZOFF" train "${TINY[@]}" --config "$W/res.json" --train-iters 30 --load "$W/part$cons$k" --no-checkpoint \
      >/dev/null 2>&1
    grep -o '"step":[0-9]*,"loss":[^,]*' "$W/full$cons/metrics.jsonl" > "$W/a.txt"
    grep -o '"step":[0-9]*,"loss":[^,]*' "$W/part$cons$k/metrics.jsonl" > "$W/b.txt"
    grep -o '"loss_scale":[^,]*,"skipped":[a-z]*' "$W/full$cons/metrics.jsonl" >> "$W/a.txt"
    grep -o '"loss_scale":[^,]*,"skipped":[a-z]*' "$W/part$cons$k/metrics.jsonl" >> "$W/b.txt"
    check "consecutive_hysteresis $cons: $k steps + resume to 30 == 30 straight (losses, scales, skips)" \
      "[ \$(wc -l < '$W/a.txt') -eq 60 ] && cmp -s '$W/a.txt' '$W/b.txt'"
  done
done
# a static run resumed with dynamic scaling: a new dynamic scaler at 2^initial_scale_power from the
# resumed step (before: it kept the static 2^25 and, its hysteresis budget 0, never lowered it:
# every step skipped; steps 1-3 overflow at 2^25, so a step taken is one after the resume)
fp16 16 1000 2 false 1 33554432 > "$W/s25.json"
fp16 16 2 2 false 1 > "$W/d16.json"
"$ZOFF" train "${TINY[@]}" --config "$W/s25.json" --train-iters 3 --save "$W/sd" >/dev/null 2>&1
"$ZOFF" train "${TINY[@]}" --config "$W/d16.json" --train-iters 30 --load "$W/sd" >"$W/sd.txt" 2>&1
rc=$?
check "static 2^25 resumed dynamic (2^16, window 2): steps 4-30 == a new DeepSpeed scaler's \
($(ref "$W/sd/metrics.jsonl" 4 65536 2 1 2 false))" \
  "[ $rc -eq 0 ] && ref '$W/sd/metrics.jsonl' 4 65536 2 1 2 false >/dev/null && \
   grep -q '\"skipped\":false' '$W/sd/metrics.jsonl'"
check "... said: the loss scale 65536 of this config, not the checkpoint's 33554432" \
  "grep -q 'resume: loss scale 65536 (this config.s fp16 settings), not the checkpoint.s 33554432' '$W/sd.txt' && \
   grep -q 'resume: fp16.loss_scale 33554432 -> 0' '$W/sd.txt'"
# a dynamic run resumed with a static scale: that scale (before: the dynamic run's, silently)
fp16 20 2 2 false 1 1024 > "$W/s10.json"
"$ZOFF" train "${TINY[@]}" --config "$W/d16.json" --train-iters 6 --save "$W/ds" >/dev/null 2>&1
"$ZOFF" train "${TINY[@]}" --config "$W/s10.json" --train-iters 12 --load "$W/ds" >"$W/ds.txt" 2>&1
check "dynamic resumed with static loss_scale 1024: steps 7-12 at 1024 ($(ref "$W/ds/metrics.jsonl" 7 s1024 1 1 1 false))" \
  "ref '$W/ds/metrics.jsonl' 7 s1024 1 1 1 false >/dev/null && grep -q 'resume: fp16.loss_scale 0 -> 1024' '$W/ds.txt'"

# 4. a static scale beyond fp32's largest number is refused by name, nothing written (before: the
#    first forward failed, "dloss_scale is inf")
fp16 16 1000 2 false 1 1e39 > "$W/huge.json"
"$ZOFF" train "${TINY[@]}" --config "$W/huge.json" --train-iters 2 --save "$W/huge" >"$W/huge.txt" 2>&1
rc=$?
check "fp16.loss_scale 1e39: exit 2 naming the key and its range, nothing written" \
  "[ $rc -eq 2 ] && grep -q 'fp16.loss_scale: 1e+39 is out of range; allowed: a number in \[0, 3.40282e+38\]' '$W/huge.txt' \
   && [ ! -e '$W/huge' ]"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
