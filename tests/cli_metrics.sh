#!/usr/bin/env bash
# The figures zoff train reports about a run, checked against figures taken outside zoff:
#   - the summary's tokens/s is the steps' throughput (global batch: micro x accumulation x ranks x
#     seq), not the training loop's wall time with its validations in it: a run validating 300
#     batches after every step reports about what a run without validation does, measured by the
#     shell's clock (before: 1/50 of it);
#   - wall_clock_breakdown's console line in milliseconds (DeepSpeed's unit), each figure the step's in
#     metrics.jsonl: it was seconds to 4 decimals, a forward of 40 us printed as 0.0000;
#   - small losses and gradient norms keep their digits: a model that learns a corpus of one
#     repeated byte reaches a loss near 1e-6; the console and metrics.jsonl said 0.0000 / 0.000001;
#   - the summary's peak memory has the host's: the process's resident peak, against the kernel's
#     max RSS of the child (getrusage); before, only device and pinned host memory were named.
# Usage: cli_metrics.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-metrics-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh"
if ! command -v "$PY" >/dev/null 2>&1; then echo "cli_metrics: SKIPPED: needs python3"; exit 77; fi

now() { date +%s.%N; }

# ---- throughput over the steps, validations not counted (after steps 1-9: the 10th is the final one, not in the loop)
byte_corpus "$SRC" "$W"
cat > "$W/ga.json" <<J
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 100,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 0}}
J
TINY=(--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --tokenizer byte
      --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --config "$W/ga.json" --no-checkpoint)
t0=$(now)
"$ZOFF" train "${TINY[@]}" --train-iters 10 --eval-iters 0 --save "$W/plain" >"$W/plain.txt" 2>&1
rc1=$?
t1=$(now)
"$ZOFF" train "${TINY[@]}" --train-iters 10 --eval-iters 300 --eval-interval 1 --save "$W/val" >"$W/val.txt" 2>&1
rc2=$?
t2=$(now)
cat > "$W/tput.py" <<'PY'
import re, sys
t0, t1, t2 = map(float, sys.argv[1:4])
plain_wall, val_wall, path = t1 - t0, t2 - t1, sys.argv[4]
text = open(path).read()
m = re.search(r"throughput: ([0-9.]+) tokens/s \(([0-9.]+) samples/s\) over the steps' ([0-9.]+) s", text)
assert m, "no throughput line:\n" + text
tps, sps, secs = map(float, m.groups())
tokens = 10 * 4 * 2 * 32  # steps x micro x accumulation x seq (1 rank)
# the figure is the run's tokens over the seconds it names (the global batch counted whole)
assert abs(tps * secs - tokens) <= 0.01 * tokens + tps * 0.0005, (tps, secs, tokens)
assert abs(sps * 32 - tps) <= 0.01 * tps, (sps, tps)
# the shell's clock: the run without validation trained at least at tokens / its whole wall time
outside = tokens / plain_wall
assert tps >= outside / 4, "summary %.0f tokens/s, the steps alone ran at >= %.0f tokens/s (shell clock)" % (tps, outside)
v = re.search(r"not counted: 9 validations ([0-9.]+) s", text)
assert v and float(v.group(1)) >= (val_wall - plain_wall) / 3 and float(v.group(1)) <= val_wall, (v, val_wall, plain_wall)
print("tokens/s", tps, "outside >=", round(outside), "validation", v.group(1), "s of", round(val_wall - plain_wall, 3))
PY
"$PY" "$W/tput.py" "$t0" "$t1" "$t2" "$W/val.txt" >"$W/tput.txt" 2>&1
check "10 steps validating 300 batches after each: the summary's tokens/s is the steps' (>= 1/4 of a run without validation by the shell's clock), global batch counted, validation time said apart" \
  "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q '^tokens/s' '$W/tput.txt'" || { cat "$W/tput.txt"; grep 'zoff: t' "$W/val.txt"; }

# ---- wall_clock_breakdown on the console: milliseconds, metrics.jsonl's figures of that step
sed 's/"steps_per_print": 100,/"steps_per_print": 2, "wall_clock_breakdown": true,/' "$W/ga.json" > "$W/bd.json"
"$ZOFF" train "${TINY[@]/$W\/ga.json/$W/bd.json}" --train-iters 4 --eval-iters 0 --save "$W/bd" >"$W/bd.txt" 2>&1
rc=$?
cat > "$W/bd.py" <<'PY'
import json, re, sys
out, metrics = open(sys.argv[1]).read(), sys.argv[2]
steps = {r["step"]: r for r in map(json.loads, open(metrics)) if "loss" in r}
keys = {"forward": "forward", "backward": "backward", "wait-grads": "wait_grads", "host-step": "host_step",
        "device-step": "device_step", "wait-weights": "wait_weights", "step": "step_time"}
