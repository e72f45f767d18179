#!/usr/bin/env bash
# Run the CUDA backend on a CPU emulator of CUDA (no GPU needed) under the op test
# table (tests/test_ops.c, CUDA vs CPU vs double references), the PTX instruction
# models' check (emu_ptx_check.cpp) and extra checks (emu_check.cpp): the full set.
# (ctest runs a representative subset: tests/cuda_emu/emu.cmake, tests cuda_emu_*.)
#
#   bash tests/cuda_emu/run.sh [BUILD_DIR]     (default /tmp/zoff-cuda-emu)
#   EMU_ONLY="label ..." runs only those runs (and builds only what they need)
#
# NCCL (EMU_ONLY=nccl, also part of the default runs): zoff built with CUDA, MPI
# and NCCL (src/comm/comm_nccl.c) against the emulator and a stand-in NCCL over
# MPI (include/nccl.h, nccl_emu.cpp); tests/test_comm.c runs under mpirun -np 2
# (label nccl: collectives on CUDA device buffers through NCCL, the engine on a
# CUDA device), alone (nccl_1rank: the one-rank path on a CUDA device) and as
# `test_comm nccl_timeout` (nccl_timeout: the watchdog aborts a collective a
# rank never joins). Needs mpicc/mpicxx/mpirun (Open MPI) and JOBS <= cores.
#
# How: the .cu files are rewritten (kernel<<<cfg>>>(args) -> emu_launch(emu_cfg(cfg),
# kernel, args); extern __shared__ T x[] -> T *x = (T *)emu_dyn_smem()) and compiled
# as C++ against the stand-in headers in include/ (CUDA runtime, cuda_fp16, cuBLASLt,
# CUB); the rest of zoff is compiled with ZOFF_HAVE_CUDA so the CUDA backend is
# registered. Every CUDA thread is a fiber with real barrier semantics (see
# emu_device.hpp). Runs: default, fp32 flash attention (no tensor-core kernels),
# fibers in reverse order, simple attention,
# no cuBLASLt algorithms (fallback GEMM), cuBLASLt only for 16-byte-aligned
# pointers; each under AddressSanitizer when ZOFF_EMU_ASAN=1.
#
# Every run that fails prints its log's tail and "!! label FAILED"; the script ends with
# "emulator: all runs passed" or exits non-zero; a step that stops it early says where.
#
# What it cannot show: speed, the GPU memory model (races between blocks), the real
# cuBLASLt / CUB behaviour, compile errors of nvcc (build with nvcc for those).
set -Eeuo pipefail
# whatever stops this script early says so (a failed build step, a bad path)
trap 'rc=$?; echo "emulator: run.sh stopped at line $LINENO (exit $rc): $BASH_COMMAND" >&2; exit $rc' ERR
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
B=${1:-/tmp/zoff-cuda-emu}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$B/gen" "$B/obj" "$B/obj-nccl"

# which runs: EMU_ONLY empty = all; "nccl" stands for every nccl_* run too
wanted() {
  [ -z "${EMU_ONLY:-}" ] && return 0
  [[ " $EMU_ONLY " == *" $1 "* ]] && return 0
  [[ "$1" == nccl_* && " $EMU_ONLY " == *" nccl "* ]]
}
want_ops=0
want_nccl=0
for l in emu_ptx emu_check test_ops test_ops_flash_attention test_ops_reverse test_ops_simple_attention test_ops_no_cublaslt test_ops_cublaslt_aligned16 \
         test_ops_no_device; do wanted "$l" && want_ops=1; done
for l in nccl nccl_1rank nccl_timeout; do wanted "$l" && want_nccl=1; done

SAN=""
if [ "${ZOFF_EMU_ASAN:-0}" = 1 ]; then SAN="-fsanitize=address,undefined -fno-omit-frame-pointer"; fi
CFLAGS="-O2 -g -fopenmp $SAN -DZOFF_HAVE_CUDA=1 -DZOFF_SOURCE_DIR=\"$ROOT\" -DZOFF_VERSION=\"emu\" -I$ROOT/include -I$ROOT/src"
CXXFLAGS="-std=c++17 $CFLAGS -I$HERE/include -I$HERE -Wall -Wno-unused-function -Wno-unused-variable -Wno-unknown-pragmas"

