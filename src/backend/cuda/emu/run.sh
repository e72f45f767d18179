#!/usr/bin/env bash
# Run the CUDA backend on a CPU emulator of CUDA (no GPU needed) under the op test
# table (tests/test_ops.c, CUDA vs CPU vs double references) and extra checks
# (emu_check.cpp). Development tool: not built by CMake, not part of the library.
#
#   bash src/backend/cuda/emu/run.sh [BUILD_DIR]     (default /tmp/zoff-cuda-emu)
#
# How: the .cu files are rewritten (kernel<<<cfg>>>(args) -> emu_launch(emu_cfg(cfg),
# kernel, args); extern __shared__ T x[] -> T *x = (T *)emu_dyn_smem()) and compiled
# as C++ against the stand-in headers in include/ (CUDA runtime, cuda_fp16, cuBLASLt,
# CUB); the rest of zoff is compiled with ZOFF_HAVE_CUDA so the CUDA backend is
# registered. Every CUDA thread is a fiber with real barrier semantics (see
# emu_device.hpp). Runs: default, fibers in reverse order, simple attention,
# no cuBLASLt algorithms (fallback GEMM), cuBLASLt only for 16-byte-aligned
# pointers; each under AddressSanitizer when ZOFF_EMU_ASAN=1.
#
# What it cannot show: speed, the GPU memory model (races between blocks), the real
# cuBLASLt / CUB behaviour, compile errors of nvcc (build with nvcc for those).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
B=${1:-/tmp/zoff-cuda-emu}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$B/gen" "$B/obj"

SAN=""
if [ "${ZOFF_EMU_ASAN:-0}" = 1 ]; then SAN="-fsanitize=address,undefined -fno-omit-frame-pointer"; fi
CFLAGS="-O1 -g -fopenmp $SAN -DZOFF_HAVE_CUDA=1 -DZOFF_SOURCE_DIR=\"$ROOT\" -DZOFF_VERSION=\"emu\" -I$ROOT/include -I$ROOT/src"
CXXFLAGS="-std=c++17 $CFLAGS -I$HERE/include -I$HERE -Wall -Wno-unused-function -Wno-unused-variable -Wno-unknown-pragmas"

# 1. rewrite the .cu files
for cu in "$ROOT"/src/backend/cuda/*.cu; do
  python3 - "$cu" "$B/gen/$(basename "${cu%.cu}").cpp" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
src = re.sub(r'extern\s+__shared__\s+(\w+)\s+(\w+)\s*\[\]\s*;', r'\1 *\2 = (\1 *)emu_dyn_smem();', src)
launch = re.compile(r'([A-Za-z_]\w*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(', re.S)
src, n = launch.subn(lambda m: 'emu_launch(emu_cfg(%s), %s, ' % (m.group(2), m.group(1)), src)
open(sys.argv[2], 'w').write('#include "emu_device.hpp"\n#line 1 "%s"\n' % sys.argv[1] + src)
print('%s: %d launches' % (sys.argv[1].split('/')[-1], n), file=sys.stderr)
EOF
done

# 2. compile: emulator, rewritten kernels, the CUDA runtime (C), the rest of zoff (C), the tests
objs=()
compile() { # src obj compiler flags...
  local src=$1 obj=$2; shift 2
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ "$HERE/emu_device.hpp" -nt "$obj" ] || [ "$HERE/emu_runtime.h" -nt "$obj" ]; then
    "$@" -c "$src" -o "$obj"
  fi
  objs+=("$obj")
}
compile "$HERE/emu.cpp" "$B/obj/emu.o" g++ $CXXFLAGS
for f in "$B"/gen/*.cpp; do compile "$f" "$B/obj/$(basename "$f" .cpp).o" g++ $CXXFLAGS -I"$ROOT/src/backend/cuda"; done
compile "$ROOT/src/backend/cuda/cuda_backend.c" "$B/obj/cuda_backend.o" gcc -std=gnu11 $CFLAGS -I"$HERE/include" -Wall -Wextra
while IFS= read -r -d '' c; do
  case "$c" in */src/cli/*|*/src/backend/cuda/*|*mpi*|*uring*) continue ;; esac
  o="$B/obj/lib_$(echo "${c#$ROOT/src/}" | tr '/' '_' | sed 's/\.c$/.o/')"
  isa="" # as CMakeLists.txt: SIMD files get their ISA flags
  case "$c" in
    *_avx512.c) isa="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512fp16 -mfma -mf16c -mavx2" ;;
    *_avx2.c) isa="-mavx2 -mfma -mf16c" ;;
  esac
  compile "$c" "$o" gcc -std=gnu11 $CFLAGS $isa -w
done < <(find "$ROOT/src" -name '*.c' -print0 | sort -z)
lib_objs=("${objs[@]}")
compile "$ROOT/tests/test_ops.c" "$B/obj/test_ops.o" gcc -std=gnu11 $CFLAGS -I"$ROOT/tests" -DZOFF_TEST_DIR=\"$ROOT/tests\" -DZOFF_BINARY=\"/bin/false\" -w
g++ $SAN -fopenmp -o "$B/test_ops_emu" "${lib_objs[@]}" "$B/obj/test_ops.o" -ljansson -lopenblas -lcmocka -lm -lpthread
objs=()
compile "$HERE/emu_check.cpp" "$B/obj/emu_check.o" g++ $CXXFLAGS
g++ $SAN -fopenmp -o "$B/emu_check" "${lib_objs[@]}" "$B/obj/emu_check.o" -ljansson -lopenblas -lm -lpthread

# 3. run (EMU_ONLY="label ..." runs only those). tests/test_ops.c re-runs itself in a child with
# ZOFF_CPU_KERNELS=scalar unless that variable is set: the variants set it (one run each).
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0"
fail=0
run() { # label, env..., command
  local label=$1; shift
  if [ -n "${EMU_ONLY:-}" ] && ! [[ " $EMU_ONLY " == *" $label "* ]]; then return; fi
  echo "== $label"
  if env "$@" > "$B/$label.log" 2>&1; then
    grep -E "PASSED|FAILED|max normalised|emu_check:" "$B/$label.log" | grep -v "^\[ *OK" | head -60
  else
    tail -60 "$B/$label.log"; echo "!! $label FAILED (log: $B/$label.log)"; fail=1
  fi
}
run emu_check "$B/emu_check"
run test_ops "$B/test_ops_emu"
run test_ops_reverse ZOFF_CPU_KERNELS=scalar EMU_ORDER=reverse "$B/test_ops_emu"
run test_ops_simple_attention ZOFF_CPU_KERNELS=scalar ZOFF_CUDA_ATTENTION=simple "$B/test_ops_emu"
run test_ops_no_cublaslt ZOFF_CPU_KERNELS=scalar EMU_LT=none "$B/test_ops_emu"
run test_ops_cublaslt_aligned16 ZOFF_CPU_KERNELS=scalar EMU_LT=aligned16 "$B/test_ops_emu"
run test_ops_no_device ZOFF_CPU_KERNELS=scalar EMU_NO_DEVICE=1 "$B/test_ops_emu"
[ "$fail" = 0 ] && echo "emulator: all runs passed" || { echo "emulator: some runs FAILED"; exit 1; }
