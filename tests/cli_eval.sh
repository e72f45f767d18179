#!/usr/bin/env bash
# zoff eval: the loss and perplexity of weights on token shards. The reference is an independent
# GPT-2 in PyTorch (tests/fixtures/safetensors_gpt2_ref.py, float64) on a random model written by
# Python, over the same windows (llm.c's: window k of a shard = tokens k*T .. k*T+T, in file order,
# whole batches): the mean cross-entropy must agree. A checkpoint's eval gives the trainer's own
# validation loss on the same windows. Shards of another tokenizer, a context longer than the
# model's and missing flags exit 2. Usage: cli_eval.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-eval-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check, byte_corpus, PY
skip=0

byte_corpus "$SRC" "$W"
# a val shard of a few thousand tokens: PyTorch evaluates all of it
head -c 3001 "$W/corpus.txt" > "$W/small.txt"
"$ZOFF" tokenize --tokenizer byte --quiet --val-fraction 0 --output-prefix "$W/small" "$W/small.txt" >/dev/null 2>&1
"$ZOFF" tokenize --tokenizer gpt2 --quiet --val-fraction 0 --output-prefix "$W/g2" "$W/small.txt" >/dev/null 2>&1

if "$PY" -c 'import torch' 2>/dev/null; then
  "$PY" "$SRC/tests/fixtures/check_export_safetensors.py" random "$W/rand.safetensors" --layers 2 --hidden 32 \
    --heads 2 --positions 32 --vocab 256 >/dev/null
  "$ZOFF" eval --load "$W/rand.safetensors" --tokenizer byte --data-path "$W/small_train.bin" --seq-length 24 \
    --micro-batch-size 7 --json --device cpu >"$W/eval.json" 2>"$W/eval.err"
  check "eval of a random GPT-2 (safetensors, byte shards): exit 0, one JSON object" "[ \$? -eq 0 ] && [ -s '$W/eval.json' ]"
  cat > "$W/ref.py" <<'PY'
import json, math, sys
import numpy as np
import torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[1] + "/tests/fixtures")
from safetensors_gpt2_ref import read_safetensors, strip_names, forward
W, T, B = sys.argv[2], 24, 7
tensors, meta, _ = read_safetensors(W + "/rand.safetensors")
P = strip_names(tensors)
raw = open(W + "/small_train.bin", "rb").read()
tok = np.frombuffer(raw[1024:], dtype="<u2").astype(np.int64)
nw = (len(tok) - 1) // T                 # windows of T+1 tokens starting at k*T
nb = nw // B                             # whole batches only
win = np.stack([tok[k * T:k * T + T + 1] for k in range(nb * B)])
x, y = torch.from_numpy(win[:, :-1]), torch.from_numpy(win[:, 1:])
with torch.no_grad():
    logits = forward(P, x, 2)
loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
got = json.load(open(W + "/eval.json"))
assert got["windows"] == nb * B and got["windows_left_out"] == nw - nb * B, (got, nw)
assert got["tokens"] == nb * B * T and got["seq_len"] == T and got["batch"] == B, got
assert abs(got["loss"] - loss) <= 1e-4 * loss, (got["loss"], loss)
assert abs(got["perplexity"] - math.exp(got["loss"])) <= 1e-5 * got["perplexity"], got
print("loss zoff %.6f PyTorch float64 %.6f over %d windows (%d left out)" % (got["loss"], loss, nb * B, nw - nb * B))
PY
  "$PY" "$W/ref.py" "$SRC" "$W" >"$W/ref.txt" 2>&1
  check "its loss, windows and perplexity are PyTorch's on the same windows ($(tail -1 "$W/ref.txt"))" \
    "grep -q '^loss zoff' '$W/ref.txt'"
  # several shards, one shorter than a window: windows never span two shards, the short one gives none
  # and a note names it (before: left out without a word)
  mkdir -p "$W/multi"
  head -c 700 "$W/corpus.txt" > "$W/m1.txt"; tail -c 20 "$W/corpus.txt" > "$W/m2.txt"; tail -c 401 "$W/corpus.txt" > "$W/m3.txt"
  for m in m1 m2 m3; do
    "$ZOFF" tokenize --tokenizer byte --quiet --val-fraction 0 --output-prefix "$W/multi/$m" "$W/$m.txt" >/dev/null 2>&1
  done
  "$ZOFF" eval --load "$W/rand.safetensors" --tokenizer byte --data-path "$W/multi" --seq-length 24 --json \
    --device cpu >"$W/multi.json" 2>"$W/multi.err"
  rc=$?
  cat > "$W/ref_multi.py" <<'PY'
