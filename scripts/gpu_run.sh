#!/usr/bin/env bash
# The GPU validation run of zoff's CUDA backend, on a machine with an NVIDIA GPU,
# CUDA (nvcc), a C compiler and CMake, and no package registry:
#
#   bash scripts/gpu_run.sh [STAGE...]       STAGE: build, test, sanitize, bench, large, all (default all)
#
#   build   unpack .deps/debs (scripts/pack_deps.sh made them) into .deps/prefix,
#           configure with CUDA for sm_90 (-DZOFF_MPI=OFF), build everything
#   test    ctest (test_ops compares the CUDA backend with the CPU backend and with
#           double references; cuda_sass_mma: the attention kernels hold tensor-core
#           instructions), a check that the start-up comparison of the tensor-core attention
#           with the flash kernels passed (no fallback warning), test_ops again with the
#           tensor-core attention forced (ZOFF_CUDA_ATTENTION=mma), with the fp32 flash
#           kernels and with the simple kernels,
#           emu_check (tests/cuda_emu/emu_check.cpp built against the real
#           library: flash attention at head sizes 32/64/128, unaligned matmuls,
#           asynchronous error semantics)
#   sanitize compute-sanitizer memcheck of test_ops, racecheck and synccheck of
#           emu_check (skipped with a note where the tool is missing or refuses the device)
#   bench   every `zoff bench` subcommand that exists (skipped with a note when it
#           does not), `zoff bench step` at GPT-2 124M micro-batch 16 with the tensor-core
#           attention and with the fp32 flash kernels (interleaved, twice), at 1.5B micro-batch 8
#           with the optimizer on the device (each with its op profile and MFU), plain PyTorch on the same
#           shapes (bench/torch_gpt2_step.py), and a short
#           training run on the GPU and on the CPU with the losses side by side
#   large   (not part of all: minutes of device time each) `zoff bench step` at 1.5B micro-batch 8
#           with the optimizer offloaded (offload, offload+delayed, offload+speculative; the issue's
#           18k tokens/s target), then the 13B shape (40 x 5120, seq 1024, activation checkpointing):
#           `zoff plan` on this machine writes its recommended config, and `zoff train` runs 4 steps
#           with it (tokens/s, start-up, the memory lines of the log)
#
# Output: report.md and logs.tar.gz in $OUT (or ./gpu-report/ when OUT is unset).
# Every run rewrites report.md from all stages run so far (their logs are kept in
# $BUILD_DIR/gpu-logs), so the stages may be run in separate calls, e.g. when one
# call may last 10 minutes at most:
#   bash scripts/gpu_run.sh build; bash scripts/gpu_run.sh test; bash scripts/gpu_run.sh sanitize
#   bash scripts/gpu_run.sh bench
# The build directory is reused when it exists.
#
# Environment: BUILD_DIR (default build-gpu), CUDA_ARCH (default 90-real), JOBS (default
# nproc), ZOFF_GPU_WERROR=1 (build with -Werror; off by default: another compiler
# may warn where CI's does not), CTEST_ARGS (extra ctest arguments, e.g. "-E test_gpt2").
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/gpu_lib.sh
. "$ROOT/scripts/gpu_lib.sh"
BUILD=${BUILD_DIR:-build-gpu}
ARCH=${CUDA_ARCH:-90-real}
JOBS=${JOBS:-$(nproc)}
REPORT=${OUT:-$ROOT/gpu-report}
LOGS=$ROOT/$BUILD/gpu-logs
mkdir -p "$REPORT" "$LOGS"

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(all)
want() { local s; for s in "${stages[@]}"; do { [ "$s" = all ] && [ "$1" != large; } || [ "$s" = "$1" ] && return 0; done; return 1; }
for s in "${stages[@]}"; do
  case "$s" in all|build|test|sanitize|bench|large) ;; *) echo "usage: bash scripts/gpu_run.sh [build|test|sanitize|bench|large|all]..." >&2; exit 2 ;; esac
