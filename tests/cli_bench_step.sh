#!/usr/bin/env bash
# `zoff bench step --json` on the CPU backend, a small shape: one valid JSON object
# with the four configurations, each with its components and host_hidden (null for
# the device optimizer, a fraction in [0, 1] with offload), and the same losses
# are not its business (tests/test_engine.c). Timings are not checked (a benchmark,
# not a timed test), but the op profile's invariants are: its FLOPs against the
# formulas written out here, its class times against the step, shares summing to 1,
# MFU from its parts. Usage: cli_bench_step.sh ZOFF SRCDIR
set -u
ZOFF="$1"
out=$("$ZOFF" bench step --device cpu --num-layers 2 --hidden-size 64 --vocab-size 512 --seq-length 32 \
      --micro-batch-size 2 --iters 3 --rounds 1 --peak-gemm 256 --json 2>/dev/null)
rc=$?
if [ $rc -ne 0 ]; then echo "FAIL - exit $rc: $out"; exit 1; fi
if /usr/bin/python3 - "$out" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
c = d["configs"]
assert list(c) == ["device-optimizer", "offload", "offload+delayed", "offload+speculative"], list(c)
assert c["device-optimizer"]["host_hidden"] is None, c["device-optimizer"]
for k in ("offload", "offload+delayed", "offload+speculative"):
    h = c[k]["host_hidden"]
    assert isinstance(h, float) and 0.0 <= h <= 1.0, (k, h)
    assert c[k]["host_work"] > 0 and c[k]["step"] > 0 and c[k]["forward"] > 0 and c[k]["backward"] > 0, c[k]
PY
then echo "ok   - JSON with host_hidden per config"; else echo "FAIL - JSON check: $out"; exit 1; fi
if /usr/bin/python3 - "$out" <<'PY'
import json, math, sys
d = json.loads(sys.argv[1])
p = d["profile"]
L, C, V, T, B = 2, 64, 512, 32, 2          # the shape run above
Vp = (V + 127) // 128 * 128
N = B * T
mm = lambda n, k, m: 2 * n * k * m           # one multiply-add = 2 FLOPs
fwd = L * (mm(N, C, 3 * C) + mm(N, C, C) + mm(N, C, 4 * C) + mm(N, 4 * C, C)) + mm(N, C, Vp)
gemm = 3 * fwd                               # backward: dinp and dweight
HS, NH = C // 4, 4
att_f = L * 4 * B * NH * T * T * HS / 2      # causal: half of QK^T and PV
att_b = 2.5 * att_f                          # five products against two
cl = p["classes"]
names = ["other", "attention_fwd", "attention_bwd", "gemm", "layernorm", "elementwise", "cross_entropy",
         "optimizer", "memset", "copy_h2d", "copy_d2h", "copy_d2d"]
assert sorted(cl) == sorted(names), sorted(cl)
assert p["steps"] == 3 and p["dropped"] == 0, p
assert cl["gemm"]["flops"] == gemm, (cl["gemm"]["flops"], gemm)
assert cl["attention_fwd"]["flops"] == att_f and cl["attention_bwd"]["flops"] == att_b, cl
assert d["model_flops_per_step"] == gemm + att_f + att_b, d["model_flops_per_step"]
assert cl["gemm"]["count"] == 2 * (4 * L + 1) and cl["attention_fwd"]["count"] == L, cl
assert cl["cross_entropy"]["count"] == 1 and cl["layernorm"]["count"] == 2 * (2 * L + 1), cl  # one cross-entropy pass per step (losses and dlogits in the training forward)
total = sum(c["ms"] for c in cl.values())
assert abs(total - p["total_ms"]) <= 1e-3 + 1e-4 * total, (total, p["total_ms"])
assert abs(sum(c["share"] for c in cl.values()) - 1) < 1e-3, cl
assert all(c["ms"] >= 0 for c in cl.values()) and cl["gemm"]["ms"] > 0, cl
# one stream: the operations do not overlap, their union is their sum, inside the step
assert p["busy_ms"] <= p["span_ms"] + 1e-3 and abs(p["busy_ms"] - total) <= 1e-3 + 1e-4 * total, p
assert p["span_ms"] <= p["step_ms"] + 1e-3, p
for k in ("gemm", "attention_fwd", "attention_bwd"):
    assert abs(cl[k]["tflops"] - cl[k]["flops"] / cl[k]["ms"] * 1e-9) <= 1e-5 + 1e-3 * cl[k]["tflops"], cl[k]
