#!/usr/bin/env bash
# CLI behaviour of zoff export and zoff train --init-from: files written, round trips, an
# independent PyTorch check of exported weights (when /usr/bin/python3 has torch), and refusal
# of bad input with nothing overwritten. Usage: cli_export.sh ZOFF SRCDIR
set -u
ZOFF="$1"; SRC="$2"
W=$(mktemp -d /tmp/zoff-cli-export-XXXXXX)
trap 'rm -rf "$W"' EXIT
pass=0; fail=0; skip=0
ok()   { echo "ok   - $1"; pass=$((pass + 1)); }
bad()  { echo "FAIL - $1"; fail=$((fail + 1)); }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
# md5 of a safetensors file's data (everything after the 8-byte length and the header)
data_md5() { local h; h=$(od -An -t u8 -N8 "$1" | tr -d ' '); tail -c +$((9 + h)) "$1" | md5sum | cut -d' ' -f1; }
PYCHECK="$SRC/tests/fixtures/check_export_safetensors.py"
HAVE_TORCH=0
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1; then HAVE_TORCH=1; fi

cat "$SRC"/src/*/*.c > "$W/corpus.txt"
"$ZOFF" tokenize --tokenizer byte --quiet --output-prefix "$W/corpus" "$W/corpus.txt" >/dev/null 2>&1
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4
      --tokenizer byte --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --eval-iters 2 --quiet)

# 1. a trained checkpoint exports in both formats and as a Hugging Face directory
"$ZOFF" train "${TINY[@]}" --train-iters 4 --save-interval 2 --save "$W/run" >/dev/null 2>&1
"$ZOFF" export --load "$W/run" --output "$W/m.safetensors" >"$W/out.txt" 2>&1
check "export exits 0 and says what it wrote" "[ \$? -eq 0 ] && grep -q 'exported step 4 (1 rank file)' '$W/out.txt'"
# one layer is "1 layer", as in train's and plan's banners (before: "GPT-2 1 layers")
"$ZOFF" train "${TINY[@]}" --num-layers 1 --train-iters 1 --save "$W/run1" >/dev/null 2>&1
"$ZOFF" export --load "$W/run1" --output "$W/one.safetensors" >"$W/one.txt" 2>&1
check "export of a 1-layer model says 'GPT-2 1 layer, width 32'" "grep -q ': GPT-2 1 layer, width 32, ' '$W/one.txt'"
check "the file starts with a JSON header holding format pt and HF names" \
  "head -c 400 '$W/m.safetensors' | grep -q '\"format\":\"pt\".*\"wte.weight\":{\"dtype\":\"F32\",\"shape\":\\[256,32\\]'"
check "no temp file left beside it" "! ls '$W' | grep -q 'tmp-'"
"$ZOFF" export --load "$W/run" --step 2 --output "$W/m2.safetensors" --quiet
check "--step 2 exports the older checkpoint" "grep -q '\"zoff.step\":\"2\"' '$W/m2.safetensors' && [ \"\$(data_md5 '$W/m.safetensors')\" != \"\$(data_md5 '$W/m2.safetensors')\" ]"
"$ZOFF" export --load "$W/run/step_00000004" --output "$W/hf/" --quiet
check "a directory output gets model.safetensors + config.json" \
  "cmp -s '$W/hf/model.safetensors' '$W/m.safetensors' && grep -q '\"n_layer\": 2' '$W/hf/config.json' && grep -q '\"model_type\": \"gpt2\"' '$W/hf/config.json'"
# exporting into that folder again replaces its files (before: refused, "hf/model.safetensors is a file")
"$ZOFF" export --load "$W/run" --step 2 --output "$W/hf/" --quiet >"$W/re.txt" 2>&1
rc1=$?
"$ZOFF" export --load "$W/run" --step 2 --output "$W/hf" --quiet >>"$W/re.txt" 2>&1
rc2=$?
check "exporting into an existing model folder again (DIR/ and DIR) replaces model.safetensors" \
  "[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && cmp -s '$W/hf/model.safetensors' '$W/m2.safetensors' && ! ls '$W/hf' | grep -q 'tmp-'"
mkdir -p "$W/hfd/config.json"
"$ZOFF" export --load "$W/run" --output "$W/hfd" >"$W/re.txt" 2>&1
check "a model folder whose config.json is a folder: exit 2 naming it, nothing written" \
  "[ \$? -eq 2 ] && grep -q 'hfd/config.json is a folder' '$W/re.txt' && [ ! -e '$W/hfd/model.safetensors' ]"
"$ZOFF" export --load "$W/run" --dtype bf16 --output "$W/bf16.safetensors" --quiet
check "--dtype bf16 writes BF16 tensors of half the size" \
  "grep -q '\"dtype\":\"BF16\"' '$W/bf16.safetensors' && [ \$(stat -c %s '$W/bf16.safetensors') -lt \$(( \$(stat -c %s '$W/m.safetensors') * 6 / 10 )) ]"
"$ZOFF" export --load "$W/run" --format fp32 --output "$W/z.safetensors" --quiet
check "--format fp32 writes zoff's layout" "grep -q '\"zoff.layout\":\"zoff\"' '$W/z.safetensors'"

# 1c. a sharded model (Hugging Face's model.safetensors.index.json beside its shards, as
#     save_pretrained writes a large model): the same weights as the one file, bit for bit,
#     through train --init-from (no shape flags: the tensors and config.json give it) and export;
#     zoff sample of the folder gives the checkpoint's greedy text
PYBIN=$([ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3)
mkdir -p "$W/sharded"
cp "$W/hf/config.json" "$W/sharded/"
"$PYBIN" - "$W/m.safetensors" "$W/sharded" <<'PYSPLIT'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h.pop("__metadata__", None)
names = sorted(h)
halves = [names[: len(names) // 2], names[len(names) // 2:]]
wmap = {}
for k, part in enumerate(halves):
    fname = "model-%05d-of-00002.safetensors" % (k + 1)
    hdr, data, pos = {"__metadata__": {"format": "pt"}}, b"", 0
    for t in part:
        s, e = h[t]["data_offsets"]
        blob = b[8 + n + s:8 + n + e]
        hdr[t] = {"dtype": h[t]["dtype"], "shape": h[t]["shape"], "data_offsets": [pos, pos + len(blob)]}
        data += blob
        pos += len(blob)
        wmap[t] = fname
    j = json.dumps(hdr).encode()
    j += b" " * (-len(j) % 8)
    open(sys.argv[2] + "/" + fname, "wb").write(struct.pack("<Q", len(j)) + j + data)
json.dump({"metadata": {"total_size": len(b) - 8 - n}, "weight_map": wmap}, open(sys.argv[2] + "/model.safetensors.index.json", "w"))
PYSPLIT
"$ZOFF" train --tokenizer byte --data-path "$W/corpus_train.bin" --val-path "$W/corpus_val.bin" --micro-batch-size 4 \
  --quiet --init-from "$W/sharded" --train-iters 0 --eval-iters 0 --save "$W/shrt" >"$W/shrt.txt" 2>&1
rc=$?
"$ZOFF" export --load "$W/shrt" --output "$W/shrt.safetensors" --quiet >/dev/null 2>&1
check "train --init-from a sharded folder (2 shards + index): exit 0, export gives the one file's weights bit for bit" \
  "[ $rc -eq 0 ] && [ \"\$(data_md5 '$W/m.safetensors')\" = \"\$(data_md5 '$W/shrt.safetensors')\" ]" || cat "$W/shrt.txt"
"$ZOFF" sample --load "$W/run" --temperature 0 --max-new-tokens 24 --prompt "int " >"$W/s_ck.txt" 2>/dev/null
"$ZOFF" sample --load "$W/sharded" --tokenizer byte --temperature 0 --max-new-tokens 24 --prompt "int " >"$W/s_sh.txt" 2>"$W/s_sh.err"
check "sample --load the sharded folder: the checkpoint's greedy text" \
  "[ -s '$W/s_ck.txt' ] && cmp -s '$W/s_ck.txt' '$W/s_sh.txt'" || cat "$W/s_sh.err"

# 2. round trips through train --init-from: export -> import -> export gives the same bytes
for fmt in safetensors fp32; do
  src="$W/m.safetensors"; [ $fmt = fp32 ] && src="$W/z.safetensors"
  rm -rf "$W/rt"
  "$ZOFF" train "${TINY[@]}" --init-from "$src" --train-iters 0 --eval-iters 0 --save "$W/rt" >"$W/err.txt" 2>&1
  check "train --init-from ($fmt) with 0 steps exits 0" "[ \$? -eq 0 ] && [ -f '$W/rt/step_00000000/COMPLETE' ]"
  "$ZOFF" export --load "$W/rt" --format $fmt --output "$W/rt.safetensors" --quiet
  check "export -> --init-from -> export ($fmt): identical weights" "[ \"\$(data_md5 '$src')\" = \"\$(data_md5 '$W/rt.safetensors')\" ]"
done
"$ZOFF" train "${TINY[@]}" --init-from "$W/m.safetensors" --train-iters 2 --save "$W/ft" >/dev/null 2>&1
check "fine-tuning from an export runs and saves" "[ -f '$W/ft/step_00000002/COMPLETE' ]"

# 2b. --init-from streams the file's weights into the engine piece by piece: its peak resident
#     set is that of a random start of the same model (main before this: +25 MB here, half of the
#     4 B/param whole-model buffer, which the peak at save partly hides),
#     and the weights are still the file's (export -> import -> export, HF layout: transposes)
if [ -x /usr/bin/python3 ]; then
  MID=(--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 16 --micro-batch-size 1
       --tokenizer byte --data-path "$W/corpus_train.bin" --eval-iters 0 --quiet --train-iters 0)
  peak_kb() { /usr/bin/python3 -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r == 0 else -1)' "$@"; }
  "$ZOFF" train "${MID[@]}" --save "$W/mid" >/dev/null 2>&1
  "$ZOFF" export --load "$W/mid" --output "$W/mid.safetensors" --quiet
  rand_kb=$(peak_kb "$ZOFF" train "${MID[@]}" --seed 7 --save "$W/mid_r")
  init_kb=$(peak_kb "$ZOFF" train "${MID[@]}" --init-from "$W/mid.safetensors" --save "$W/mid_i")
  n4_kb=$(( $(stat -c %s "$W/mid.safetensors") / 1024 )) # 4 B/param: one whole-model fp32 buffer
  check "--init-from peak RSS ($init_kb kB) within a quarter of a whole-model buffer ($n4_kb kB) of a random start ($rand_kb kB)" \
    "[ $rand_kb -gt 0 ] && [ $init_kb -gt 0 ] && [ $init_kb -lt \$(( $rand_kb + $n4_kb / 4 )) ]"
  "$ZOFF" export --load "$W/mid_i" --output "$W/mid_rt.safetensors" --quiet
  check "--init-from (streamed) -> export: the file's weights bit for bit" \
    "[ \"\$(data_md5 '$W/mid.safetensors')\" = \"\$(data_md5 '$W/mid_rt.safetensors')\" ]"
else
  echo "skip - the --init-from peak RSS check (no /usr/bin/python3)"; skip=$((skip + 2))
fi

# 1b. a gpt2-tokenizer model's folder also gets the tokenizer's files, as transformers'
#     GPT2Tokenizer reads them: the reference GPT-2 encoder on the folder's vocab.json and
#     merges.txt gives zoff tokenize's ids for the same text
"$ZOFF" tokenize --tokenizer gpt2 --quiet --output-prefix "$W/g2c" "$SRC/README.md" >/dev/null 2>&1
"$ZOFF" train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4 \
  --data-path "$W/g2c_train.bin" --val-path "$W/g2c_val.bin" --train-iters 0 --eval-iters 0 --quiet \
  --save "$W/g2run" >/dev/null 2>&1
"$ZOFF" export --load "$W/g2run" --output "$W/g2hf/" >"$W/g2.out" 2>&1
check "export of a gpt2-tokenizer model: vocab.json, merges.txt, tokenizer_config.json beside config.json" \
  "grep -q 'config.json and the tokenizer' '$W/g2.out' && [ -s '$W/g2hf/vocab.json' ] && head -1 '$W/g2hf/merges.txt' | grep -q '^#version' \
   && grep -q '\"tokenizer_class\": \"GPT2Tokenizer\"' '$W/g2hf/tokenizer_config.json' \
   && grep -q '\"model_max_length\": 16' '$W/g2hf/tokenizer_config.json'"
check "a byte-tokenizer model's folder gets no GPT-2 tokenizer files" "[ ! -e '$W/hf/vocab.json' ]"
# a byte model exported over the gpt2 model's folder: its files replaced, the tokenizer files left
# behind said (they would make AutoTokenizer load GPT-2's for a byte model), not removed
"$ZOFF" export --load "$W/run" --output "$W/g2hf" >"$W/g2re.out" 2>&1
check "a byte model over a gpt2 model's folder: exit 0, warns of the GPT-2 tokenizer files left, keeps them" \
  "[ \$? -eq 0 ] && grep -q 'holds GPT-2 tokenizer files (vocab.json, ...) from an earlier export; this model.s tokenizer is byte' '$W/g2re.out' \
   && [ -s '$W/g2hf/vocab.json' ] && grep -q '\"zoff_tokenizer\": \"byte\"' '$W/g2hf/config.json'"
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import regex' >/dev/null 2>&1; then
  printf "Hello world, it's 2026!\n\tcaf\xc3\xa9   spaces\n" > "$W/g2.txt"
  head -c 20000 "$SRC/README.md" >> "$W/g2.txt"
  "$ZOFF" tokenize --val-fraction 0 --quiet --output-prefix "$W/g2tok" "$W/g2.txt" >/dev/null 2>&1
  /usr/bin/python3 "$SRC/tests/fixtures/gen_bpe_fixture.py" encode "$W/g2.txt" --hf-dir "$W/g2hf" --out "$W/g2ref.txt" 2>/dev/null
  # the shard: 1024-byte header, then uint16 ids; the document starts with <|endoftext|> (50256)
  tail -c +1025 "$W/g2tok_train.bin" | od -An -v -t u2 | tr -s ' ' '\n' | grep -v '^$' | tail -n +2 > "$W/g2zoff.txt"
  check "the reference encoder on the exported vocab.json + merges.txt: zoff tokenize's $(wc -l < "$W/g2zoff.txt") ids" \
    "[ -s '$W/g2ref.txt' ] && cmp -s '$W/g2ref.txt' '$W/g2zoff.txt'"
else
  echo "skip - the exported tokenizer's reference encoding (no /usr/bin/python3 with regex)"; skip=$((skip + 1))
fi

# 3. independent check: a random GPT-2 (Hugging Face layout, written by Python) -> zoff train
#    --init-from -> 2 steps -> zoff sample (greedy) and zoff export; the independent PyTorch model
#    on the exported weights must pick zoff's greedy tokens, and the untrained import must too.
if [ $HAVE_TORCH = 1 ]; then
  /usr/bin/python3 "$PYCHECK" random "$W/rand.safetensors" --layers 2 --hidden 32 --heads 2 --positions 16 --vocab 256 >/dev/null
  for steps in 0 2; do
    rm -rf "$W/r$steps"
    "$ZOFF" train "${TINY[@]}" --init-from "$W/rand.safetensors" --train-iters $steps --eval-iters 0 --save "$W/r$steps" >/dev/null 2>&1
    "$ZOFF" export --load "$W/r$steps" --output "$W/r$steps.safetensors" --quiet
    "$ZOFF" sample --load "$W/r$steps" --temperature 0 --max-new-tokens 48 --prompt "static int " >"$W/s$steps.txt" 2>/dev/null
    /usr/bin/python3 "$PYCHECK" greedy "$W/r$steps.safetensors" "$W/s$steps.txt" --seq-len 16 --prompt-len 11 >"$W/py.txt" 2>&1
    check "PyTorch on zoff's export ($steps steps after import) picks zoff's 48 greedy tokens" "[ \$? -eq 0 ]" || cat "$W/py.txt"
  done
  check "an untrained import exports the Python-written weights bit for bit" \
    "[ \"\$(data_md5 '$W/rand.safetensors')\" = \"\$(data_md5 '$W/r0.safetensors')\" ]"
  # zoff sample straight from the Python-written file (no zoff.tokenizer: --tokenizer byte)
  "$ZOFF" sample --load "$W/rand.safetensors" --tokenizer byte --temperature 0 --max-new-tokens 48 \
    --prompt "static int " >"$W/sf.txt" 2>"$W/sf.err"
  /usr/bin/python3 "$PYCHECK" greedy "$W/rand.safetensors" "$W/sf.txt" --seq-len 16 --prompt-len 11 >"$W/py.txt" 2>&1
  check "zoff sample --load FILE.safetensors: PyTorch on that file picks zoff's 48 greedy tokens" "[ \$? -eq 0 ]" ||
    cat "$W/py.txt" "$W/sf.err"
else
  echo "skip - the PyTorch checks (no /usr/bin/python3 with torch; scripts/deps.sh installs python3-torch)"
  skip=$((skip + 4))
fi

# 4. bad input to --init-from: exit 2, a clear message, nothing written
"$ZOFF" train "${TINY[@]}" --hidden-size 64 --init-from "$W/m.safetensors" --save "$W/nope1" >"$W/err.txt" 2>&1
check "shape mismatch: exit 2 naming the tensor, both shapes and the flags" \
  "[ \$? -eq 2 ] && grep -q \"'wte.weight' has shape \\[256, 32\\], but the model needs \\[256, 64\\]\" '$W/err.txt' && grep -q -- '--hidden-size 32' '$W/err.txt'"
head -c 5000 "$W/m.safetensors" > "$W/trunc.safetensors"
"$ZOFF" train "${TINY[@]}" --init-from "$W/trunc.safetensors" --save "$W/nope2" >"$W/err.txt" 2>&1
check "truncated file: exit 2 naming the file" "[ \$? -eq 2 ] && grep -q 'trunc.safetensors.*truncated' '$W/err.txt'"
cp "$W/m.safetensors" "$W/corrupt.safetensors"
printf '}}}}' | dd of="$W/corrupt.safetensors" bs=1 seek=20 conv=notrunc 2>/dev/null
"$ZOFF" train "${TINY[@]}" --init-from "$W/corrupt.safetensors" --save "$W/nope3" >"$W/err.txt" 2>&1
check "corrupt header: exit 2, 'not valid JSON'" "[ \$? -eq 2 ] && grep -q 'not valid JSON' '$W/err.txt'"
printf 'hello world, not a safetensors file' > "$W/text.safetensors"
"$ZOFF" train "${TINY[@]}" --init-from "$W/text.safetensors" --save "$W/nope4" >"$W/err.txt" 2>&1
check "not a safetensors file: exit 2" "[ \$? -eq 2 ] && grep -q 'text.safetensors' '$W/err.txt'"
"$ZOFF" train "${TINY[@]}" --init-from "$W/missing.safetensors" --save "$W/nope5" >"$W/err.txt" 2>&1
check "missing file: non-zero exit naming it" "[ \$? -ne 0 ] && grep -q 'missing.safetensors' '$W/err.txt'"
"$ZOFF" train "${TINY[@]}" --init-from "$W/m.safetensors" --load "$W/run" --save "$W/nope6" >"$W/err.txt" 2>&1
check "--init-from with --load: exit 2" "[ \$? -eq 2 ] && grep -q 'exclude each other' '$W/err.txt'"
check "nothing written for bad --init-from input" "! ls -d '$W'/nope* >/dev/null 2>&1"

# 5. bad checkpoints and failing writes: refused, the previous output untouched, no temp files
before=$(md5sum "$W/m.safetensors" | cut -d' ' -f1)
cp -r "$W/run" "$W/corrupt"
printf '\xff\xff\xff\xff' | dd of="$W/corrupt/step_00000004/rank_00000.zckpt" bs=1 seek=5000 conv=notrunc 2>/dev/null
"$ZOFF" export --load "$W/corrupt" --output "$W/m.safetensors" >"$W/err.txt" 2>&1
check "corrupt checkpoint: exit non-zero with a checksum message" "[ \$? -ne 0 ] && grep -qi 'checksum\\|crc' '$W/err.txt'"
cp -r "$W/run" "$W/version"
printf '\x02' | dd of="$W/version/step_00000004/rank_00000.zckpt" bs=1 seek=8 conv=notrunc 2>/dev/null
"$ZOFF" export --load "$W/version" --output "$W/m.safetensors" >"$W/err.txt" 2>&1
check "wrong container version: exit 2 naming the version" "[ \$? -eq 2 ] && grep -qi 'version' '$W/err.txt'"
cp -r "$W/run" "$W/short"
f="$W/short/step_00000004/rank_00000.zckpt"; truncate -s $(( $(stat -c %s "$f") - 100 )) "$f"
"$ZOFF" export --load "$W/short" --output "$W/m.safetensors" >"$W/err.txt" 2>&1
check "truncated checkpoint: exit 2" "[ \$? -eq 2 ] && grep -qi 'truncated' '$W/err.txt'"
ZOFF_CKPT_FAULT=ENOSPC@70000 "$ZOFF" export --load "$W/run" --output "$W/m.safetensors" >"$W/err.txt" 2>&1
check "disk full during export: exit 1 saying so" "[ \$? -eq 1 ] && grep -q 'No space left' '$W/err.txt'"
"$ZOFF" export --load "$W/nothing-here" --output "$W/m.safetensors" >"$W/err.txt" 2>&1
check "missing checkpoint: non-zero exit naming it" "[ \$? -ne 0 ] && grep -q 'nothing-here' '$W/err.txt'"
"$ZOFF" export --load "$W/run" --step 3 --output "$W/m.safetensors" >"$W/err.txt" 2>&1
check "--step of a step that was not saved: non-zero exit" "[ \$? -ne 0 ] && grep -q 'step_00000003' '$W/err.txt'"
check "the earlier export is untouched and no temp file is left" \
  "[ \"\$(md5sum '$W/m.safetensors' | cut -d' ' -f1)\" = '$before' ] && ! ls '$W' | grep -q 'tmp-'"

# 6. a data-parallel checkpoint (mpirun -np 2, ZeRO stage 2: optimizer state partitioned over
#    two rank files): export consolidates it (when zoff and mpirun have MPI)
if command -v mpirun >/dev/null 2>&1 && "$ZOFF" version | grep -q '^mpi: built'; then
  echo '{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
         "zero_optimization": {"stage": 2, "round_robin_gradients": true}}' > "$W/dp.json"
  timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader \
    --mca btl_vader_single_copy_mechanism none -x ZOFF_THREADS=1 -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=passive \
    -x ZOFF_COMM_TIMEOUT=120 -np 2 "$ZOFF" train "${TINY[@]}" --config "$W/dp.json" --train-iters 2 --save "$W/dp" \
    >"$W/dp.txt" 2>&1
  if [ -f "$W/dp/step_00000002/rank_00001.zckpt" ]; then
    "$ZOFF" export --load "$W/dp" --format fp32 --output "$W/dp.safetensors" >"$W/out.txt" 2>&1
    check "export of a 2-rank stage-2 checkpoint" "[ \$? -eq 0 ] && grep -q '(2 rank files)' '$W/out.txt'"
    rm -rf "$W/dprt"
    "$ZOFF" train "${TINY[@]}" --init-from "$W/dp.safetensors" --train-iters 0 --eval-iters 0 --save "$W/dprt" >/dev/null 2>&1
    "$ZOFF" export --load "$W/dprt" --format fp32 --output "$W/dprt.safetensors" --quiet
    check "its weights round-trip through --init-from" "[ \"\$(data_md5 '$W/dp.safetensors')\" = \"\$(data_md5 '$W/dprt.safetensors')\" ]"
  else
    bad "mpirun -np 2 zoff train wrote no 2-rank checkpoint"; tail -5 "$W/dp.txt"
  fi
else
  echo "skip - the data-parallel export (no MPI in zoff or no mpirun)"; skip=$((skip + 2))
fi

# 7. usage errors
"$ZOFF" export --load "$W/run" >"$W/err.txt" 2>&1
check "missing --output: exit 2" "[ \$? -eq 2 ] && grep -q -- '--output' '$W/err.txt'"
"$ZOFF" export --load "$W/run" --output "$W/x" --format onnx >"$W/err.txt" 2>&1
check "unknown --format: exit 2 naming it" "[ \$? -eq 2 ] && grep -q 'onnx' '$W/err.txt'"
"$ZOFF" export --load "$W/run" --output "$W/x" --format fp32 --dtype bf16 >"$W/err.txt" 2>&1
check "--format fp32 --dtype bf16: exit 2" "[ \$? -eq 2 ]"
"$ZOFF" export --load "$W/run" --output '' >"$W/err.txt" 2>&1
check "--output '': exit 2, says it is empty (before: 'zoff export: : safetensors output path is empty')" \
  "[ \$? -eq 2 ] && grep -q -- '^zoff export: --output is empty: give a file' '$W/err.txt' && ! grep -q 'export: :' '$W/err.txt'"
"$ZOFF" export --bogus >"$W/err.txt" 2>&1
check "unknown option: exit 2 naming it" "[ \$? -eq 2 ] && grep -q 'bogus' '$W/err.txt'"
check "nothing written by the failed exports" "[ ! -e '$W/x' ]"

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
