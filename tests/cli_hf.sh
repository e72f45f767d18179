#!/usr/bin/env bash
# Hugging Face GPT-2 model folders as the Hub has them (model.safetensors with "transformer."
# names, the tied lm_head.weight and old attn.bias buffers, beside a full GPT2Config config.json),
# read by zoff eval, zoff sample and zoff train --init-from. A config.json setting that changes the
# model's math to something zoff does not compute (another activation, LayerNorm epsilon, attention
# scaling, MLP width, another model type) is refused by name with exit 2; before, it was ignored
# and zoff ran another model than the file's (eval's loss was GPT-2's, not the model's). Settings
# that keep GPT-2's math (gelu_pytorch_tanh, reorder_and_upcast_attn, n_inner 4 x width, eps
# 1e-05 written another way) give the plain folder's loss, which is an independent float64
# PyTorch GPT-2's (tests/fixtures/safetensors_gpt2_ref.py) where python3-torch is present.
# Usage: cli_hf.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-hf-XXXXXX)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check, byte_corpus, PY
if [ -z "$PY" ]; then echo "skip: no python3 to write the model folders"; exit 77; fi

byte_corpus "$SRC" "$W"
head -c 3001 "$W/corpus.txt" > "$W/small.txt"
"$ZOFF" tokenize --tokenizer byte --quiet --val-fraction 0 --output-prefix "$W/small" "$W/small.txt" >/dev/null 2>&1

# A random 2-layer GPT-2 (width 32, 2 heads, 32 positions, 256 tokens) as save_pretrained writes it,
# in plain Python (no numpy or torch needed); ARGS: folder, then config.json overrides as JSON
cat > "$W/mk.py" <<'PY'
import json, os, random, struct, sys
d, over = sys.argv[1], json.loads(sys.argv[2])
no_head = over.pop("_no_lm_head", False)  # a folder without lm_head.weight
extra = over.pop("_extra", [])  # [name, rows, cols]: tensors beside GPT-2's (another head's)
L, C, T, V = 2, 32, 32, 256
rng = random.Random(7)
shapes = [("wte.weight", (V, C)), ("wpe.weight", (T, C))]
for l in range(L):
    p = "h.%d." % l
    shapes += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)), (p + "attn.c_attn.weight", (C, 3 * C)),
               (p + "attn.c_attn.bias", (3 * C,)), (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
               (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)), (p + "mlp.c_fc.weight", (C, 4 * C)),
               (p + "mlp.c_fc.bias", (4 * C,)), (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
shapes += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
items = []
for name, shape in shapes:
    n = 1
    for s in shape: n *= s
    ln = name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
    vals = [(1.0 if ln else 0.0) + (0.1 if ln else 0.3) * rng.gauss(0, 1) for _ in range(n)]
    items.append(("transformer." + name, list(shape), struct.pack("<%df" % n, *vals)))
for l in range(L):  # the buffers of older checkpoints
    mask = [1.0 if j <= i else 0.0 for i in range(T) for j in range(T)]
    items.append(("transformer.h.%d.attn.bias" % l, [1, 1, T, T], struct.pack("<%df" % (T * T), *mask)))
    items.append(("transformer.h.%d.attn.masked_bias" % l, [], struct.pack("<f", -1e4)))
if not no_head:
    items.append(("lm_head.weight", [V, C], items[0][2]))  # tied: wte's bytes
for name, *shape in extra:
    n = 1
    for x in shape: n *= x
    items.append((name, shape, struct.pack("<%df" % n, *[rng.gauss(0, 1) for _ in range(n)])))
hdr, off = {"__metadata__": {"format": "pt"}}, 0
for name, shape, raw in items:
    hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + len(raw)]}
    off += len(raw)
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(r for _, _, r in items))
cfg = {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
       "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
       "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": T, "n_embd": C, "n_head": 2, "n_inner": None,
       "n_layer": L, "n_positions": T, "reorder_and_upcast_attn": False, "resid_pdrop": 0.1,
       "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True, "summary_activation": None,
       "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
       "summary_use_proj": True, "use_cache": True, "vocab_size": V}
for k, v in over.items():
    if v == "DELETE": cfg.pop(k, None)
    else: cfg[k] = v
json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
PY
mk() { "$PY" "$W/mk.py" "$W/$1" "$2"; }
EVAL=(--tokenizer byte --data-path "$W/small_train.bin" --seq-length 24 --micro-batch-size 7 --json --device cpu)
loss_of() { "$PY" -c "import json,sys; print('%.6f' % json.load(open(sys.argv[1]))['loss'])" "$1" 2>/dev/null; }

