#!/usr/bin/env bash
# The GPU checks of one short lease (minutes of device time), in order of worth, against a deadline.
#
# Here (no GPU needed; nvcc, the CUDA toolkit and apt-get):
#   bash scripts/gpu_lease.sh --prebuild     # -> .gpu-carry/{bins.tar.xz,debs/}: sm_90 build of zoff,
#                                            #    test_ops, test_device, emu_check (real CUDA), staging_cost
#   GPU_BASE_BIN=old/zoff bash scripts/gpu_lease.sh --prebuild   # also carries a baseline zoff: the
#                                            #    offloaded 1.5B step and the save overlap then run both
# There (the device tool; carry .gpu-carry):
#   GPU_DEADLINE_S=540 [GPU_PARTS="correct large peer smoke ckpt accum"] [GPU_OVERLAP="ARGS"] [GPU_AB_ROUNDS=N] [GPU_BENCH_CKPT=0] [GPU_STAGING=0] bash scripts/gpu_lease.sh
#   (GPU_OVERLAP: the save-overlap runs' arguments, e.g. "--rounds 2 new=@B@/zoff new19=@B@/zoff:19")
#
# Every step is cut at the deadline (GPU_DEADLINE_S seconds after the start, default 540), and a
# step that would start with under 20 s left is skipped with a note, so the report always comes
# back. Order: can the binaries run at all (else stop at once: nothing costs less device time);
# test_ops (the CUDA backend against the CPU and double references; the start-up comparisons of
# the tensor-core attention and the fused LayerNorm must not have fallen back); `zoff bench ckpt`,
# the staging update's cost (bench/snapshot_staging_cost.c) and bench/ckpt_overlap.sh (the 16-core
# box's save figures; GPU_OVERLAP: other runs); 1.5B with the
# optimizer offloaded (`zoff bench step`: offload, delayed, speculative) and `zoff train` 1.5B
# offload (start-up to step 1); the 13B plan and 4 training steps of it; GPT-2 124M micro 16 and
# 1.5B micro 4 with the optimizer on the device against plain PyTorch on the same shapes
# (bench/torch_gpt2_step.py), interleaved; 40 training steps on CUDA and on the CPU (losses side
# by side); emu_check and test_device; test_ops with each attention kernel forced; 1.5B with
# gradient accumulation (the device's sum and the host's).
#
# Output in $OUT (or ./gpu-report): report.md (a table of steps, then each log's tail) and
# logs.tar.gz. No training run here writes a checkpoint it does not need: the 13B one (~100 GB) would
# not fit the disk.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=$ROOT/.gpu-carry
# shellcheck source=scripts/gpu_lib.sh
. "$ROOT/scripts/gpu_lib.sh"

if [ "${1:-}" = --prebuild ]; then
  set -e
  cd "$ROOT"
  [ -d .deps/debs ] || bash scripts/pack_deps.sh
  eval "$(bash scripts/unpack_deps.sh 2>/dev/null)"
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DZOFF_CUDA=ON -DZOFF_MPI=OFF \
    "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90-real}" >/dev/null
  cmake --build build-gpu -j "$(nproc)" --target zoff test_ops test_device >/dev/null
  # shellcheck disable=SC2046
  g++ -std=c++17 -O2 -Iinclude -Isrc tests/cuda_emu/emu_check.cpp -o build-gpu/emu_check_real build-gpu/libzoff.a \
    $(pkg-config --libs jansson openblas liburing) -L/usr/local/cuda/lib64 -lcudart -ldl \
    -fopenmp -lpthread -lm -Wl,-rpath,/usr/local/cuda/lib64
  # shellcheck disable=SC2046
  cc -O2 -Iinclude bench/snapshot_staging_cost.c -o build-gpu/staging_cost build-gpu/libzoff.a \
    $(pkg-config --libs jansson openblas liburing) -L/usr/local/cuda/lib64 -lcudart -ldl \
    -fopenmp -lpthread -lm -Wl,-rpath,/usr/local/cuda/lib64
  rm -rf "$CARRY" && mkdir -p "$CARRY"
  extra=()
  if [ -n "${GPU_BASE_BIN:-}" ]; then # a baseline zoff (an earlier build) for the side-by-side runs
    cp "$GPU_BASE_BIN" build-gpu/zoff-base
    extra=(zoff-base)
  fi
  tar -C build-gpu -cJf "$CARRY/bins.tar.xz" zoff test_ops test_device emu_check_real staging_cost "${extra[@]}"
  cp -r .deps/debs "$CARRY/debs"
  git rev-parse --short HEAD > "$CARRY/commit"
  du -sh "$CARRY"
  exit 0
fi