lines = re.findall(r"^time \(ms\): (.*)$", out, re.M)
assert len(lines) == 2, out  # steps 2 and 4 (steps_per_print 2)
for step, line in zip((2, 4), lines):
    got = dict(re.findall(r"([a-z-]+) ([0-9.]+)", line))
    assert set(got) == set(keys), got
    for name, key in keys.items():
        ms = 1e3 * steps[step][key]
        assert abs(float(got[name]) - ms) <= 5e-4 + 1e-3 * ms, (step, name, got[name], ms)
    assert float(got["forward"]) > 0, line  # tens of microseconds: not 0.0000
print("breakdown ok")
PY
"$PY" "$W/bd.py" "$W/bd.txt" "$W/bd/metrics.jsonl" >"$W/bdcheck.txt" 2>&1
check "wall_clock_breakdown: the console's 'time (ms):' lines are the step's metrics.jsonl figures in ms (a forward of tens of us is not 0.0000)" \
  "[ $rc -eq 0 ] && grep -q '^breakdown ok' '$W/bdcheck.txt'" || { cat "$W/bdcheck.txt"; grep time "$W/bd.txt"; }

# ---- small values keep their significant digits
"$PY" -c "print('a' * 200000)" > "$W/aaa.txt"
"$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$W/aaa" "$W/aaa.txt" >/dev/null 2>&1
cat > "$W/a.json" <<J
{"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 0}}
J
"$ZOFF" train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --tokenizer byte \
  --data-path "$W/aaa_train.bin" --val-path "$W/aaa_val.bin" --eval-iters 2 --config "$W/a.json" \
  --train-iters 60 --save "$W/aaa" >"$W/aaa_run.txt" 2>&1
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

# zoff eval of that model: the same rule (its --json loss was "%.6f": 0.000001; its line "loss 0.0000")
"$ZOFF" eval --load "$W/aaa" --data-path "$W/aaa_val.bin" --json >"$W/aaa_eval.json" 2>/dev/null
"$ZOFF" eval --load "$W/aaa" --data-path "$W/aaa_val.bin" >"$W/aaa_eval.txt" 2>/dev/null
"$PY" - "$W/aaa_eval.json" "$W/aaa_eval.txt" >"$W/evsmall.txt" 2>&1 <<'PY'
import json, re, sys
t = re.search(r'"loss":([^,}]*)', open(sys.argv[1]).read()).group(1)
x = float(t)
assert 0 < x < 1e-3, (t, "not a small loss: the check would prove nothing")
assert len(re.match(r"-?([0-9.]+)", t).group(1).replace(".", "").lstrip("0")) >= 6, (t, "fewer than 6 significant digits")
line = re.search(r"zoff eval: loss (\S+),", open(sys.argv[2]).read()).group(1)
assert abs(float(line) - x) <= 1e-2 * x, (line, t)
print("eval small ok", t, line)
PY
check "zoff eval of that model: --json's loss keeps 6 significant digits, the line's 4 (not 0.000001 / 0.0000)" \
  "grep -q '^eval small ok' '$W/evsmall.txt'" || cat "$W/evsmall.txt"

# ---- host memory: the summary's peak is the process's resident peak, as the kernel counts it for the parent
cat > "$W/off.json" <<J
{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}}
J
cat > "$W/rss.py" <<'PY'
import os, re, resource, subprocess, sys
asan = os.environ.get("ASAN_OPTIONS", "")  # a sanitizer build: no leak scan growing the process after the summary
env = dict(os.environ, ASAN_OPTIONS=(asan + ":" if asan else "") + "detect_leaks=0")
p = subprocess.run(sys.argv[1:], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
kernel = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the child's peak RSS (bytes)
m = re.search(r"^zoff: peak memory: .*host resident ([0-9.]+) (B|KiB|MiB|GiB) \(the process's VmHWM\)$", p.stderr, re.M)
assert p.returncode == 0 and m, p.stderr[-2000:]
said = float(m.group(1)) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]
# the kernel's figure is the peak over the whole life, the summary's a moment before the end: never above it,
# and the teardown after it adds nothing (0.2 MiB here) but in an AddressSanitizer build (its shadow of the
# memory freed: 128 MiB at the summary, 138 MiB at exit)
slack = 0.15 if os.environ.get("SANITIZED") == "1" else 0.03
assert said <= kernel + (1 << 20) and said >= (1 - slack) * kernel - (2 << 20), (said, kernel)
print("rss ok", said, kernel)
PY
SANITIZED=$(grep -q __asan_init "$ZOFF" && echo 1 || echo 0) "$PY" "$W/rss.py" "$ZOFF" train --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 32 --tokenizer byte \
  --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 1 --config "$W/off.json" \
  --train-iters 2 --no-checkpoint --save "$W/off" >"$W/rss.txt" 2>&1
check "offloaded optimizer: the summary's host resident peak is the kernel's max RSS of the process (within 3% + 2 MiB; ASan 15%)" \
  "grep -q '^rss ok' '$W/rss.txt'" || cat "$W/rss.txt"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
