#!/usr/bin/env bash
# DeepSpeed's monitors: "tensorboard" and "csv_monitor" in the config. The event file is read
# here by a reader written from TensorFlow's formats (TFRecord framing with masked CRC32C,
# the Event and Summary protobufs decoded by hand), independent of zoff's writer; its values
# must be metrics.jsonl's: the loss at the samples before each step, the next step's lr and
# the loss scale (fp16) after it, the validation losses, DeepSpeed's timers with
# wall_clock_breakdown, on DeepSpeed's x axis (samples).
# The csv files the same, DeepSpeed's names and header. A resumed run adds a second event file
# and appends rows under the one header; after a crash past the last checkpoint the rows of the
# steps after it come twice, read as the docs say. Usage: cli_monitor.sh ZOFF SRCDIR
set -u
ZOFF="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; SRC="$2" # absolute: one run below starts in another folder
W=$(mktemp -d /tmp/zoff-mon-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check, byte_corpus, PY

byte_corpus "$SRC" "$W"
cat > "$W/mon.json" <<J
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
 "fp16": {"enabled": true, "initial_scale_power": 18, "hysteresis": 1}, "wall_clock_breakdown": true,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}},
 "tensorboard": {"enabled": true, "output_path": "$W/tb", "job_name": "run1"},
 "csv_monitor": {"enabled": true, "output_path": "$W/csv", "job_name": "run1"},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
J
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --tokenizer byte
      --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 2 --quiet --config "$W/mon.json")
"$ZOFF" train "${TINY[@]}" --train-iters 3 --save "$W/run" >"$W/o1.txt" 2>&1
rc1=$?
"$ZOFF" train "${TINY[@]}" --train-iters 6 --eval-interval 2 --save "$W/run" --load "$W/run" >"$W/o2.txt" 2>&1
rc2=$?
check "3 steps, then resumed to 6 with tensorboard and csv_monitor on: exit 0" "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]"

cat > "$W/read.py" <<'PY'
import glob, json, math, struct, sys
W = sys.argv[1]

def crc32c(data):  # CRC-32C (Castagnoli), reflected polynomial 0x82F63B78
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def masked(c):
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def varint(b, i):
    v = s = 0
    while True:
        c = b[i]; i += 1
        v |= (c & 0x7F) << s; s += 7
        if not c & 0x80:
            return v, i

def fields(b):  # protobuf message -> [(field, wire, value)]
    out, i = [], 0
    while i < len(b):
        key, i = varint(b, i)
        f, w = key >> 3, key & 7
        if w == 0: v, i = varint(b, i)
        elif w == 1: v = b[i:i + 8]; i += 8
        elif w == 5: v = b[i:i + 4]; i += 4
        elif w == 2:
            n, i = varint(b, i); v = b[i:i + n]; i += n
        else: raise ValueError("wire type %d" % w)
        out.append((f, w, v))
    return out

def records(path):
    b = open(path, "rb").read()
    i = 0
    while i < len(b):
        (n,) = struct.unpack_from("<Q", b, i)
        (hc,) = struct.unpack_from("<I", b, i + 8)
        assert hc == masked(crc32c(b[i:i + 8])), "length crc"
        d = b[i + 12:i + 12 + n]
        (dc,) = struct.unpack_from("<I", b, i + 12 + n)
        assert dc == masked(crc32c(d)), "data crc"
        i += 12 + n + 4
        yield d

files = sorted(glob.glob(W + "/tb/run1/events.out.tfevents.*"))
assert len(files) == 2, files  # the first run's and the resumed run's
scalars, starts = {}, []
for path in files:
    first = True
    for rec in records(path):
        ev = fields(rec)
        f = {k: v for k, _, v in ev}
        assert 1 in f and 2 in f, ev  # wall_time, step
        (wall,) = struct.unpack("<d", f[1])
        assert wall > 1.6e9, wall
        if first:
            assert f.get(3) == b"brain.Event:2", ev
            first = False
            continue
        if 7 in f:  # SessionLog: a resume's START (status 1) at its checkpoint's samples
            assert {k: v for k, _, v in fields(f[7])} == {1: 1}, ev
            starts.append((path, f[2]))
            continue
        (val,) = [v for k, _, v in fields(f[5]) if k == 1]
        vf = {k: v for k, _, v in fields(val)}
        tag = vf[1].decode()
        (x,) = struct.unpack("<f", vf[2])
        scalars.setdefault(tag, []).append((f[2], x))

