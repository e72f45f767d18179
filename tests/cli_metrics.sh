#!/usr/bin/env bash
# The figures zoff train reports about a run, checked against figures taken outside zoff:
#   - small losses and gradient norms keep their digits: a model that learns a corpus of one
#     repeated byte reaches a loss near 1e-6; the console and metrics.jsonl said 0.0000 / 0.000001.
# Usage: cli_metrics.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-metrics-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh"
if ! command -v "$PY" >/dev/null 2>&1; then echo "cli_metrics: SKIPPED: needs python3"; exit 77; fi

# ---- small values keep their significant digits
"$PY" -c "print('a' * 200000)" > "$W/aaa.txt"
"$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$W/aaa" "$W/aaa.txt" >/dev/null 2>&1
cat > "$W/a.json" <<J
{"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 0}}
J
"$ZOFF" train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --tokenizer byte \
  --data-path "$W/aaa_train.bin" --val-path "$W/aaa_val.bin" --eval-iters 2 --config "$W/a.json" \
  --train-iters 60 --no-checkpoint --save "$W/aaa" >"$W/aaa_run.txt" 2>&1
rc=$?
cat > "$W/small.py" <<'PY'
import json, re, sys
out, metrics = open(sys.argv[1]).read(), sys.argv[2]
lines = [l for l in open(metrics) if '"loss"' in l]
last, val = lines[-1], [l for l in open(metrics) if '"val_loss"' in l][-1]
def sig(text):  # significant digits of a JSON number's text
    mant = re.match(r"-?([0-9.]+)", text).group(1).replace(".", "").lstrip("0")
    return len(mant)
for key, src in (("loss", last), ("grad_norm", last), ("val_loss", val)):
    t = re.search('"%s":([^,}]*)' % key, src).group(1)
    x = float(t)
    assert 0 < x < 1e-3, (key, t, "the run did not reach a small value: the check would prove nothing")
    assert sig(t) >= 6, (key, t, "fewer than 6 significant digits")
step = json.loads(last)
con = re.search(r"step 60/60 loss (\S+) lr \S+ grad_norm (\S+)", out)
assert con, out
for printed, exact in ((con.group(1), step["loss"]), (con.group(2), step["grad_norm"])):
    assert abs(float(printed) - exact) <= 1e-2 * exact, (printed, exact)  # not 0.0000 / 0.000
s = re.search(r"train loss (\S+) \(last step\); validation loss \S+ -> (\S+)$", out, re.M)
assert s and abs(float(s.group(1)) - step["loss"]) <= 1e-2 * step["loss"], (s, step)
assert abs(float(s.group(2)) - json.loads(val)["val_loss"]) <= 1e-2 * json.loads(val)["val_loss"], s.group(2)
print("small ok", con.group(1), con.group(2))
PY
"$PY" "$W/small.py" "$W/aaa_run.txt" "$W/aaa/metrics.jsonl" >"$W/small.txt" 2>&1
check "a loss near 1e-6: metrics.jsonl keeps 6 significant digits of loss, grad_norm, val_loss; the console and the summary print them (not 0.0000)" \
  "[ $rc -eq 0 ] && grep -q '^small ok' '$W/small.txt'" || { cat "$W/small.txt"; tail -5 "$W/aaa_run.txt"; }

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