assert cl["layernorm"]["tflops"] is None
pk = d["peak_gemm"]
assert pk["n"] == 256 and pk["dtype"] == "bf16" and pk["tflops"] > 0, pk
step = d["configs"]["device-optimizer"]["step"]
mfu = d["model_flops_per_step"] / step * 1e-12 / pk["tflops"]
assert abs(d["mfu"] - mfu) <= 1e-5 + 1e-2 * mfu, (d["mfu"], mfu)
PY
then echo "ok   - op profile: FLOPs, class times, shares, MFU"; else echo "FAIL - op profile check: $out"; exit 1; fi
out=$("$ZOFF" bench step --device cpu --num-layers 1 --hidden-size 32 --vocab-size 256 --seq-length 16 \
      --micro-batch-size 1 --iters 1 --rounds 1 --configs offload --json 2>/dev/null)
if [ $? -eq 0 ] && /usr/bin/python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert list(d["configs"]) == ["offload"] and "profile" not in d' "$out"
then echo "ok   - --configs offload: that configuration only, no profile"; else echo "FAIL - --configs: $out"; exit 1; fi
# --dtype: the one parser of every command (zoff export's too): f16 and DeepSpeed's fp16 are the same
# dtype, written "fp16" in the JSON that zoff plan --bench reads (before: f16 refused here, exit 2)
out=$("$ZOFF" bench step --device cpu --num-layers 1 --hidden-size 32 --vocab-size 256 --seq-length 16 \
      --micro-batch-size 1 --iters 1 --rounds 1 --configs device-optimizer --profile-iters 0 \
      --dtype f16 --json 2>&1)
if [ $? -eq 0 ] && /usr/bin/python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["dtype"] == "fp16", d' "$out"
then echo "ok   - --dtype f16 (as export takes it): fp16 weights"; else echo "FAIL - --dtype f16: $out"; exit 1; fi
out=$("$ZOFF" bench step --device cpu --dtype float16 2>&1)
if [ $? -eq 2 ] && [ "$out" = "zoff bench step: --dtype: 'float16' is not one of f32, bf16, f16 (fp32 and fp16 also read)" ]
then echo "ok   - --dtype float16: exit 2, the spellings named"; else echo "FAIL - --dtype float16: $out"; exit 1; fi
# the text table: no host optimizer reads n/a in the host-hidden column, with a footnote, a
# measured one a fraction (before: "nan", a value a reader takes for a failed measurement)
out=$("$ZOFF" bench step --device cpu --num-layers 1 --hidden-size 32 --vocab-size 256 --seq-length 16 \
      --micro-batch-size 1 --iters 1 --rounds 1 --configs device-optimizer,offload --profile-iters 0 2>/dev/null)
if [ $? -eq 0 ] && ! printf '%s' "$out" | grep -qiw 'nan' \
   && printf '%s\n' "$out" | grep -Eq '^device-optimizer .* n/a$' \
   && printf '%s\n' "$out" | grep -Eq '^offload .* (0|1)\.[0-9]{3}$' \
   && printf '%s\n' "$out" | grep -q '^n/a: no host optimizer'
then echo "ok   - table: host-hidden n/a without a host optimizer, explained"; else echo "FAIL - table host-hidden: $out"; exit 1; fi
"$ZOFF" bench step --device cpu --configs offload,nonsense >/dev/null 2>&1
[ $? -eq 2 ] && echo "ok   - unknown --configs name exits 2" || { echo "FAIL - --configs nonsense should exit 2"; exit 1; }
"$ZOFF" bench step --device cpu --iters 0 >/dev/null 2>&1
[ $? -eq 2 ] && echo "ok   - bad usage exits 2" || { echo "FAIL - --iters 0 should exit 2"; exit 1; }
# a shape the model refuses: exit 2 before any measuring, in the model's words without its
# function's name (before: exit 1, "device-optimizer: model: zoff_gpt2_create: shape...")
out=$("$ZOFF" bench step --device cpu --num-layers 1 --hidden-size 32 --num-attention-heads 3 --rounds 1 --json 2>&1)
rc=$?
if [ $rc -eq 2 ] && [ "$out" = "$(printf '%s' "$out" | grep -v zoff_gpt2)" ] \
   && printf '%s' "$out" | grep -q '^zoff bench step: model shape: .*not divisible by shape.num_heads (3)'
then echo "ok   - a width the heads do not divide: exit 2, said cleanly"; else echo "FAIL - heads 3 of 32: rc $rc: $out"; exit 1; fi