done

# step NAME TIMEOUT_S COMMAND...: run, log to $LOGS/NAME.log, record status and seconds in $LOGS/NAME.status
step() {
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  local t0=$SECONDS rc
  { echo "\$ $*"; timeout --kill-after=10 "$limit" "$@"; } > "$LOGS/$name.log" 2>&1
  rc=$?
  local dt=$((SECONDS - t0)) verdict=ok
  [ $rc -ne 0 ] && verdict="FAILED (exit $rc)"
  [ $rc -eq 124 ] && verdict="TIMEOUT (${limit}s)"
  printf '%s|%s|%s|%s\n' "$name" "$verdict" "$dt" "$*" > "$LOGS/$name.status"
  echo "   $verdict in ${dt}s (log $LOGS/$name.log)"
  tail -5 "$LOGS/$name.log" | sed 's/^/   | /'
  return $rc
}
note() { # NAME TEXT: a step that was skipped
  printf '%s|skipped|0|%s\n' "$1" "$2" > "$LOGS/$1.status"
  echo "$2" > "$LOGS/$1.log"
  echo "== $1: skipped: $2"
}

# ---------------------------------------------------------------- environment + dependencies
deps_env() {
  if ls .deps/debs/*.deb >/dev/null 2>&1; then
    local env
    # unpack once per set of .debs: a fresh unpack touches every header and would rebuild everything
    if [ -f .deps/prefix/.manifest ] && cmp -s .deps/prefix/.manifest .deps/debs/MANIFEST; then
      env=$(bash scripts/unpack_deps.sh --print-only) || return 1
    else
      env=$(bash scripts/unpack_deps.sh) || return 1
      cp .deps/debs/MANIFEST .deps/prefix/.manifest 2>/dev/null || true
    fi
    eval "$env"
    echo "dependencies: .deps/prefix (from .deps/debs)"
  else
    echo "dependencies: no .deps/debs; using the system's packages"
  fi
}

if want build; then
  rm -f "$LOGS"/*
  step environment 60 bash -c 'nvidia-smi; echo; nvcc --version; echo; gcc --version | head -1; cmake --version | head -1; uname -a; nproc; free -g' || true
  step dependencies 120 bash -c "$(declare -f deps_env); deps_env && pkg-config --modversion jansson openblas cmocka liburing" || true
fi
deps_env > /dev/null 2>&1 || true

# ---------------------------------------------------------------- build
if want build; then
  werror=OFF
  [ "${ZOFF_GPU_WERROR:-0}" = 1 ] && werror=ON
  step configure 300 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DZOFF_CUDA=ON -DZOFF_MPI=OFF \
    -DZOFF_WERROR=$werror "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" &&
  step build 1500 cmake --build "$BUILD" -j "$JOBS" || true
  if [ -x "$BUILD/zoff" ]; then
    step emu_check_build 300 bash -c "g++ -std=c++17 -O2 -Iinclude -Isrc tests/cuda_emu/emu_check.cpp \
      -o '$BUILD/emu_check' '$BUILD/libzoff.a' \$(pkg-config --libs jansson openblas liburing 2>/dev/null || echo -ljansson -lopenblas) \
      -L/usr/local/cuda/lib64 -lcudart -ldl -fopenmp -lpthread -lm -Wl,-rpath,/usr/local/cuda/lib64" || true
  fi
fi

# ---------------------------------------------------------------- tests
if want test; then
  if [ ! -x "$BUILD/test_ops" ]; then
    note ctest "no build in $BUILD: run the build stage first"
  else
    step test_ops 600 "$BUILD/test_ops" || true
    # test_ops skips backends that are not available: make sure the CUDA one ran
    step cuda_backend_ran 10 grep -m1 "cuda:" "$LOGS/test_ops.log" || true
    # shellcheck disable=SC2086
    step ctest 1200 bash -c "cd '$BUILD' && ctest --output-on-failure -j $JOBS --timeout 900 ${CTEST_ARGS:-}" || true
    # (ZOFF_CPU_KERNELS set: test_ops does not re-run itself on the portable CPU kernels)
    # the backend compares its tensor-core attention with the flash kernels at start-up and falls back
    # with a warning when they disagree: that warning must not be there
    step attention_startup_check 10 bash -c "! grep -m1 'WARNING: .*tensor-core attention' '$LOGS/test_ops.log'" || true
    # likewise the fused residual + LayerNorm kernels against the unfused path
    step fused_ln_startup_check 10 bash -c "! grep -m1 'WARNING: .*fused residual' '$LOGS/test_ops.log'" || true
    step test_ops_unfused_ln 600 env ZOFF_CPU_KERNELS=scalar ZOFF_CUDA_FUSED_LN=off ZOFF_TEST_OPS=residual_layernorm_fwd,residual_layernorm_bwd,test_residual_layernorm_bits "$BUILD/test_ops" || true
    step test_ops_mma_attention 600 env ZOFF_CPU_KERNELS=scalar ZOFF_CUDA_ATTENTION=mma "$BUILD/test_ops" || true
    step test_ops_flash_attention 600 env ZOFF_CPU_KERNELS=scalar ZOFF_CUDA_ATTENTION=flash "$BUILD/test_ops" || true
    step test_ops_simple_attention 600 env ZOFF_CPU_KERNELS=scalar ZOFF_CUDA_ATTENTION=simple "$BUILD/test_ops" || true
    step test_ops_simple_matmul 600 env ZOFF_CPU_KERNELS=scalar ZOFF_CUDA_MATMUL=simple "$BUILD/test_ops" || true
    if [ -x "$BUILD/emu_check" ]; then
      step emu_check 600 "$BUILD/emu_check" || true
    else
      note emu_check "emu_check was not built (see emu_check_build)"
    fi
  fi
fi

# ---------------------------------------------------------------- compute-sanitizer
# sanitize NAME TOOL BINARY: a refusal of the tool (device not supported, ...) is a skip, not a failure
sanitize() {
  local name=$1 tool=$2 bin=$3
  if [ ! -x "$bin" ]; then note "$name" "$bin was not built"; return; fi
  step "$name" 900 compute-sanitizer --tool "$tool" --error-exitcode 3 "$bin" && return
  local why
  why=$(grep -m1 -E "Device not supported|LibraryNotLoaded|not supported on this platform" "$LOGS/$name.log")
  if [ -n "$why" ]; then
    cp "$LOGS/$name.log" "$LOGS/$name.refused.txt"
    note "$name" "compute-sanitizer refused to run here: $why"
  fi
}
if want sanitize; then
  if ! command -v compute-sanitizer >/dev/null; then
    note memcheck_test_ops "compute-sanitizer is not on the PATH"
  else
    sanitize memcheck_test_ops memcheck "$BUILD/test_ops"
    sanitize racecheck_emu_check racecheck "$BUILD/emu_check"
    sanitize synccheck_emu_check synccheck "$BUILD/emu_check"
  fi
fi

# ---------------------------------------------------------------- benchmarks
if want bench; then
  if [ ! -x "$BUILD/zoff" ]; then
    note bench "no build in $BUILD: run the build stage first"
  else
    # the benchmarks `zoff bench --help` lists, plus names expected later; GPU ones take --device
    listed=$("$BUILD/zoff" bench --help 2>&1 | awk 'NR > 1 && $1 ~ /^[a-z]+$/ {print $1}')
    for b in $(printf '%s\n' $listed step ops kernels attention matmul | awk '!seen[$0]++'); do
      help=$("$BUILD/zoff" bench "$b" --help 2>&1); rc=$?
      if [ $rc -ne 0 ] || echo "$help" | grep -qi "unknown benchmark"; then
        note "bench_$b" "zoff bench $b does not exist in this build (exit $rc): $(echo "$help" | head -1)"
      elif ! echo "$help" | grep -q -- "--device"; then
        note "bench_$b" "zoff bench $b has no --device option: not a GPU benchmark"
      else
        step "bench_$b" 600 "$BUILD/zoff" bench "$b" --device cuda || true
      fi
    done
    # GPT-2 124M, micro-batch 16, seq 1024, bf16: the tensor-core attention (default) against the fp32
    # flash kernels (ZOFF_CUDA_ATTENTION=flash), same machine, back to back, then once more each
    G124=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch-size 16
          --dtype bf16 --iters 3 --rounds 2 --device cuda --json)
    for rep in 1 2; do
      step "bench_step_124M_mma_$rep" 600 "$BUILD/zoff" bench step "${G124[@]}" || true
      step "bench_step_124M_flash_$rep" 600 env ZOFF_CUDA_ATTENTION=flash "$BUILD/zoff" bench step "${G124[@]}" || true
      # plain PyTorch on the same shape (Hugging Face GPT-2, SDPA, bf16 autocast, fused AdamW)
      step "torch_124M_$rep" 600 env PYTHONUNBUFFERED=1 python3 bench/torch_gpt2_step.py --num-layers 12 \
        --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch-size 16 --iters 10 || true
    done
    # GPT-2 1.5B (XL), micro-batch 4 (the peer does not fit 80 GB at 8), optimizer on the device only, one round (every configuration and
    # round builds its model and engine anew); each bench step JSON holds "profile" (device time per op
    # class, GEMM and attention TFLOP/s), "peak_gemm" (an 8192^3 bf16 cuBLASLt GEMM) and "mfu"
    step bench_step_1558M 600 "$BUILD/zoff" bench step --num-layers 48 --hidden-size 1600 --num-attention-heads 25 \
      --seq-length 1024 --micro-batch-size 4 --dtype bf16 --iters 3 --rounds 1 --configs device-optimizer \
      --device cuda --json || true
    step torch_1558M 600 env PYTHONUNBUFFERED=1 python3 bench/torch_gpt2_step.py --num-layers 48 --hidden-size 1600 \
      --num-attention-heads 25 --seq-length 1024 --micro-batch-size 4 --iters 5 --warmup 2 || true
    # a short training run on each backend (a corpus from the repository's own text)
    W=$ROOT/$BUILD/gpu-smoke
    rm -rf "$W" && mkdir -p "$W"
    if step smoke_tokenize 300 "$BUILD/zoff" tokenize --tokenizer gpt2 --quiet --output-prefix "$W/corpus" \
         README.md $(ls docs/*.md src/*/*.c include/zoff/*.h 2>/dev/null); then
      for dev in cuda cpu; do
        step "smoke_train_$dev" 600 "$BUILD/zoff" train --device "$dev" --data-path "$W/corpus_train.bin" \
          --val-path "$W/corpus_val.bin" --train-iters 40 --eval-iters 2 --save "$W/out-$dev" || true
      done
      {
        for dev in cuda cpu; do
          echo "--- $dev: $W/out-$dev/metrics.jsonl (first 5 and last 3 lines)"
          if [ -f "$W/out-$dev/metrics.jsonl" ]; then
            head -5 "$W/out-$dev/metrics.jsonl"; echo "..."; tail -3 "$W/out-$dev/metrics.jsonl"
          else
            echo "(none)"
          fi
        done
      } > "$LOGS/smoke_losses.log" 2>&1
      printf 'smoke_losses|ok|0|metrics of both runs\n' > "$LOGS/smoke_losses.status"
    fi
  fi
fi

# ---------------------------------------------------------------- large models (stage "large" only)
if want large; then
  if [ ! -x "$BUILD/zoff" ]; then
    note large "no build in $BUILD: run the build stage first"
  else
    step bench_step_1558M_offload 600 "$BUILD/zoff" bench step --num-layers 48 --hidden-size 1600 \
      --num-attention-heads 25 --seq-length 1024 --micro-batch-size 8 --dtype bf16 --iters 3 --rounds 1 \
      --configs offload,offload+delayed,offload+speculative --profile-iters 0 --peak-gemm 0 --device cuda --json || true
    W=$ROOT/$BUILD/gpu-13b
    rm -rf "$W" && mkdir -p "$W"
    # a corpus from the repository's own text (the default corpus needs Debian's fortunes)
    "$BUILD/zoff" tokenize --tokenizer gpt2 --quiet --output-prefix "$W/corpus" README.md docs/*.md src/*/*.c >/dev/null
    S13=(--num-layers 40 --hidden-size 5120 --num-attention-heads 40 --seq-length 1024 --checkpoint-activations)
    printf '%s\n' '{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},' \
      '"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},' \
      '"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}}' > "$W/ds.json"
    if step plan_13B 300 "$BUILD/zoff" plan --config "$W/ds.json" --device cuda "${S13[@]}" \
         --write-config "$W/plan.json"; then
      # no checkpoint: 13B's (~8 bytes per parameter, ~100 GB) does not fit a 64 GiB disk
      step train_13B 600 "$BUILD/zoff" train --config "$W/plan.json" --device cuda "${S13[@]}" --train-iters 4 \
        --data-path "$W/corpus_train.bin" --eval-iters 0 --no-checkpoint --save "$W/out" || true
    fi
  fi
fi

# ---------------------------------------------------------------- report
R=$REPORT/report.md
{
  echo "# zoff GPU run"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (dirty)'), build $BUILD, CUDA arch $ARCH, stages run this time: ${stages[*]}"
  echo
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
  echo
  gpu_status_table "$LOGS" 120
  echo
  if [ -f "$LOGS/ctest.log" ]; then
    echo "## ctest"
    echo '```'
    grep -E "tests passed|Test +#|The following tests" "$LOGS/ctest.log" | tail -40
    echo '```'
  fi
  for f in test_ops test_ops_mma_attention test_ops_flash_attention test_ops_simple_attention test_ops_simple_matmul; do
    [ -f "$LOGS/$f.log" ] || continue
    if grep -q "max normalised" "$LOGS/$f.log"; then
      echo "## per-op errors ($f$([ "$f" = test_ops ] || echo ', CUDA rows'))"
      echo '```'
      if [ "$f" = test_ops ]; then grep "max normalised" "$LOGS/$f.log" | sed 's/^ *//'
      else grep "max normalised" "$LOGS/$f.log" | grep "cuda:" | sed 's/^ *//'; fi
      echo '```'
    fi
    if grep -qE "differs|normalised error .* >|FAILED|Error" "$LOGS/$f.log"; then
      echo "## failures ($f)"
      echo '```'
      grep -E "differs|normalised error .* >|first mismatch|FAILED|Error|error:" "$LOGS/$f.log" | head -60
      echo '```'
    fi
  done
  for f in "$LOGS"/*.log; do
    n=$(basename "$f" .log)
    case "$n" in test_ops|test_ops_simple_*) continue ;; esac # summarised above
    echo "## $n"
    echo '```'
    if [ "$(wc -l < "$f")" -gt 80 ]; then echo "[... $(wc -l < "$f") lines; the last 80:]"; fi
    tail -80 "$f"
    echo '```'
  done
} > "$R"
tar -czf "$REPORT/logs.tar.gz" -C "$ROOT/$BUILD" gpu-logs 2>/dev/null
echo "report: $R (logs: $REPORT/logs.tar.gz)"
failed=$(grep -lE "\|(FAILED|TIMEOUT)" "$LOGS"/*.status 2>/dev/null | wc -l)
[ "$failed" -eq 0 ]
