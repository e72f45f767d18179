#!/usr/bin/env bash
# docs/config.md as a user reads it, checked against `zoff train` (test_config checks the key lists;
# this checks what the page says the command does):
#   - every row of "Valid DeepSpeed, not implemented": the values it says are accepted train, and
#     another value is refused before training (exit 2) naming the key;
#   - the example messages the page quotes (the "not implemented" refusal, the "auto" error, the
#     "accepted, no effect" log line) are what zoff prints, up to the page's line breaks and "...".
# Usage: cli_docs_config.sh ZOFF SRCDIR
set -u
ZOFF=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); SRC="$2"
W=$(mktemp -d "${TMPDIR:-/tmp}/zoff-docs-config-XXXXXX")
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check
if [ -z "$PY" ]; then echo "skip: no python3 to read docs/config.md"; exit 77; fi

byte_corpus "$SRC" "$W"
cat > "$W/run.sh" <<EOF
#!/usr/bin/env bash
# run.sh CONFIG: one tiny zoff train step with that config, nothing saved; stderr as is
exec "$ZOFF" train --config "\$1" --num-layers 1 --hidden-size 16 --num-attention-heads 1 --seq-length 8 \
  --micro-batch-size 1 --train-iters 1 --eval-iters 0 --tokenizer byte --data-path "$W/corpus_train.bin" \
  --no-checkpoint --save "$W/out" --overwrite
EOF
chmod +x "$W/run.sh"

"$PY" - "$SRC/docs/config.md" "$W" > "$W/checks.txt" <<'PYEOF'
import json, re, subprocess, sys
doc, work = open(sys.argv[1]).read(), sys.argv[2]
results = []

def train(cfg, name):
    path = f"{work}/{name}.json"
    with open(path, "w") as f:
        f.write(cfg if isinstance(cfg, str) else json.dumps(cfg))
    p = subprocess.run([f"{work}/run.sh", f"{name}.json"], capture_output=True, text=True, cwd=work)
    return p.returncode, p.stderr

def nest(key, value):
    for part in reversed(key.split(".")):
        value = {part: value}
    return value

def other(v):  # a value DeepSpeed allows that the row says zoff refuses
    if isinstance(v, bool): return not v
    if v is None: return "fp16"
    if isinstance(v, (int, float)): return v + 1
    return {"mean": "sum", "fp32": "bf16"}.get(v, v + "x")

# 1. "Valid DeepSpeed, not implemented": accepted values train, another is refused by name
table = doc.split("## Valid DeepSpeed, not implemented")[1].split("\n## ")[0]
rows = 0
for line in table.splitlines():
    m = re.match(r"\| `([^`]+)` \|[^|]*\| (.*) \|$", line)
    if not m: continue
    key, says = m.groups()
    at = re.match(r"accepted at `([^`]+)`( or null)?; other values refused", says)
    switch = re.match(r"accepted with `(\w+)` false or absent", says)
    empty = re.match(r"accepted empty \(`\{\}`\) or null; anything in it refused", says)
    if at:
        v = json.loads(at.group(1))
        good, refused = [v] + ([None] if at.group(2) else []), other(v)
        good, refused = [nest(key, g) for g in good], nest(key, refused)
    elif switch:
        good, refused = [nest(key, {switch.group(1): False}), nest(key, {})], nest(key, {switch.group(1): True})
    elif empty:
        good, refused = [nest(key, {}), nest(key, None)], nest(key, {"x": 1})
    else:
        results.append((False, f"{key}: the row's wording is not one this test reads: {says[:60]}"))
        continue
    rows += 1
    for i, g in enumerate(good):
        g["train_micro_batch_size_per_gpu"] = 1
        rc, err = train(g, f"ok{rows}_{i}")
        results.append((rc == 0, f"{key}: {json.dumps(g)} is accepted (exit {rc}: {err.strip()[-200:]})"))
    refused["train_micro_batch_size_per_gpu"] = 1
    rc, err = train(refused, f"no{rows}")
    results.append((rc == 2 and "not implemented yet" in err and key in err,
                    f"{key}: {json.dumps(refused)} is refused naming it (exit {rc}: {err.strip()[-200:]})"))
results.append((rows >= 40, f"{rows} rows of 'Valid DeepSpeed, not implemented' read"))

# 2. the quoted messages: the page's text (lines joined) is what zoff prints, up to its "..."
def quoted(phrase):  # the indented block quoting a message with this phrase, its lines joined
    at = doc.find(phrase)
    if at < 0: return "(the page quotes no message with '%s')" % phrase
    start = doc.rfind("\n", 0, at) + 1
    return " ".join(doc[start:].split("\n\n", 1)[0].split())

def same(name, text, err):
    want = text.split(" ...")[0].rstrip(",;")
    got = " ".join(err.split())
    results.append((want in got, f"the page's {name} message is zoff's: '{want[:90]}...' (zoff: '{got[:300]}')"))

rc, err = train('{"train_micro_batch_size_per_gpu": 1, "wandb": {"enabled": true}}', "ds")
same("not-implemented", quoted("ds.json: not implemented yet"), err)
rc, err = train('{"train_batch_size": "auto", "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}', "ds")
same('"auto"', quoted('ds.json: "auto" at'), err)
rc, err = train('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"contiguous_gradients": true}}', "ds")
same("no-effect", quoted("ds.json: accepted, no effect"), err)

for good, what in results:
    print(("ok   - " if good else "FAIL - ") + what)
PYEOF
rc=$?
[ $rc -eq 0 ] || bad "the python checker ran (exit $rc)"
while IFS= read -r line; do # its lines into the totals
  case "$line" in "ok   - "*) ok "${line#ok   - }" ;; "FAIL - "*) bad "${line#FAIL - }" ;; esac
done < "$W/checks.txt"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