import glob, json, sys
import numpy as np
import torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[1] + "/tests/fixtures")
from safetensors_gpt2_ref import read_safetensors, strip_names, forward
W, T = sys.argv[2], 24
P = strip_names(read_safetensors(W + "/rand.safetensors")[0])
wins = []
for f in sorted(glob.glob(W + "/multi/*.bin")):
    tok = np.frombuffer(open(f, "rb").read()[1024:], dtype="<u2").astype(np.int64)
    wins += [tok[k * T:k * T + T + 1] for k in range((len(tok) - 1) // T)]   # each shard's own windows
win = torch.from_numpy(np.stack(wins))
with torch.no_grad():
    logits = forward(P, win[:, :-1], 2)
loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), win[:, 1:].reshape(-1)).item()
got = json.load(open(W + "/multi.json"))
assert got["windows"] == len(wins) and got["tokens"] == len(wins) * T, (got, len(wins))
assert abs(got["loss"] - loss) <= 1e-4 * loss, (got["loss"], loss)
print("loss zoff %.6f PyTorch float64 %.6f over %d windows of 3 shards" % (got["loss"], loss, len(wins)))
PY
  "$PY" "$W/ref_multi.py" "$SRC" "$W" >"$W/ref_multi.txt" 2>&1
  check "3 shards, one of 20 tokens: PyTorch's loss over each shard's windows ($(tail -1 "$W/ref_multi.txt")), a note names the short one" \
    "[ $rc -eq 0 ] && grep -q '^loss zoff' '$W/ref_multi.txt' \
     && grep -q '^zoff eval: note: .*multi/m2_train.bin has 20 tokens, fewer than a window.s 25 (--seq-length + 1): not evaluated' '$W/multi.err' \
     && [ \$(grep -c note '$W/multi.err') -eq 1 ]"
  # weights holding NaN or Inf (before: eval "loss nan, perplexity nan" and sample a run of token 0, exit 0)
  for bad in nan inf; do
    "$PY" - "$SRC" "$W/rand.safetensors" "$W/$bad.safetensors" $bad <<'PY'
import sys
sys.path.insert(0, sys.argv[1] + "/tests/fixtures")
from safetensors_gpt2_ref import read_safetensors, write_safetensors
tensors, meta, _ = read_safetensors(sys.argv[2])
out = []
for name, t in tensors.items():
    a = t.numpy().astype("<f4").copy()
    if name.endswith("h.1.mlp.c_fc.weight"):
        a[3, 5] = float(sys.argv[4])
    out.append((name, "F32", a))
write_safetensors(sys.argv[3], out, meta)
PY
    "$ZOFF" eval --load "$W/$bad.safetensors" --tokenizer byte --data-path "$W/small_train.bin" --seq-length 24 \
      --device cpu >"$W/$bad.out" 2>"$W/$bad.err"
    rc1=$?
    "$ZOFF" sample --load "$W/$bad.safetensors" --tokenizer byte --max-new-tokens 8 --prompt "int " --device cpu \
      >"$W/${bad}s.out" 2>"$W/${bad}s.err"
    rc2=$?
    check "weights with one $bad: eval and sample exit 2 naming the tensor, no loss or text printed" \
      "[ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && [ ! -s '$W/$bad.out' ] && [ ! -s '$W/${bad}s.out' ] \
       && grep -q 'hold 1 value(s) that are not finite (NaN or Inf), the first in h.1.mlp.c_fc.weight' '$W/$bad.err' \
       && grep -q 'hold 1 value(s) that are not finite (NaN or Inf), the first in h.1.mlp.c_fc.weight' '$W/${bad}s.err'"
    # train --init-from them: the same refusal (before: it trained from them, every loss NaN, exit 0)
    "$ZOFF" train --init-from "$W/$bad.safetensors" --tokenizer byte --data-path "$W/small_train.bin" \
      --seq-length 24 --micro-batch-size 1 --eval-iters 0 --train-iters 1 --save "$W/ft_$bad" >"$W/${bad}t.err" 2>&1
    check "train --init-from weights with one $bad: exit 2 naming the count and the tensor, nothing saved" \
      "[ \$? -eq 2 ] && [ ! -e '$W/ft_$bad' ] \
       && grep -q 'init-from .*$bad.safetensors: the weights hold 1 value(s) that are not finite (NaN or Inf), the first in h.1.mlp.c_fc.weight' '$W/${bad}t.err'"
  done
  # a loss past 709 nats (ln_f scaled 300x): exp(loss) is past a double; --json gives perplexity null
  # (before: "perplexity":inf, which no JSON reader takes)
  "$PY" - "$SRC" "$W/rand.safetensors" "$W/huge.safetensors" <<'PY'
