#!/usr/bin/env bash
# zoff sample: what it prints, against independent references: random GPT-2s written by Python, their
# greedy tokens from an independent float64 PyTorch GPT-2 (tests/fixtures/safetensors_gpt2_ref.py) over
# the last T tokens of the context, and the text from OpenAI's GPT-2 encoder.py
# (tests/fixtures/gen_bpe_fixture.py) decoding them as Hugging Face's tokenizer.decode does
# (errors="replace").
#  1. GPT-2 tokens that split characters (a model whose head favours GPT-2's byte-fragment tokens):
#     for every --max-new-tokens 0..N the text is the decode of the prompt and the first tokens: valid
#     UTF-8, a character split over tokens whole, bytes that are no UTF-8 and a character the end cuts
#     short as U+FFFD (before: the raw bytes, not UTF-8).
#  2. A prompt longer than the context (a byte-token model): the last T tokens, as nanoGPT crops, and a
#     note saying so (before: silently).
#  3. A model with more rows than the tokenizer has tokens: only the tokenizer's tokens are picked.
# Usage: cli_sample.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-sample-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check, PY

if ! "$PY" -c 'import torch, regex' 2>/dev/null; then
  echo "skip - zoff sample against PyTorch and GPT-2's encoder.py (no python3-torch or python3-regex under $PY)"
  exit 77
fi

# 1. GPT-2 tokens that split characters
N=24
PROMPT='Hello, 日本'
cat > "$W/g2.py" <<'PY'
import codecs, sys
import torch
sys.path.insert(0, sys.argv[1] + "/tests/fixtures")
from safetensors_gpt2_ref import hf_shapes, write_safetensors, forward
from gen_bpe_fixture import load_encoder
W, N, prompt, T = sys.argv[2], int(sys.argv[3]), sys.argv[4], 32
E = load_encoder()
tok_bytes = lambda i: bytes(E.byte_decoder[c] for c in E.decoder[i])  # noqa: E731
frag = []                                 # tokens that are no UTF-8 alone: pieces of characters
for i in range(len(E.decoder)):
    try:
        tok_bytes(i).decode("utf-8")
    except UnicodeDecodeError:
        frag.append(i)
g = torch.Generator().manual_seed(2)      # a random GPT-2 (as check_export_safetensors.py random)
P = {}
for name, shape in hf_shapes(2, 32, T, 50257).items():
    ln = name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
    P[name] = 1.0 + 0.1 * torch.randn(shape, generator=g) if ln else 0.3 * torch.randn(shape, generator=g)
P["wte.weight"][frag] *= 1.7              # whose tied head favours the fragments
P = {k: v.to(torch.float32) for k, v in P.items()}
write_safetensors(W + "/g2.safetensors", [(k, "F32", v.numpy().astype("<f4")) for k, v in P.items()],
                  {"format": "pt", "zoff.num_heads": "2", "zoff.tokenizer": "gpt2"})
P = {k: v.double() for k, v in P.items()}
ids = [50256] + E.encode(prompt)          # zoff sample's context: <|endoftext|>, then the prompt
P0, gap = len(ids), float("inf")
with torch.no_grad():
    for _ in range(N):
        lg = forward(P, torch.tensor([ids[-T:]]), 2)[0, -1]
        top = lg.topk(2).values
        gap = min(gap, (top[0] - top[1]).item())
        ids.append(int(lg.argmax()))
for k in range(N + 1):
    open("%s/exp_%d" % (W, k), "wb").write((E.decode(ids[1:P0 + k]) + "\n").encode())
# what the tokens exercise: a character whose bytes two tokens carry, bytes that are no UTF-8, a cut
dec, joined, bad, cut = codecs.getincrementaldecoder("utf-8")("replace"), 0, 0, 0
for i in ids[P0:]:
    held = dec.getstate()[0]
    out = dec.decode(tok_bytes(i))
    joined += bool(held) and out[:1] not in ("", "\ufffd")
    bad += "\ufffd" in out
    cut += bool(dec.getstate()[0])
print("greedy %d tokens (%d character pieces), smallest top-2 logit gap %.2e: %d characters joined over tokens, "
      "%d tokens with bytes that are no UTF-8, %d ends inside a character" % (N, sum(i in frag for i in ids[P0:]),
                                                                            gap, joined, bad, cut))
sys.exit(0 if gap > 1e-3 and joined and bad and cut else 1)
PY
"$PY" "$W/g2.py" "$SRC" "$W" $N "$PROMPT" >"$W/g2.txt" 2>&1
check "the reference: PyTorch's greedy GPT-2 tokens split characters ($(tail -1 "$W/g2.txt"))" "[ \$? -eq 0 ]"
same=0; valid=0
for k in $(seq 0 $N); do
  "$ZOFF" sample --load "$W/g2.safetensors" --device cpu --temperature 0 --max-new-tokens $k \
    --prompt "$PROMPT" >"$W/got_$k" 2>"$W/err_$k"
  cmp -s "$W/got_$k" "$W/exp_$k" && same=$((same + 1))
  "$PY" -c "open('$W/got_$k', 'rb').read().decode('utf-8')" 2>/dev/null && valid=$((valid + 1))
done
check "every --max-new-tokens 0..$N: valid UTF-8 ($valid of $((N + 1))), the decode of PyTorch's tokens ($same of $((N + 1)))" \
  "[ $valid -eq $((N + 1)) ] && [ $same -eq $((N + 1)) ]" || { cmp "$W/got_$N" "$W/exp_$N"; od -c "$W/got_$N" | head -5; }