assert starts == [(files[1], 3 * 8 + 1)], starts  # none in the first start's file; the resume's past step 3's samples
steps = [json.loads(l) for l in open(W + "/run/metrics.jsonl") if '"loss"' in l]
vals = [json.loads(l) for l in open(W + "/run/metrics.jsonl") if '"val_loss"' in l]
gbs = 8  # micro 4 x accumulation 2 x 1 rank
assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
def close(a, b):
    return abs(a - b) <= 2e-6 * max(1.0, abs(b))
loss = scalars["Train/Samples/train_loss"]
assert [x for x, _ in loss] == [(s["step"] - 1) * gbs for s in steps], loss
assert all(close(v, s["loss"]) for (_, v), s in zip(loss, steps)), (loss, steps)
lr = scalars["Train/Samples/lr"]
assert [x for x, _ in lr] == [s["step"] * gbs for s in steps], lr
# DeepSpeed logs the lr after its scheduler stepped: the next step's
assert all(close(v, s["lr"]) for (_, v), s in zip(lr[:-1], steps[1:])), (lr, steps)
scale = scalars["Train/Samples/loss_scale"]
assert [x for x, _ in scale] == [s["step"] * gbs for s in steps], scale
assert all(close(v, s["loss_scale"]) for (_, v), s in zip(scale[:-1], steps[1:])), (scale, steps)
ev = scalars["Eval/Samples/val_loss"]
assert [x for x, _ in ev] == [v["step"] * gbs for v in vals], (ev, vals)
assert [v["step"] for v in vals] == [0, 3, 3, 4, 6], vals  # before/after each run, --eval-interval 2
assert all(close(x, v["val_loss"]) for (_, x), v in zip(ev, vals)), (ev, vals)
# wall_clock_breakdown: DeepSpeed's timers in ms after each step; forward and backward are metrics.jsonl's
for name, key in (("forward", "forward"), ("backward", "backward"), ("step", None)):
    t = scalars["Train/Samples/elapsed_time_ms_" + name]
    assert [x for x, _ in t] == [s["step"] * gbs for s in steps], t
    assert all(v >= 0 for _, v in t), t
    if key:
        assert all(abs(v - 1e3 * s[key]) <= 1e-3 + 1e-5 * v for (_, v), s in zip(t, steps)), (t, steps)

# csv_monitor: DeepSpeed's files, "step,<last part>" once, then the same events
for tag, rows in scalars.items():
    path = W + "/csv/run1/" + tag.replace("/", "_") + ".csv"
    lines = open(path, newline="").read().split("\r\n")
    assert lines[-1] == "", path
    assert lines[0] == "step," + tag.split("/")[-1], (path, lines[0])
    got = [tuple(l.split(",")) for l in lines[1:-1]]
    assert [int(a) for a, _ in got] == [x for x, _ in rows], (path, got, rows)
    assert all(abs(float(b) - v) <= 1e-6 * max(1.0, abs(v)) for (_, b), (_, v) in zip(got, rows)), (path, got, rows)
print("events:", {k: len(v) for k, v in sorted(scalars.items())})
PY
"$PY" "$W/read.py" "$W" >"$W/read.txt" 2>&1
check "the event files read back (CRCs, Event/Summary protobufs) and the csv files hold metrics.jsonl's values on DeepSpeed's axis" \
  "grep -q '^events:' '$W/read.txt'" || cat "$W/read.txt"

# A crash past the last checkpoint, then a resume: the csv files are appended from the checkpoint's
# step, so the rows of the steps trained after it come twice and the samples go back (as
# metrics.jsonl's lines; docs/config.md and docs/reliability.md "Open" say so and how to read them:
# at each row, drop the earlier rows at its samples or after). The crash is its files: 4 steps logged,
# checkpoints at 2 and 4, the one at 4 removed (a kill before it was written).
cat > "$W/cr.json" <<J
{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
 "csv_monitor": {"enabled": true, "output_path": "$W/csv", "job_name": "cr"},
 "tensorboard": {"enabled": true, "output_path": "$W/tb", "job_name": "cr"}}