import sys
sys.path.insert(0, sys.argv[1] + "/tests/fixtures")
from safetensors_gpt2_ref import read_safetensors, write_safetensors
tensors, meta, _ = read_safetensors(sys.argv[2])
write_safetensors(sys.argv[3], [(n, "F32", (t.numpy() * (300 if n.endswith("ln_f.weight") else 1)).astype("<f4"))
                                for n, t in tensors.items()], meta)
PY
  "$ZOFF" eval --load "$W/huge.safetensors" --tokenizer byte --data-path "$W/small_train.bin" --seq-length 24 \
    --json --device cpu >"$W/huge.json" 2>"$W/huge.err"
  rc=$?
  check "a loss over 709: exit 0, --json is JSON (perplexity null)" \
    "[ $rc -eq 0 ] && '$PY' -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(not (d[\"loss\"] > 709 and d[\"perplexity\"] is None))' '$W/huge.json'"
  # --tokenizer gpt2 for a model of 256 tokens: refused before any work, naming both sizes (before: sample
  # printed the prompt, then "embed_fwd failed on stream 'compute': ... token id 50256 ... out of range";
  # eval blamed the shards)
  "$ZOFF" sample --load "$W/rand.safetensors" --tokenizer gpt2 --max-new-tokens 4 --prompt "Hello" --device cpu \
    >"$W/tk.out" 2>"$W/tk.err"
  rc1=$?
  "$ZOFF" eval --load "$W/rand.safetensors" --tokenizer gpt2 --data-path "$W/g2_train.bin" --device cpu >/dev/null 2>"$W/tk2.err"
  rc2=$?
  check "--tokenizer gpt2 on a 256-token model: sample and eval exit 2 naming both vocabularies, nothing printed" \
    "[ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && [ ! -s '$W/tk.out' ] \
     && grep -q 'the gpt2 tokenizer has 50257 tokens, more than the model.s vocabulary of 256' '$W/tk.err' \
     && grep -q '^zoff eval: --load: the gpt2 tokenizer has 50257 tokens, more than the model.s vocabulary of 256' '$W/tk2.err'"
else
  echo "skip - eval against PyTorch (no python3-torch under $PY)"; skip=$((skip + 7))
fi

# a checkpoint: eval on the validation shard == the trainer's validation loss over the same windows
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4 --tokenizer byte
      --data-path "$W/corpus_train.bin" --val-path "$W/small_train.bin" --quiet)
nwin=$(( ($(stat -c %s "$W/small_train.bin") - 1024) / 2 - 1 ))
nb=$(( nwin / 16 / 4 ))
"$ZOFF" train "${TINY[@]}" --train-iters 3 --eval-iters "$nb" --save "$W/run" >/dev/null 2>&1
"$ZOFF" eval --load "$W/run" --data-path "$W/small_train.bin" --micro-batch-size 4 --json >"$W/ck.json" 2>&1
rc=$?
want=$(grep '"step":3,"val_loss"' "$W/run/metrics.jsonl" | sed 's/.*"val_loss"://; s/}//')
got=$("$PY" -c "import json; print('%.6f' % json.load(open('$W/ck.json'))['loss'])" 2>/dev/null)
check "eval of a checkpoint (its sequence length 16) == the trainer's validation loss on the same $nb batches ($got vs $want)" \
  "[ $rc -eq 0 ] && [ -n '$want' ] && [ '$got' = '$want' ]"