# 1. the plain Hub folder: its loss, and where torch is present the reference's
mk base '{}'
"$ZOFF" eval --load "$W/base" "${EVAL[@]}" >"$W/base.json" 2>"$W/base.err"
check "eval of a Hub-style GPT-2 folder (transformer. names, tied lm_head, attn.bias buffers): exit 0" \
  "[ \$? -eq 0 ] && [ -n \"\$(loss_of '$W/base.json')\" ]" || cat "$W/base.err"
base=$(loss_of "$W/base.json")
if "$PY" -c 'import torch, numpy' 2>/dev/null; then
  "$PY" - "$SRC" "$W" >"$W/ref.txt" 2>&1 <<'PY'
import sys
import numpy as np, torch, torch.nn.functional as F
sys.path.insert(0, sys.argv[1] + "/tests/fixtures")
from safetensors_gpt2_ref import read_safetensors, strip_names, forward
W, T, B = sys.argv[2], 24, 7
P = strip_names(read_safetensors(W + "/base/model.safetensors")[0])
tok = np.frombuffer(open(W + "/small_train.bin", "rb").read()[1024:], dtype="<u2").astype(np.int64)
n = ((len(tok) - 1) // T) // B * B
win = np.stack([tok[k * T:k * T + T + 1] for k in range(n)])
with torch.no_grad():
    lg = forward(P, torch.from_numpy(win[:, :-1]), 2)
print("%.6f" % F.cross_entropy(lg.reshape(-1, lg.shape[-1]), torch.from_numpy(win[:, 1:]).reshape(-1)).item())
PY
  ref=$(tail -1 "$W/ref.txt")
  check "its loss is the float64 PyTorch GPT-2's ($base vs $ref)" \
    "[ -n '$base' ] && \"\$PY\" -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-4 * b)' '$base' '$ref'"
else
  echo "skip - the PyTorch reference loss (no python3-torch under $PY)"
fi

# 2. settings with GPT-2's math: taken, the same loss (tie_word_embeddings false with an lm_head.weight
#    equal to wte: the loader compares the two)
i=0
for over in '{"activation_function": "gelu_pytorch_tanh"}' '{"reorder_and_upcast_attn": true}' '{"n_inner": 128}' \
            '{"layer_norm_epsilon": 1e-5, "n_ctx": 1024}' '{"activation_function": "DELETE", "model_type": "DELETE"}' \
            '{"tie_word_embeddings": false}' '{"_no_lm_head": true}' '{"scale_attn_weights": 1}'; do
  i=$((i + 1)); mk same$i "$over"
  "$ZOFF" eval --load "$W/same$i" "${EVAL[@]}" >"$W/same$i.json" 2>"$W/same$i.err"
  check "config.json $over keeps GPT-2's math: exit 0, the plain folder's loss" \
    "[ \$? -eq 0 ] && [ \"\$(loss_of '$W/same$i.json')\" = '$base' ]" || cat "$W/same$i.err"
done

# 3. settings zoff does not compute: refused, naming the key, config.json and its value (before:
#    exit 0 with the plain GPT-2's loss, not the model's)
i=0
while IFS='|' read -r over key value; do
  i=$((i + 1)); mk other$i "$over"
  "$ZOFF" eval --load "$W/other$i" "${EVAL[@]}" >"$W/other$i.out" 2>"$W/other$i.err"
  check "config.json $over: eval exits 2 naming $key $value in other$i/config.json" \
    "[ \$? -eq 2 ] && [ ! -s '$W/other$i.out' ] && grep -qF 'other$i/config.json says $key $value' '$W/other$i.err'" \
    || cat "$W/other$i.err"
done <<'EOF'
{"activation_function": "relu"}|activation_function|"relu"
{"activation_function": "gelu"}|activation_function|"gelu"
{"layer_norm_epsilon": 1e-6}|layer_norm_epsilon|1e-06
{"scale_attn_weights": false}|scale_attn_weights|false
{"scale_attn_by_inverse_layer_idx": true}|scale_attn_by_inverse_layer_idx|true
{"scale_attn_weights": 0}|scale_attn_weights|0
{"scale_attn_weights": null}|scale_attn_weights|null
{"scale_attn_by_inverse_layer_idx": 1}|scale_attn_by_inverse_layer_idx|1
{"tie_word_embeddings": 0, "_no_lm_head": true}|tie_word_embeddings|0, and the file holds no lm_head.weight
{"n_inner": 64}|n_inner|64
{"model_type": "gpt_neo", "architectures": ["GPTNeoForCausalLM"]}|model_type|"gpt_neo"
{"model_type": "DELETE", "architectures": ["LlamaForCausalLM"]}|architectures|["LlamaForCausalLM"]
{"tie_word_embeddings": false, "_no_lm_head": true}|tie_word_embeddings|false, and the file holds no lm_head.weight
EOF
# (the numbers and null as transformers reads them, Python truth: `if config.scale_attn_weights:`;
#  before: 0 and null were taken as true and 1 as false, the plain GPT-2's loss)

# 3b. a GPT2DoubleHeadsModel file (its multiple-choice head beside GPT-2's tensors): loaded without
#     that head, as transformers' GPT2LMHeadModel does, with a note naming the two tensors; the loss is
#     the plain folder's (before: refused, "not a GPT-2 parameter"). Any other tensor stays refused.
mk dh '{"architectures": ["GPT2DoubleHeadsModel"], "_extra": [["multiple_choice_head.summary.weight", 1, 32], ["multiple_choice_head.summary.bias", 1]]}'
"$ZOFF" eval --load "$W/dh" "${EVAL[@]}" >"$W/dh.json" 2>"$W/dh.err"
check "a GPT2DoubleHeadsModel folder: exit 0, the plain folder's loss, a note naming both multiple_choice_head tensors" \
  "[ \$? -eq 0 ] && [ \"\$(loss_of '$W/dh.json')\" = '$base' ] && [ \$(grep -c 'not loaded: multiple_choice_head.summary.weight, multiple_choice_head.summary.bias' '$W/dh.err') -eq 1 ]" \
  || cat "$W/dh.err"
for x in '["score.weight", 2, 32]' '["multiple_choice_head.summary.other", 1]'; do
  mk dhx '{"architectures": ["GPT2DoubleHeadsModel"], "_extra": [["multiple_choice_head.summary.weight", 1, 32], '"$x"']}'
  "$ZOFF" eval --load "$W/dhx" "${EVAL[@]}" >"$W/dhx.out" 2>"$W/dhx.err"
  rc=$? n=$(echo "$x" | cut -d'"' -f2)
  check "... with $n beside it: exit 2, '$n' is not a GPT-2 parameter" \
    "[ $rc -eq 2 ] && [ ! -s '$W/dhx.out' ] && grep -qF \"tensor '$n' is not a GPT-2 parameter\" '$W/dhx.err'" || cat "$W/dhx.err"
  rm -rf "$W/dhx"
done

# the same for sample and train --init-from (one reader of config.json for all three)
"$ZOFF" sample --load "$W/other1" --tokenizer byte --max-new-tokens 4 >"$W/s.out" 2>"$W/s.err"
check "sample --load a relu model: exit 2 naming activation_function, nothing sampled" \
  "[ \$? -eq 2 ] && [ ! -s '$W/s.out' ] && grep -q 'activation_function \"relu\"' '$W/s.err'"
"$ZOFF" train --tokenizer byte --data-path "$W/corpus_train.bin" --micro-batch-size 4 --seq-length 16 --quiet \
  --init-from "$W/other1" --train-iters 1 --eval-iters 0 --save "$W/ft" >"$W/t.out" 2>"$W/t.err"
check "train --init-from a relu model: exit 2 naming activation_function, no checkpoint" \
  "[ \$? -eq 2 ] && grep -q 'activation_function \"relu\"' '$W/t.err' && [ ! -e '$W/ft/latest' ] && ! ls '$W/ft'/step_* >/dev/null 2>&1"

# a config.json that cannot be read is not passed over (before: "no config.json with n_head beside it:
# put the model's config.json beside it", and with --num-attention-heads whatever it said was ignored)
mkdir -p "$W/badcfg" "$W/dircfg/config.json" && cp "$W/base/model.safetensors" "$W/badcfg/" && cp "$W/base/model.safetensors" "$W/dircfg/"
head -c 200 "$W/base/config.json" > "$W/badcfg/config.json"
"$ZOFF" eval --load "$W/badcfg" "${EVAL[@]}" >/dev/null 2>"$W/bc.err"
check "a config.json cut short: eval exits 2 naming it not valid JSON, with the line" \
  "[ \$? -eq 2 ] && grep -q 'badcfg/config.json (the model.s Hugging Face config, beside .*) is not valid JSON (line [0-9]' '$W/bc.err'" \
  || cat "$W/bc.err"
"$ZOFF" train --tokenizer byte --data-path "$W/corpus_train.bin" --micro-batch-size 4 --seq-length 16 --quiet \
  --num-attention-heads 2 --init-from "$W/badcfg" --train-iters 1 --eval-iters 0 --save "$W/ft4" >/dev/null 2>"$W/bc2.err"
check "train --init-from it with --num-attention-heads: exit 2 all the same" \
  "[ \$? -eq 2 ] && grep -q 'badcfg/config.json .* is not valid JSON' '$W/bc2.err'" || cat "$W/bc2.err"
"$ZOFF" sample --load "$W/dircfg" --tokenizer byte --max-new-tokens 4 >/dev/null 2>"$W/dc.err"
check "a config.json that is a folder: sample exits 2 naming it" \
  "[ \$? -eq 2 ] && grep -q 'dircfg/config.json .* is a folder' '$W/dc.err'" || cat "$W/dc.err"

# folders without model.safetensors: what they hold instead is named, and a path with no model in it
# is said to be so, not "--tokenizer is for safetensors weights" (before, for all three with --tokenizer)
mkdir -p "$W/shards" "$W/fp16name"
"$PY" - "$W/base/model.safetensors" "$W/shards" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h.pop("__metadata__")
names = sorted(h)
for k, part in enumerate([names[:len(names) // 2], names[len(names) // 2:]]):
    hdr, data = {"__metadata__": {"format": "pt"}}, b""
    for t in part:
        blob = b[8 + n + h[t]["data_offsets"][0]:8 + n + h[t]["data_offsets"][1]]
        hdr[t] = dict(h[t], data_offsets=[len(data), len(data) + len(blob)]); data += blob
    j = json.dumps(hdr).encode()
    open(sys.argv[2] + "/model-%05d-of-00002.safetensors" % (k + 1), "wb").write(struct.pack("<Q", len(j)) + j + data)
PY
cp "$W/base/config.json" "$W/shards/"; cp "$W/base/model.safetensors" "$W/fp16name/model.fp16.safetensors"
"$ZOFF" eval --load "$W/shards" "${EVAL[@]}" >/dev/null 2>"$W/sh.err"
check "eval of a folder of 2 shards without their index: exit 2 naming the shards and model.safetensors.index.json" \
  "[ \$? -eq 2 ] && grep -q 'holds 2 shard files (model-00001-of-00002.safetensors, ...) but not the model.safetensors.index.json' '$W/sh.err'" \
  || cat "$W/sh.err"
"$ZOFF" train --tokenizer byte --data-path "$W/corpus_train.bin" --micro-batch-size 4 --seq-length 16 --quiet \
  --init-from "$W/shards" --train-iters 1 --eval-iters 0 --save "$W/ft5" >/dev/null 2>"$W/sh2.err"
check "train --init-from it: exit 2, the same" \
  "[ \$? -eq 2 ] && grep -q 'but not the model.safetensors.index.json' '$W/sh2.err'" || cat "$W/sh2.err"
"$ZOFF" sample --load "$W/fp16name" --tokenizer byte --max-new-tokens 4 >/dev/null 2>"$W/fn.err"
check "sample of a folder holding only model.fp16.safetensors: exit 2 naming the file to give" \
  "[ \$? -eq 2 ] && grep -q 'holds model.fp16.safetensors: give that file (.*fp16name/model.fp16.safetensors)' '$W/fn.err'" \
  || cat "$W/fn.err"
"$ZOFF" sample --load "$W/no-such-model" --tokenizer byte --max-new-tokens 4 >/dev/null 2>"$W/ns.err"
check "sample --load a path that is not there, with --tokenizer: exit 2 saying so, not blaming --tokenizer" \
  "[ \$? -eq 2 ] && grep -q 'No such file' '$W/ns.err' && ! grep -q 'tokenizer' '$W/ns.err'" || cat "$W/ns.err"
"$ZOFF" train --tokenizer byte --data-path "$W/corpus_train.bin" --micro-batch-size 4 --seq-length 16 --num-layers 2 \
  --hidden-size 32 --num-attention-heads 2 --quiet --train-iters 1 --eval-iters 0 --save "$W/run" >/dev/null 2>&1
cp "$W/base/model.safetensors" "$W/run/other.safetensors"
"$ZOFF" sample --load "$W/run" --temperature 0 --max-new-tokens 4 >/dev/null 2>"$W/rn.err"
check "a checkpoint folder that also holds a .safetensors file is still sampled as the checkpoint" "[ \$? -eq 0 ]" || cat "$W/rn.err"

# a head count that cannot be the model's: config.json's n_head not dividing the width, a zoff.num_heads
# that is not a number (before: "shape.hidden_size (32) is not divisible ... (--num-attention-heads)",
# a flag eval and sample do not have; "no zoff.num_heads in its metadata" though it was there)
mk heads3 '{"n_head": 3}'
"$ZOFF" sample --load "$W/heads3" --tokenizer byte --max-new-tokens 4 >/dev/null 2>"$W/h3.err"
check "config.json n_head 3 for width 32: sample exits 2 naming config.json's n_head" \
  "[ \$? -eq 2 ] && grep -q 'the n_head of config.json gives 3 attention heads, which do not divide the width 32' '$W/h3.err' \
   && ! grep -q -- '--num-attention-heads' '$W/h3.err'" || cat "$W/h3.err"
"$PY" - "$W/base/model.safetensors" "$W/nhbad.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h["__metadata__"]["zoff.num_heads"] = "two"
j = json.dumps(h).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(j)) + j + b[8 + n:])
PY
"$ZOFF" eval --load "$W/nhbad.safetensors" "${EVAL[@]}" >/dev/null 2>"$W/nh.err"
check "zoff.num_heads \"two\" in the metadata: eval exits 2 naming it, not 'no zoff.num_heads'" \
  "[ \$? -eq 2 ] && grep -q 'its metadata zoff.num_heads is \"two\", not a positive integer' '$W/nh.err'" || cat "$W/nh.err"

# a config.json of another model (other layers or width) is not read, and a warning says so (before:
# only "no config.json with n_head beside it: put the model's config.json beside it", though one was)
mkdir -p "$W/othercfg" && cp "$W/base/model.safetensors" "$W/othercfg/"
echo '{"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "activation_function": "relu"}' > "$W/othercfg/config.json"
"$ZOFF" eval --load "$W/othercfg" "${EVAL[@]}" >/dev/null 2>"$W/oc.err"
check "a config.json of a 12 x 768 model beside a 2 x 32 file: exit 2 for the heads, a warning naming both shapes" \
  "[ \$? -eq 2 ] && grep -q 'othercfg/config.json describes another model (12 layers, width 768; .*othercfg/model.safetensors has 2, 32): not read' '$W/oc.err'" \
  || cat "$W/oc.err"

# a config.json whose vocabulary or positions are not its tensors' rows (transformers refuses such a
# folder, "size mismatch"): refused naming config.json, the key, its value and the rows (before: exit 0,
# run silently with the tensors' sizes); config.json's own sizes written another way are taken
i=0
while IFS='|' read -r over key value rows; do
  i=$((i + 1)); mk sizes$i "$over"
  "$ZOFF" eval --load "$W/sizes$i" "${EVAL[@]}" >"$W/sizes$i.out" 2>"$W/sizes$i.err"
  check "config.json $over against the tensors' $rows rows: eval exits 2 naming $key $value, the folder inconsistent" \
    "[ \$? -eq 2 ] && [ ! -s '$W/sizes$i.out' ] && grep -qF 'sizes$i/config.json says $key $value but ' '$W/sizes$i.err' \
     && grep -qF 'model.safetensors has $rows (the rows of its' '$W/sizes$i.err' && grep -q 'the model folder is inconsistent' '$W/sizes$i.err'" \
    || cat "$W/sizes$i.err"
done <<'EOF2'
{"vocab_size": 50257}|vocab_size|50257|256
{"vocab_size": 255}|vocab_size|255|256
{"n_positions": 1024}|n_positions|1024|32
{"n_positions": "DELETE", "max_position_embeddings": 16}|max_position_embeddings|16|32
EOF2
"$ZOFF" sample --load "$W/sizes1" --tokenizer byte --max-new-tokens 4 >"$W/sz.out" 2>"$W/sz.err"
check "sample --load it: exit 2 all the same, nothing sampled" \
  "[ \$? -eq 2 ] && [ ! -s '$W/sz.out' ] && grep -q 'says vocab_size 50257 but' '$W/sz.err'" || cat "$W/sz.err"
"$ZOFF" train --tokenizer byte --data-path "$W/corpus_train.bin" --micro-batch-size 4 --seq-length 16 --quiet \
  --init-from "$W/sizes3" --train-iters 1 --eval-iters 0 --save "$W/ft6" >/dev/null 2>"$W/sz2.err"
check "train --init-from it: exit 2 naming n_positions, no checkpoint" \
  "[ \$? -eq 2 ] && grep -q 'says n_positions 1024 but' '$W/sz2.err' && [ ! -e '$W/ft6/latest' ]" || cat "$W/sz2.err"
mk sizes_ok '{"n_positions": "DELETE", "max_position_embeddings": 32, "n_ctx": 1024}'
"$ZOFF" eval --load "$W/sizes_ok" "${EVAL[@]}" >"$W/sizes_ok.json" 2>"$W/sizes_ok.err"
check "config.json max_position_embeddings 32 (n_positions' alias) matching wpe: exit 0, the plain folder's loss" \
  "[ \$? -eq 0 ] && [ \"\$(loss_of '$W/sizes_ok.json')\" = '$base' ]" || cat "$W/sizes_ok.err"

# 4. a file inconsistent in itself (a tensor of the wrong shape, one left out): the message says so,
#    not "train with --num-layers 2 ..." of the very sizes the model already has (before)
cat > "$W/edit.py" <<'PY'
import json, struct, sys
src, dst, how = sys.argv[1:4]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
meta = h.pop("__metadata__")
name = "transformer.h.1.mlp.c_fc.weight" if how == "shape" else "transformer.h.1.mlp.c_fc.bias"
out, data, pos = {"__metadata__": meta}, b"", 0
for k, v in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    if how == "drop" and k == name: continue
    blob = b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
    out[k] = dict(v, data_offsets=[pos, pos + len(blob)])
    if how == "shape" and k == name: out[k]["shape"] = v["shape"][::-1]
    data += blob; pos += len(blob)
j = json.dumps(out).encode()
open(dst, "wb").write(struct.pack("<Q", len(j)) + j + data)
PY
for how in shape drop; do
  mkdir -p "$W/bad_$how" && cp "$W/base/config.json" "$W/bad_$how/"
  "$PY" "$W/edit.py" "$W/base/model.safetensors" "$W/bad_$how/model.safetensors" $how
done
"$ZOFF" eval --load "$W/bad_shape" "${EVAL[@]}" >/dev/null 2>"$W/bs.err"
check "eval of a folder whose c_fc.weight is (4C, C): exit 2 naming it, the file inconsistent, no train flags" \
  "[ \$? -eq 2 ] && grep -q \"'transformer.h.1.mlp.c_fc.weight' has shape \\[128, 32\\]\" '$W/bs.err' \
   && grep -q 'the file itself is inconsistent' '$W/bs.err' && ! grep -q 'train with' '$W/bs.err'" || cat "$W/bs.err"
"$ZOFF" train --tokenizer byte --data-path "$W/corpus_train.bin" --micro-batch-size 4 --seq-length 16 --quiet \
  --init-from "$W/bad_shape" --train-iters 1 --eval-iters 0 --save "$W/ft2" >/dev/null 2>"$W/bt.err"
check "train --init-from it: exit 2, the same (not --num-layers 2 --hidden-size 32 ..., which it already has)" \
  "[ \$? -eq 2 ] && grep -q 'the file itself is inconsistent' '$W/bt.err' && ! grep -q 'train with' '$W/bt.err'" || cat "$W/bt.err"
"$ZOFF" sample --load "$W/bad_drop" --tokenizer byte --max-new-tokens 4 >/dev/null 2>"$W/bd.err"
check "sample of a folder without h.1.mlp.c_fc.bias: exit 2 naming it missing, the file inconsistent" \
  "[ \$? -eq 2 ] && grep -q \"'h.1.mlp.c_fc.bias' is missing\" '$W/bd.err' && grep -q 'the file itself is inconsistent' '$W/bd.err' \
   && ! grep -q 'train with' '$W/bd.err'" || cat "$W/bd.err"
"$ZOFF" train --tokenizer byte --data-path "$W/corpus_train.bin" --micro-batch-size 4 --seq-length 16 --quiet \
  --init-from "$W/base" --num-layers 3 --train-iters 1 --eval-iters 0 --save "$W/ft3" >/dev/null 2>"$W/b3.err"
check "train --init-from with --num-layers 3 against its 2 layers: exit 2, still naming --num-layers 2" \
  "[ \$? -eq 2 ] && grep -q 'train with --num-layers 2 --hidden-size 32' '$W/b3.err'" || cat "$W/b3.err"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