# 2. a prompt longer than the model's 32 positions (byte tokens: the output is the bytes as they are)
"$PY" "$SRC/tests/fixtures/check_export_safetensors.py" random "$W/rand.safetensors" --layers 2 --hidden 32 \
  --heads 2 --positions 32 --vocab 256 >/dev/null
LONG='static int parse(const char *text, size_t n, struct state *st) { if '
cat > "$W/crop.py" <<'PY'
import sys
import torch
sys.path.insert(0, sys.argv[1] + "/tests/fixtures")
from safetensors_gpt2_ref import read_safetensors, strip_names, forward
W, prompt, T = sys.argv[2], sys.argv[3].encode(), 32
P = strip_names(read_safetensors(W + "/rand.safetensors")[0])
ctx, gap = list(prompt), float("inf")
with torch.no_grad():
    for _ in range(8):
        lg = forward(P, torch.tensor([ctx[-T:]]), 2)[0, -1]   # the last T tokens, as nanoGPT crops
        top = lg.topk(2).values
        gap = min(gap, (top[0] - top[1]).item())
        ctx.append(int(lg.argmax()))
open(W + "/long_exp", "wb").write(bytes(ctx) + b"\n")
sys.exit(0 if gap > 1e-3 else 1)
PY
"$PY" "$W/crop.py" "$SRC" "$W" "$LONG" >"$W/crop.txt" 2>&1
"$ZOFF" sample --load "$W/rand.safetensors" --tokenizer byte --device cpu --temperature 0 --max-new-tokens 8 \
  --prompt "$LONG" >"$W/got_long" 2>"$W/err_long"
rc=$?
check "a ${#LONG}-token prompt: exit 0, PyTorch's greedy text on its last 32 tokens, a note that it was cut to them" \
  "[ $rc -eq 0 ] && cmp -s '$W/got_long' '$W/long_exp' \
   && grep -q '^zoff sample: note: the prompt is ${#LONG} tokens, longer than the model.s context (its sequence length, 32): it sees the last 32' '$W/err_long'" \
  || cat "$W/crop.txt" "$W/err_long"
"$ZOFF" sample --load "$W/rand.safetensors" --tokenizer byte --device cpu --temperature 0 --max-new-tokens 8 \
  --prompt "${LONG:0:32}" >/dev/null 2>"$W/err_32"
check "a prompt of exactly 32 tokens: no note" "[ \$? -eq 0 ] && ! grep -q note '$W/err_32'"

# 3. a model with more rows than the tokenizer's tokens (nanoGPT pads GPT-2's 50257 to 50304): the rows past
#    50257 are no token and print nothing; here they dominate the logits. zoff picks among the tokenizer's
#    tokens, PyTorch's greedy over logits[:50257] (before: it picked the padding, printing nothing, exit 0)
cat > "$W/pad.py" <<'PY'
import sys
import torch
sys.path.insert(0, sys.argv[1] + "/tests/fixtures")
from safetensors_gpt2_ref import hf_shapes, write_safetensors, forward
from gen_bpe_fixture import load_encoder
W, T, V = sys.argv[2], 32, 50304
E = load_encoder()
g = torch.Generator().manual_seed(3)
P = {}
for name, shape in hf_shapes(2, 32, T, V).items():
    ln = name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
    P[name] = 1.0 + 0.1 * torch.randn(shape, generator=g) if ln else 0.3 * torch.randn(shape, generator=g)
P["wte.weight"][50257:] *= 3             # the padding rows dominate
P = {k: v.to(torch.float32) for k, v in P.items()}
write_safetensors(W + "/pad.safetensors", [(k, "F32", v.numpy().astype("<f4")) for k, v in P.items()],
                  {"format": "pt", "zoff.num_heads": "2"})
P = {k: v.double() for k, v in P.items()}
ids, P0, padded, gap = [50256] + E.encode("Hello"), 2, 0, float("inf")
with torch.no_grad():
    for _ in range(8):
        lg = forward(P, torch.tensor([ids[-T:]]), 2)[0, -1]
        padded += int(lg.argmax()) >= 50257
        top = lg[:50257].topk(2).values
        gap = min(gap, (top[0] - top[1]).item())
        ids.append(int(lg[:50257].argmax()))
open(W + "/pad_exp", "wb").write((E.decode(ids[1:]) + "\n").encode())
print("%d of 8 greedy picks over all 50304 rows are padding; smallest top-2 gap %.2e" % (padded, gap))
sys.exit(0 if padded and gap > 1e-3 else 1)
PY
"$PY" "$W/pad.py" "$SRC" "$W" >"$W/pad.txt" 2>&1
check "the reference: a 50304-row model whose padding rows win ($(tail -1 "$W/pad.txt"))" "[ \$? -eq 0 ]"
"$ZOFF" sample --load "$W/pad.safetensors" --device cpu --temperature 0 --max-new-tokens 8 --prompt Hello \
  >"$W/pad_got" 2>"$W/pad_err"
check "sample of it: exit 0, PyTorch's greedy text over the tokenizer's 50257 tokens" \
  "[ \$? -eq 0 ] && cmp -s '$W/pad_got' '$W/pad_exp'" || cat "$W/pad_got" "$W/pad_err"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