T0=$SECONDS
DEADLINE=${GPU_DEADLINE_S:-540}
REPORT=${OUT:-$ROOT/gpu-report}
B=/tmp/zoff-lease/bin
LOGS=/tmp/zoff-lease/logs
W=/tmp/zoff-lease/work
rm -rf /tmp/zoff-lease && mkdir -p "$B" "$LOGS" "$W" "$REPORT"

left() { echo $((DEADLINE - (SECONDS - T0))); }
# part NAME: is this group of steps wanted (GPU_PARTS, default all: correct large peer smoke ckpt accum)
part() { case " ${GPU_PARTS:-correct large peer smoke ckpt accum} " in *" $1 "*) return 0 ;; esac; return 1; }
# step NAME LIMIT_S COMMAND...: run under min(LIMIT, time left - 5), log, record the verdict
step() {
  local name=$1 limit=$2; shift 2
  local l; l=$(($(left) - 5))
  if [ "$l" -lt 20 ]; then
    printf '%s|skipped (deadline)|0|%s\n' "$name" "$*" > "$LOGS/$name.status"; echo "== $name: skipped (deadline)"
    return 1
  fi
  [ "$l" -lt "$limit" ] && limit=$l
  echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS rc
  { echo "\$ $*"; timeout --kill-after=5 "$limit" "$@"; } > "$LOGS/$name.log" 2>&1
  rc=$?
  local v=ok; [ $rc -ne 0 ] && v="FAILED (exit $rc)"; [ $rc -eq 124 ] && v="TIMEOUT (${limit}s)"
  printf '%s|%s|%s|%s\n' "$name" "$v" $((SECONDS - t0)) "$*" > "$LOGS/$name.status"
  echo "   $v in $((SECONDS - t0))s"; tail -3 "$LOGS/$name.log" | cut -c1-300 | sed 's/^/   | /'
  return $rc
}