"$ZOFF" eval --load "$W/run" --data-path "$W/small_train.bin" >"$W/line.txt" 2>&1
check "the summary line: loss, perplexity, tokens, windows" \
  "[ \$? -eq 0 ] && grep -q '^zoff eval: loss [0-9.]*, perplexity [0-9.]* over [0-9]* tokens ([0-9]* windows of 16 + 1 tokens' '$W/line.txt'"

# what the help says is read: windows of T+1 tokens starting at k*T, (N-1)/T of them; --max-batches 0 is all
# (before: "no overlap between windows", and 0 undocumented)
"$ZOFF" eval --load "$W/run" --data-path "$W/small_train.bin" --max-batches 0 --json >"$W/mb0.json" 2>&1
rc=$?
"$ZOFF" eval --help >"$W/eval_help.txt"
check "--max-batches 0: every window, the help's (N-1)/T = $((nwin / 16)); the help says both" \
  "[ $rc -eq 0 ] && grep -q '\"windows\":$((nwin / 16)),' '$W/mb0.json' && grep -q 'windows of 16 + 1' '$W/line.txt' \
   && grep -q '(default 0: all)' '$W/eval_help.txt' && grep -q \"one window's last token is the next one's first\" '$W/eval_help.txt' \
   && grep -q '(N-1)/T windows' '$W/eval_help.txt' && ! grep -q 'no overlap' '$W/eval_help.txt'"
"$ZOFF" bench adam --help >"$W/adam_help.txt"
check "bench adam --help: --threads 0 is the default (all cores)" "grep -q 'default, and 0: ' '$W/adam_help.txt'"

"$ZOFF" eval --load "$W/run" --data-path "$W/small_train.bin" --max-batches 1 >"$W/one.txt" 2>&1
check "--max-batches 1: '1 window of 16 + 1 tokens' (before: '1 windows')" \
  "[ \$? -eq 0 ] && grep -q '^zoff eval: loss .* over 16 tokens (1 window of 16 + 1 tokens; the last windows left out: --max-batches)' '$W/one.txt'"
# wrong input: exit 2, said
"$ZOFF" eval --load "$W/run" --data-path "$W/g2_train.bin" >"$W/e1.txt" 2>&1
rc=$?
check "gpt2 shards on a byte model: exit 2, names the tokenizers" \
  "[ $rc -eq 2 ] && grep -q 'g2_train.bin was written by .*50257 tokens' '$W/e1.txt'"
"$ZOFF" eval --load "$W/run" --data-path "$W/small_train.bin" --seq-length 17 >"$W/e2.txt" 2>&1
rc=$?
check "--seq-length past the model's positions: exit 2, says the limit" "[ $rc -eq 2 ] && grep -q 'give 16 or less' '$W/e2.txt'"
# data smaller than one batch: eval's words (before: the trainer's "one step needs batch 4 x 1 process(es)"
# and two pieces of advice, "use more data or a smaller batch/sequence length; give more tokens or ...")
head -c 41 "$W/small.txt" > "$W/tiny.txt"
"$ZOFF" tokenize --tokenizer byte --quiet --val-fraction 0 --output-prefix "$W/tiny" "$W/tiny.txt" >/dev/null 2>&1
"$ZOFF" eval --load "$W/run" --data-path "$W/tiny_train.bin" --seq-length 16 --micro-batch-size 4 >"$W/e6.txt" 2>&1
rc=$?
check "data of 41 tokens, batches of 4 x 17: exit 2, 'fewer than one batch of 4', one piece of advice" \
  "[ $rc -eq 2 ] && grep -q 'has 41 tokens (1 shard(s)), which give 2 windows of seq_len+1 = 17 tokens, fewer than one batch of 4; give more tokens or a smaller --seq-length / --micro-batch-size\$' '$W/e6.txt' \
   && ! grep -q 'step\\|process\\|use more data' '$W/e6.txt'"
check "... --data-path named once, the data by its path (before: 'zoff eval: --data-path: data loader: --data-path has')" \
  "grep -q '^zoff eval: --data-path: data loader: $W/tiny_train.bin has 41 tokens' '$W/e6.txt' && [ \$(grep -o -- '--data-path' '$W/e6.txt' | wc -l) -eq 1 ]"