# 1. rewrite the .cu files
for cu in "$ROOT"/src/backend/cuda/*.cu; do
  python3 "$HERE/rewrite_cu.py" "$cu" "$B/gen/$(basename "${cu%.cu}").cpp"
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
compile "$HERE/emu_ptx.cpp" "$B/obj/emu_ptx.o" g++ $CXXFLAGS
for f in "$B"/gen/*.cpp; do compile "$f" "$B/obj/$(basename "$f" .cpp).o" g++ $CXXFLAGS -I"$ROOT/src/backend/cuda"; done
compile "$ROOT/src/backend/cuda/cuda_backend.c" "$B/obj/cuda_backend.o" gcc -std=gnu11 $CFLAGS -I"$HERE/include" -Wall -Wextra
emu_objs=("${objs[@]}")
if [ "$want_ops" = 1 ]; then
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
objs=()
compile "$HERE/emu_ptx_check.cpp" "$B/obj/emu_ptx_check.o" g++ $CXXFLAGS
g++ $SAN -fopenmp -o "$B/emu_ptx_check" "$B/obj/emu.o" "$B/obj/emu_ptx.o" "$B/obj/emu_ptx_check.o" -lm -lpthread
fi

# NCCL: the rest of zoff again, with MPI and NCCL (comm_mpi.c, comm_nccl.c), the stand-in NCCL, test_comm
if [ "$want_nccl" = 1 ]; then
  NFLAGS="$CFLAGS -DZOFF_HAVE_MPI=1 -DZOFF_HAVE_NCCL=1"
  objs=("${emu_objs[@]}")
  compile "$HERE/nccl_emu.cpp" "$B/obj-nccl/nccl_emu.o" mpicxx $CXXFLAGS -Wextra -Werror
  while IFS= read -r -d '' c; do
    case "$c" in */src/cli/*|*/src/backend/cuda/*|*uring*) continue ;; esac
    o="$B/obj-nccl/lib_$(echo "${c#$ROOT/src/}" | tr '/' '_' | sed 's/\.c$/.o/')"
    isa=""
    case "$c" in
      *_avx512.c) isa="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512fp16 -mfma -mf16c -mavx2" ;;
      *_avx2.c) isa="-mavx2 -mfma -mf16c" ;;
    esac
    warn="-w"
    # the code under test: the project's warnings, as errors, against the stand-in headers
    case "$c" in */src/comm/*) warn="-I$HERE/include -Wall -Wextra -Wshadow -Wno-unused-parameter -Wstrict-prototypes -Wmissing-prototypes -Werror" ;; esac
    compile "$c" "$o" mpicc -std=gnu11 $NFLAGS $isa $warn
  done < <(find "$ROOT/src" -name '*.c' -print0 | sort -z)
  compile "$ROOT/tests/test_comm.c" "$B/obj-nccl/test_comm.o" mpicc -std=gnu11 $NFLAGS -I"$ROOT/tests" -Wall -Wextra -Werror -Wno-unused-parameter
  mpicxx $SAN -fopenmp -o "$B/test_comm_nccl" "${objs[@]}" -ljansson -lopenblas -lcmocka -lm -lpthread
fi

# 3. run (EMU_ONLY="label ..." runs only those). tests/test_ops.c re-runs itself in a child with
# ZOFF_CPU_KERNELS=scalar unless that variable is set: the variants set it (one run each).
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0"
fail=0
run() { # label, env..., command
  local label=$1; shift
  wanted "$label" || return 0
  echo "== $label"
  local t0=$SECONDS
  if env "$@" > "$B/$label.log" 2>&1; then
    # a summary only: never the verdict. (Under `set -e -o pipefail` this pipeline once ended the
    # script without a word: head closing the pipe after 60 lines killed grep with SIGPIPE.)
    { grep -E "PASSED|FAILED|SKIPPED|max normalised|emu_check:|emu_ptx_check:|^  (dp|nccl) " "$B/$label.log" | grep -v "^\[ *OK" | tail -60; } || true
    echo "   ($((SECONDS - t0)) s)"
  else
    tail -60 "$B/$label.log"; echo "!! $label FAILED (log: $B/$label.log)"; fail=1
  fi
}
run emu_ptx "$B/emu_ptx_check"
run emu_check "$B/emu_check"
run test_ops_flash_attention ZOFF_CPU_KERNELS=scalar ZOFF_CUDA_ATTENTION=flash "$B/test_ops_emu"
run test_ops "$B/test_ops_emu"
run test_ops_reverse ZOFF_CPU_KERNELS=scalar EMU_ORDER=reverse "$B/test_ops_emu"
run test_ops_simple_attention ZOFF_CPU_KERNELS=scalar ZOFF_CUDA_ATTENTION=simple "$B/test_ops_emu"
run test_ops_no_cublaslt ZOFF_CPU_KERNELS=scalar EMU_LT=none "$B/test_ops_emu"
run test_ops_cublaslt_aligned16 ZOFF_CPU_KERNELS=scalar EMU_LT=aligned16 "$B/test_ops_emu"
run test_ops_no_device ZOFF_CPU_KERNELS=scalar EMU_NO_DEVICE=1 "$B/test_ops_emu"
# NCCL: the options of tests/cli_mpi.sh; one thread per rank's kernels (2 ranks share the cores)
MPI2=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader
      --mca btl_vader_single_copy_mechanism none -x OMP_NUM_THREADS=1 -x ASAN_OPTIONS -np 2)
run nccl timeout 900 "${MPI2[@]}" "$B/test_comm_nccl"
run nccl_1rank timeout 900 "$B/test_comm_nccl"
# the watchdog: rank 0's all-reduce fails after the 1 s timeout; the ranks end without MPI_Finalize, so
# mpirun's status is not the verdict: rank 0's line is
run nccl_timeout bash -c "timeout 120 ${MPI2[*]} $B/test_comm_nccl nccl_timeout; grep -q 'rank 0: nccl timeout test PASSED' $B/nccl_timeout.log"
[ "$fail" = 0 ] && echo "emulator: all runs passed" || { echo "emulator: some runs FAILED"; exit 1; }