J
CR=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --tokenizer byte --data-path "$W/corpus_train.bin"
    --val-path "$W/corpus_val.bin" --eval-iters 2 --quiet --config "$W/cr.json" --save "$W/cr")
"$ZOFF" train "${CR[@]}" --train-iters 4 --save-interval 2 >"$W/cr1.txt" 2>&1 && rm -rf "$W/cr/step_00000004" \
  && "$ZOFF" train "${CR[@]}" --train-iters 5 --load "$W/cr" >"$W/cr2.txt" 2>&1
check "4 steps (checkpoint at 2 kept, at 4 lost), then resumed to 5 with csv_monitor: exit 0" "[ \$? -eq 0 ]" || cat "$W/cr1.txt" "$W/cr2.txt"
cat > "$W/cr.py" <<'PY'
import json, sys
W, gbs = sys.argv[1], 4
def rows(name):
    lines = open(W + "/csv/cr/" + name + ".csv", newline="").read().split("\r\n")
    assert lines[0].startswith("step,") and lines[-1] == "", lines
    return [(int(a), float(b)) for a, b in (l.split(",") for l in lines[1:-1])]
def read(rs):  # the documented rule: each row drops the earlier rows at its samples or after
    out = []
    for x, v in rs:
        out = [r for r in out if r[0] < x] + [(x, v)]
    return out
# metrics.jsonl by its documented rule: at a start line, drop the steps after its S; the last line per step
loss, val = {}, {}
for l in open(W + "/cr/metrics.jsonl"):
    m = json.loads(l)
    if "startup_time" in m:
        loss = {k: v for k, v in loss.items() if k <= m["step"]}
        val = {k: v for k, v in val.items() if k <= m["step"]}
    if "loss" in m: loss[m["step"]] = m["loss"]
    if "val_loss" in m: val[m["step"]] = m["val_loss"]