"$ZOFF" eval --load "$W/run" >"$W/e3.txt" 2>&1
rc=$?
check "no --data-path: exit 2" "[ $rc -eq 2 ] && grep -q -- '--data-path are required' '$W/e3.txt'"
for c in "sample --load ''" "eval --load '' --data-path x" "export --load '' --output x"; do
  eval "\"\$ZOFF\" $c" >"$W/e5.txt" 2>&1
  rc=$?
  check "zoff $c: exit 2, '--load is empty' (before: 'checkpoint directory is empty')" \
    "[ $rc -eq 2 ] && grep -q -- \"^zoff ${c%% *}: --load is empty: give a checkpoint folder\" '$W/e5.txt'"
done
"$ZOFF" eval --load "$W/run" --data-path "$W/small.txt" >"$W/e4.txt" 2>&1
rc=$?
check "a text file as --data-path: exit 2, the tokenize command, its shards for --data-path (before: 'train on those')" \
  "[ $rc -eq 2 ] && grep -q 'small.txt is text, not a token shard: zoff tokenize .*give those as --data-path' '$W/e4.txt' \
   && ! grep -q 'train on' '$W/e4.txt'"

# an untied LM head (lm_head.weight other than wte): zoff would run wte as the head, another model
# than the file's; eval and sample refuse it (before: a warning, then that other model's loss, exit 0).
# The same head equal to wte (save_pretrained's tied form) runs.
"$ZOFF" export --load "$W/run" --output "$W/hf/" --quiet >/dev/null 2>&1
for kind in untied tied; do
  mkdir -p "$W/$kind" && cp "$W/hf/config.json" "$W/$kind/"
  "$PY" - "$W/hf/model.safetensors" "$W/$kind/model.safetensors" $kind <<'PY'
import json, struct, sys
d = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", d[:8])[0]
h = json.loads(d[8:8 + n]); data = d[8 + n:]
a, b = h["wte.weight"]["data_offsets"]; head = bytearray(data[a:b])
if sys.argv[3] == "untied":
    head[3] ^= 0x40                      # one weight changed: not the embedding any more
h["lm_head.weight"] = dict(h["wte.weight"], data_offsets=[len(data), len(data) + len(head)])
hb = json.dumps(h).encode(); hb += b" " * (-len(hb) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hb)) + hb + data + bytes(head))
PY
done
"$ZOFF" eval --load "$W/untied" --data-path "$W/small_train.bin" >"$W/u1.txt" 2>&1
rc1=$?
"$ZOFF" sample --load "$W/untied" --device cpu --max-new-tokens 2 --prompt "int " >"$W/u2.txt" 2>&1
rc2=$?
check "eval and sample of weights with an untied LM head: exit 2, say why, no loss printed" \
  "[ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && [ \$(grep -c 'lm_head.weight) that differs from its token embedding' '$W/u1.txt' '$W/u2.txt' | grep -c ':1') -eq 2 ] \
   && ! grep -q 'loss' '$W/u1.txt'"
"$ZOFF" eval --load "$W/tied" --data-path "$W/small_train.bin" >"$W/t1.txt" 2>&1
check "the same file with lm_head.weight equal to wte: eval runs (exit 0)" "[ \$? -eq 0 ] && grep -q '^zoff eval: loss' '$W/t1.txt'"
"$ZOFF" train --init-from "$W/untied" --tokenizer byte --data-path "$W/small_train.bin" --eval-iters 0 \
  --train-iters 1 --save "$W/ft_untied" >"$W/u3.txt" 2>&1
check "train --init-from of them: exit 2 too, no checkpoint" \
  "[ \$? -eq 2 ] && grep -q 'lm_head.weight) that differs from its token embedding' '$W/u3.txt' && [ ! -e '$W/ft_untied/step_00000001' ]"
"$ZOFF" train --init-from "$W/tied" --tokenizer byte --data-path "$W/small_train.bin" --eval-iters 0 \
  --train-iters 1 --save "$W/ft_tied" >"$W/t3.txt" 2>&1
check "... and of the tied one: it trains (exit 0)" "[ \$? -eq 0 ] && [ -f '$W/ft_tied/step_00000001/COMPLETE' ]"

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