report() {
  {
    echo "# zoff GPU lease"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), build of commit $(cat "$CARRY/commit" 2>/dev/null || echo '?'), $(($(date +%s) - START_EPOCH)) s"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
    echo "CPU: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo
    gpu_status_table "$LOGS" 140
    for f in $(ls -tr "$LOGS"/*.log 2>/dev/null); do
      echo; echo "## $(basename "$f" .log)"; echo '```'
      [ "$(wc -l < "$f")" -gt 60 ] && echo "[... $(wc -l < "$f") lines; the last 60:]"
      tail -60 "$f" | cut -c1-400; echo '```'
    done
  } > "$REPORT/report.md"
  tar -czf "$REPORT/logs.tar.gz" -C /tmp/zoff-lease logs 2>/dev/null
}
START_EPOCH=$(date +%s)
trap report EXIT

# ------------------------------------------------------------------ can it run at all
cd "$ROOT"
tar -C "$B" -xJf "$CARRY/bins.tar.xz" || { echo "no $CARRY/bins.tar.xz: run --prebuild here first"; exit 1; }
rm -rf .deps/debs && mkdir -p .deps && cp -r "$CARRY/debs" .deps/debs
eval "$(bash scripts/unpack_deps.sh 2>/dev/null)"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
if ! ldconfig -p | grep -q libcublasLt.so.13 && ! ls /usr/local/cuda/lib64/libcublasLt.so.13 >/dev/null 2>&1; then
  lt=$(find / -xdev -name 'libcublasLt.so.13' 2>/dev/null | head -1)
  [ -n "$lt" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$lt")"
fi
step environment 30 bash -c 'nvidia-smi; nproc; free -g; df -h /tmp .; ldd '"$B"'/zoff | grep -i "not found"; true'
step preflight 30 "$B/zoff" bench step --num-layers 2 --hidden-size 128 --num-attention-heads 2 --seq-length 64 \
  --micro-batch-size 2 --iters 1 --rounds 1 --configs device-optimizer --profile-iters 0 --peak-gemm 0 --device cuda --json ||
  exit 1

# a corpus from the repository's own text (the default corpus needs Debian's fortunes)
step tokenize 60 "$B/zoff" tokenize --tokenizer gpt2 --quiet --output-prefix "$W/corpus" \
  README.md docs/*.md src/*/*.c include/zoff/*.h
DATA=(--data-path "$W/corpus_train.bin" --eval-iters 0 --no-checkpoint)

# ------------------------------------------------------------------ correctness
if part correct; then
step test_ops 150 "$B/test_ops"
step cuda_backend_ran 5 grep -m1 "cuda:" "$LOGS/test_ops.log"
step attention_startup_check 5 bash -c "! grep -m1 'WARNING: .*tensor-core attention' '$LOGS/test_ops.log'"
step fused_ln_startup_check 5 bash -c "! grep -m1 'WARNING: .*fused residual' '$LOGS/test_ops.log'"

fi

# ------------------------------------------------------------------ saves while training (issue 20)
if part ckpt; then
[ "${GPU_BENCH_CKPT:-1}" = 0 ] || { mkdir -p "$W/ckpt" && step bench_ckpt 120 "$B/zoff" bench ckpt --rounds 3 --dir "$W/ckpt"; }
# the staging update's cost against a plain update and the bound of keeping m and v in place (124M-sized)
[ "${GPU_STAGING:-1}" = 0 ] || { [ -x "$B/staging_cost" ] && step staging_cost 60 "$B/staging_cost" 124475904 9; }
if [ -n "${GPU_OVERLAP:-}" ]; then # other arguments for bench/ckpt_overlap.sh (runs split at ';'); @B@: the binaries
  IFS=';' read -ra runs <<< "${GPU_OVERLAP//@B@/$B}"
  for k in "${!runs[@]}"; do
    # shellcheck disable=SC2086
    step "ckpt_overlap_$k" 240 bash bench/ckpt_overlap.sh --dir "$W/overlap" ${runs[$k]}
  done
elif [ -x "$B/zoff-base" ]; then # interleaved, round by round; then a Twin-Flow share (the device's copy at each start)
  step ckpt_overlap 200 bash bench/ckpt_overlap.sh --rounds 3 --steps 130 --interval 40 --detail --dir "$W/overlap" \
    "base=$B/zoff-base" "new=$B/zoff"
  step ckpt_overlap_twinflow 120 bash bench/ckpt_overlap.sh --rounds 2 --steps 130 --interval 40 --ratio 0.5 \
    --dir "$W/overlap" "base=$B/zoff-base" "new=$B/zoff"
else # 18-32 ms steps, 0.5-0.9 s saves (the fourth lease): an interval each save finishes within
  step ckpt_overlap 150 bash bench/ckpt_overlap.sh --rounds 2 --steps 130 --interval 40 --detail --dir "$W/overlap" \
    "cuda=$B/zoff"
fi
fi

# ------------------------------------------------------------------ 1.5B offloaded, 13B (issue 20)
XL=(--num-layers 48 --hidden-size 1600 --num-attention-heads 25 --seq-length 1024)
if part large; then
for rep in $(seq 1 "${GPU_AB_ROUNDS:-1}"); do # GPU_AB_ROUNDS: rounds of this build and the baseline, alternated
bins="zoff zoff-base"; [ $((rep % 2)) -eq 0 ] && bins="zoff-base zoff"
for bin in $bins; do
  [ -x "$B/$bin" ] || continue
  step "bench_step_1558M_offload${bin#zoff}_$rep" 150 "$B/$bin" bench step "${XL[@]}" --micro-batch-size 8 --dtype bf16 --iters 3 \
    --rounds 1 --configs offload,offload+delayed,offload+speculative --profile-iters 0 --peak-gemm 0 --device cuda --json
done
done
printf '%s\n' '{"train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": true}, "steps_per_print": 1, "gradient_clipping": 1.0,' \
  '"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},' \
  '"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}}' > "$W/xl.json"
step train_1558M_offload 120 "$B/zoff" train --config "$W/xl.json" --device cuda "${XL[@]}" --train-iters 3 \
  "${DATA[@]}" --save "$W/xl"
step train_1558M_metrics 5 cat "$W/xl/metrics.jsonl"
S13=(--num-layers 40 --hidden-size 5120 --num-attention-heads 40 --seq-length 1024 --checkpoint-activations)
printf '%s\n' '{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "steps_per_print": 1, "gradient_clipping": 1.0,' \
  '"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},' \
  '"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}}' > "$W/13b.json"
# the issue's box: an 80 GB H100 and 128 GiB of host memory (a larger card is budgeted as that one)
if step plan_13B 60 "$B/zoff" plan --config "$W/13b.json" --device cuda "${S13[@]}" --device-memory 79GiB \
     --host-memory 125GiB --pinned-limit unlimited --disk-free 60GiB --no-probe --write-config "$W/13b-plan.json"; then
  step train_13B 240 "$B/zoff" train --config "$W/13b-plan.json" --device cuda --device-memory 79GiB "${S13[@]}" \
    --train-iters 4 "${DATA[@]}" --save "$W/13b"
  step train_13B_metrics 5 bash -c "cat '$W/13b/metrics.jsonl'; cat '$W/13b-plan.json'"
fi

fi

# ------------------------------------------------------------------ device step against plain PyTorch
PY=python3
if part peer; then
S124=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch-size 16)
for rep in 1 2; do
  step "bench_step_124M_$rep" 90 "$B/zoff" bench step "${S124[@]}" --dtype bf16 --iters 5 --rounds 1 \
    --configs device-optimizer --profile-iters $((rep == 1 ? 3 : 0)) --peak-gemm $((rep == 1 ? 8192 : 0)) --device cuda --json
  step "torch_124M_$rep" 90 env PYTHONUNBUFFERED=1 $PY bench/torch_gpt2_step.py "${S124[@]}" --iters 10 --warmup 3
done
# micro 4: the peer (Hugging Face GPT-2, fp32 weights and AdamW state, no recomputation) needs more
# than an 80 GB card at micro 8
step bench_step_1558M 120 "$B/zoff" bench step "${XL[@]}" --micro-batch-size 4 --dtype bf16 --iters 3 --rounds 1 \
  --configs device-optimizer --profile-iters 2 --peak-gemm 0 --device cuda --json
step torch_1558M 120 env PYTHONUNBUFFERED=1 $PY bench/torch_gpt2_step.py "${XL[@]}" --micro-batch-size 4 --iters 5 --warmup 2

fi

# ------------------------------------------------------------------ the rest of correctness
if part smoke && [ -f "$W/corpus_train.bin" ]; then
  for dev in cuda cpu; do
    step "smoke_train_$dev" 90 "$B/zoff" train --device "$dev" --data-path "$W/corpus_train.bin" \
      --val-path "$W/corpus_val.bin" --train-iters 40 --eval-iters 2 --save "$W/out-$dev"
  done
  step smoke_losses 10 $PY -c "
import json
r = {d: {j['step']: j for j in map(json.loads, open('$W/out-%s/metrics.jsonl' % d)) if 'loss' in j} for d in ('cuda', 'cpu')}
steps = sorted(set(r['cuda']) & set(r['cpu']))
print('step  loss_cuda  loss_cpu  rel')
for s in steps[:5] + steps[-3:]:
    a, b = r['cuda'][s]['loss'], r['cpu'][s]['loss']
    print(s, round(a, 5), round(b, 5), '%.2e' % (abs(a - b) / abs(b)))
"
  # the offloaded step (CPU Adam, pipelined) against the device optimizer, both on the GPU, bf16
  for off in none cpu; do
    printf '%s\n' '{"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true}, "gradient_clipping": 1.0,' \
      '"optimizer": {"type": "AdamW", "params": {"lr": 6e-4}},' \
      "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"$off\"}}}" > "$W/off-$off.json"
    step "smoke_offload_$off" 90 "$B/zoff" train --config "$W/off-$off.json" --device cuda --num-layers 6 \
      --hidden-size 384 --num-attention-heads 6 --seq-length 256 --train-iters 30 "${DATA[@]}" --save "$W/off-$off"
  done
  step smoke_offload_losses 10 $PY -c "
import json, sys
r = [{j['step']: j['loss'] for j in map(json.loads, open('$W/off-%s/metrics.jsonl' % d)) if 'loss' in j} for d in ('none', 'cpu')]
worst = 0
for s in sorted(r[0]):
    rel = abs(r[0][s] - r[1][s]) / abs(r[0][s]); worst = max(worst, rel)
    if s <= 3 or s % 10 == 0: print(s, round(r[0][s], 5), round(r[1][s], 5), '%.2e' % rel)
print('worst relative loss difference, device optimizer vs offload: %.2e' % worst)
sys.exit(worst > 1e-2)
"
fi
if part correct; then
step emu_check 120 "$B/emu_check_real"
step test_device 60 "$B/test_device"
for k in mma flash simple; do
  step "test_ops_attention_$k" 90 env ZOFF_CPU_KERNELS=scalar ZOFF_CUDA_ATTENTION=$k "$B/test_ops"
done
fi
# ------------------------------------------------------------------ accumulation: the full device buffer or the buckets
# (zoff_grad_buckets true: the sum on the device; "always": on the host, through the buckets each micro-batch)
if part accum; then
for gb in true always; do
  v=$gb; [ "$gb" = always ] && v='"always"'
  printf '%s\n' '{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4, "bf16": {"enabled": true},' \
    '"steps_per_print": 1, "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},' \
    "\"zero_optimization\": {\"stage\": 2, \"zoff_grad_buckets\": $v, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}}" \
    > "$W/acc-$gb.json"
  step "train_1558M_accum4_$gb" 150 "$B/zoff" train --config "$W/acc-$gb.json" --device cuda "${XL[@]}" --train-iters 3 \
    "${DATA[@]}" --save "$W/acc-$gb"
  step "train_1558M_accum4_${gb}_metrics" 5 cat "$W/acc-$gb/metrics.jsonl"
done
fi
echo "lease: $(($(date +%s) - START_EPOCH)) s"