close = lambda a, b: abs(a - b) <= 1e-6 * max(1.0, abs(b))
tl, vl, lr = rows("Train_Samples_train_loss"), rows("Eval_Samples_val_loss"), rows("Train_Samples_lr")
# as written: steps 3 and 4 twice (the samples go back to step 3's after step 4's), the same values
assert [x for x, _ in tl] == [0, 4, 8, 12, 8, 12, 16], tl
assert close(tl[4][1], tl[2][1]) and close(tl[5][1], tl[3][1]), tl
assert [x for x, _ in lr] == [4, 8, 12, 16, 12, 16, 20], lr
assert [x for x, _ in vl] == [0, 16, 8, 20], vl  # before/after the first start, before/after the resume
# read by the rule: one row per step, the resumed run's, metrics.jsonl's values
assert [x for x, _ in read(tl)] == [(s - 1) * gbs for s in sorted(loss)] == [0, 4, 8, 12, 16], read(tl)
assert all(close(v, loss[x // gbs + 1]) for x, v in read(tl)), (read(tl), loss)
assert [x for x, _ in read(lr)] == [4, 8, 12, 16, 20], read(lr)
assert [x for x, _ in read(vl)] == [s * gbs for s in sorted(val)] == [0, 8, 20], (read(vl), val)
assert all(close(v, val[x // gbs]) for x, v in read(vl)), (read(vl), val)
print("csv after a resume: ok")
PY
# TensorBoard the same: each start its own event file (named by its start time: read in name
# order), the resumed one's events from its checkpoint's step, so the steps after it are in both
# files. The resumed file begins with a SessionLog START event (Event field 7, status 1) past the
# checkpoint's samples, as torch's SummaryWriter(purge_step=) writes one: TensorBoard's reader
# (EventAccumulator, file_version 2) then drops every earlier event past the checkpoint (before: no
# START, so TensorBoard showed steps 3-4 twice). Those at its samples stay (step 2's lr; step 3's
# loss, logged before it, is there from both starts, the same value). Read by TensorBoard's rule,
# the files hold the csv's curve read by its rule.
cat >> "$W/cr.py" <<'PY'
sys.argv = [sys.argv[0], W]
src = open(W + "/read.py").read()
exec(src[:src.index("files = sorted(")])  # the TFRecord / protobuf reader above, not its checks
import glob
files = sorted(glob.glob(W + "/tb/cr/events.out.tfevents.*"))
assert len(files) == 2, files  # the first start's and the resumed one's
per, starts = [], []  # per file: {tag: [(samples, value)]}; the START events' samples
tb = {}  # TensorBoard's reading: the files in order, a START purges every tag's events at its step or after
for path in files:
    tags = {}
    for rec in records(path):
        f = {k: v for k, _, v in fields(rec)}
        if 7 in f:  # SessionLog { status = 1 }
            sl = {k: v for k, _, v in fields(f[7])}
            assert sl.get(1) == 1, ("a SessionLog that is not START", sl)
            starts.append((path, f[2]))
            tb = {k: [e for e in v if e[0] < f[2]] for k, v in tb.items()}
            continue
        if 5 not in f: continue  # the file_version record
        (val,) = [v for k, _, v in fields(f[5]) if k == 1]
        vf = {k: v for k, _, v in fields(val)}
        tags.setdefault(vf[1].decode(), []).append((f[2], struct.unpack("<f", vf[2])[0]))
        tb.setdefault(vf[1].decode(), []).append(tags[vf[1].decode()][-1])
    per.append(tags)
assert starts == [(files[1], 9)], starts  # one START, in the resumed file, past step 2's samples (2 x 4)
loss0, loss1 = per[0]["Train/Samples/train_loss"], per[1]["Train/Samples/train_loss"]
assert [x for x, _ in loss0] == [0, 4, 8, 12] and [x for x, _ in loss1] == [8, 12, 16], (loss0, loss1)
for tag, csvrows in (("Train/Samples/train_loss", tl), ("Train/Samples/lr", lr), ("Eval/Samples/val_loss", vl)):
    both = per[0].get(tag, []) + per[1].get(tag, [])
    assert [x for x, _ in both] == [x for x, _ in csvrows], (tag, both, csvrows)
    assert [x for x, _ in read(both)] == [x for x, _ in read(csvrows)], (tag, read(both))
    assert all(abs(a[1] - b[1]) <= 1e-6 * max(1.0, abs(b[1])) for a, b in zip(read(both), read(csvrows))), tag
    last = {}
    for x, v in tb[tag]: last[x] = v  # TensorBoard's purge: the last start's curve (one x, 8, from both)
    assert sorted(last.items()) == read(both), (tag, tb[tag], read(both))
    assert len(tb[tag]) - len(last) <= 1, (tag, tb[tag])  # without the purge: 12 twice too
print("tensorboard after a resume: ok")
PY
"$PY" "$W/cr.py" "$W" >"$W/cr.txt" 2>&1
check "... the csv rows of steps 3-4 come twice, the samples going back; read by the documented rule: metrics.jsonl's curve" \
  "grep -q '^csv after a resume: ok' '$W/cr.txt'" || cat "$W/cr.txt"
check "... tensorboard: two event files, the resumed one's from step 3 with a SessionLog START past step 2's samples; TensorBoard's purge gives the csv's curve read by its rule" \
  "grep -q '^tensorboard after a resume: ok' '$W/cr.txt'" || cat "$W/cr.txt"
check "... docs/config.md's tensorboard says so and how to read it (before: nothing of a resume)" \
  "grep '^| .tensorboard.enabled' '$SRC/docs/config.md' | grep -q 'steps after it are in the earlier start.s file and again in the resumed one.s.*SessionLog START'"
check "... docs/config.md's csv_monitor says so and how to read it (before: only 'header once, also across resumes')" \
  "grep '^| .csv_monitor.enabled' '$SRC/docs/config.md' | grep -q 'samples go back.*drops, at each row, the earlier rows at its samples or after'"

# a resume with another global batch: the x axis goes on from the samples trained (the checkpoint's
# consumed tokens / seq_len, DeepSpeed's global_samples), not the step x the new batch
sed 's/"train_micro_batch_size_per_gpu": 4/"train_micro_batch_size_per_gpu": 8/; s|"job_name": "cr"|"job_name": "gb"|g' "$W/cr.json" > "$W/gb8.json"
sed 's|"job_name": "cr"|"job_name": "gb"|g' "$W/cr.json" > "$W/gb4.json"
GB=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --tokenizer byte --data-path "$W/corpus_train.bin"
    --eval-iters 0 --quiet --save "$W/gb")
"$ZOFF" train "${GB[@]}" --config "$W/gb4.json" --train-iters 2 >"$W/gb.txt" 2>&1 &&
  "$ZOFF" train "${GB[@]}" --config "$W/gb8.json" --train-iters 4 --load "$W/gb" >>"$W/gb.txt" 2>&1
rc=$?
check "2 steps at batch 4, resumed to 4 at batch 8: train_loss at samples 0, 4, 8, 16 (before: 0, 4, 16, 24)" \
  "[ $rc -eq 0 ] && [ \"\$(tail -n +2 '$W/csv/gb/Train_Samples_train_loss.csv' | cut -d, -f1 | tr -d '\r' | tr '\n' ' ')\" = '0 4 8 16 ' ]" ||
  { cat "$W/gb.txt"; cat "$W/csv/gb/Train_Samples_train_loss.csv"; }

# defaults: output_path "" is the working directory, job_name DeepSpeedJobName (as DeepSpeed)
sed 's|"tensorboard": {[^}]*}|"tensorboard": {"enabled": true}|; s|"csv_monitor": {[^}]*}|"csv_monitor": {"enabled": true}|' \
  "$W/mon.json" > "$W/def.json"
mkdir -p "$W/cwd"
(cd "$W/cwd" && "$ZOFF" train "${TINY[@]/$W\/mon.json/$W/def.json}" --train-iters 1 --save "$W/def" >/dev/null 2>&1)
check "defaults: ./DeepSpeedJobName/ holds the event file and the csv files" \
  "ls '$W/cwd/DeepSpeedJobName/' | grep -q '^events.out.tfevents' && [ -f '$W/cwd/DeepSpeedJobName/Train_Samples_lr.csv' ]"

# an event file of an earlier start with this pid in this second (zoff as pid 1 in a container,
# restarted within a second) is kept: the new start takes the next N (before: O_TRUNC emptied it)
if unshare --fork --pid --mount-proc true 2>/dev/null; then
  mkdir -p "$W/pid1/tb1"; t0=$(date +%s)
  for t in $(seq "$t0" $((t0 + 60))); do
    printf 'an earlier start' > "$W/pid1/tb1/events.out.tfevents.$(printf %010d "$t").$(hostname).1.0"
  done
  sed "s|\"output_path\": \"$W/tb\", \"job_name\": \"run1\"|\"output_path\": \"$W/pid1\", \"job_name\": \"tb1\"|" \
    "$W/mon.json" > "$W/pid1.json"
  unshare --fork --pid --mount-proc "$ZOFF" train "${TINY[@]/$W\/mon.json/$W/pid1.json}" --train-iters 1 \
    --save "$W/pid1/run" >"$W/pid1.txt" 2>&1
  rc=$?
  check "pid 1 beside an earlier pid 1's event files of this second: exit 0, each kept, the new one named .1" \
    "[ $rc -eq 0 ] && [ \$(grep -l '^an earlier start\$' '$W'/pid1/tb1/*.1.0 | wc -l) -eq 61 ] && \
     [ \$(ls '$W'/pid1/tb1/ | grep -c '\.1\.1\$') -eq 1 ] && [ -s \"\$(ls '$W'/pid1/tb1/*.1.1)\" ]" ||
    { ls -l "$W/pid1/tb1" | head; cat "$W/pid1.txt"; }
else echo "skip - an earlier start's event file with this pid: no pid namespace here (unshare --pid)"; fi

# an output_path under a file: exit 2 naming the key, before training
sed "s|\"output_path\": \"$W/tb\"|\"output_path\": \"$W/o1.txt/tb\"|" "$W/mon.json" > "$W/bad.json"
"$ZOFF" train "${TINY[@]/$W\/mon.json/$W/bad.json}" --train-iters 1 --save "$W/bad" >"$W/bad.txt" 2>&1
rc=$?
check "tensorboard.output_path under a file: exit 2, says tensorboard and the folder" \
  "[ $rc -eq 2 ] && grep -q 'tensorboard: cannot create .*o1.txt/tb/run1' '$W/bad.txt'"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
