# The CUDA emulator in the test suite (included by the top CMakeLists.txt when the
# tests are built). It compiles the project's .cu files for the CPU (rewrite_cu.py,
# emu_device.hpp, emu.cpp) and links them with the rest of zoff compiled with
# ZOFF_HAVE_CUDA, so tests/test_ops.c runs its op table on an emulated CUDA backend
# (CUDA vs CPU vs double references) on any machine: no GPU, no nvcc needed.
#
# Tools: a C++17 compiler, python3, <ucontext.h> (glibc). ZOFF_CUDA_EMU=AUTO builds
# it when they are present; when they are not (or under ThreadSanitizer, which does
# not follow the emulator's fiber stack switches), the ctest tests are still
# registered and report SKIPPED (exit 77, SKIP_RETURN_CODE), never passed.
#
# Tests:
#   cuda_emu_ptx  the emulator's models of mma.sync / ldmatrix / cp.async against
#                 a scalar reference written from the PTX ISA's fragment tables
#   cuda_emu_check emu_check.cpp on the emulated backend (Release builds only)
#   cuda_emu_ops  test_ops on the emulated CUDA backend: every test (a representative subset
#                 under the sanitizers: ZOFF_TEST_OPS below, -DZOFF_EMU_OPS=a,b to choose)
# The full set (every run of run.sh: reverse thread order, fp32 flash / simple attention, no
# cuBLASLt, emu_check, NCCL, ...), in one command:
#   bash tests/cuda_emu/run.sh
set(ZOFF_CUDA_EMU "AUTO" CACHE STRING "Build the CUDA emulator tests: AUTO (when its tools are present), ON, OFF")

set(_emu_dir ${PROJECT_SOURCE_DIR}/tests/cuda_emu)
set(_emu_why "")
if(ZOFF_CUDA_EMU STREQUAL "OFF")
  set(_emu_why "ZOFF_CUDA_EMU=OFF")
elseif(ZOFF_SANITIZE STREQUAL "thread")
  set(_emu_why "ThreadSanitizer does not follow the emulator's ucontext fibers")
else()
  check_language(CXX)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  include(CheckIncludeFile)
  check_include_file(ucontext.h ZOFF_HAVE_UCONTEXT_H)
  if(NOT CMAKE_CXX_COMPILER)
    set(_emu_why "no C++ compiler")
  elseif(NOT Python3_Interpreter_FOUND)
    set(_emu_why "no python3")
  elseif(NOT ZOFF_HAVE_UCONTEXT_H)
    set(_emu_why "no <ucontext.h>")
  endif()
endif()
if(ZOFF_CUDA_EMU STREQUAL "ON" AND NOT _emu_why STREQUAL "")
  message(FATAL_ERROR "ZOFF_CUDA_EMU=ON but the CUDA emulator cannot be built: ${_emu_why}")
endif()

# what cuda_emu_ops runs: the whole op table (about 15 s of CPU in a Release build); under the
# sanitizers (several times slower) a representative subset (test names of tests/test_ops.c)
if(ZOFF_SANITIZE STREQUAL "")
  set(_emu_ops_default "")
else()
  set(_emu_ops_default "attention_mma_fwd,attention_mma_bwd,layernorm_bwd,residual_layernorm_fwd,matmul_bwd,gelu_bwd,cross_entropy")
endif()
# -DZOFF_EMU_OPS=name,name,... replaces the subset
set(_emu_ops "${_emu_ops_default}")
if(ZOFF_EMU_OPS)
  set(_emu_ops "${ZOFF_EMU_OPS}")
endif()

if(NOT _emu_why STREQUAL "")
  message(STATUS "zoff: CUDA emulator tests skipped: ${_emu_why}")
  foreach(t cuda_emu_ptx cuda_emu_ops cuda_emu_check cuda_emu_epilogue_fallback)
    add_test(NAME ${t} COMMAND sh -c "echo '${t}: SKIPPED: ${_emu_why}'; exit 77")
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
  endforeach()
  return()
endif()
enable_language(CXX)
message(STATUS "zoff: CUDA emulator tests: on")

# 1. the .cu files rewritten into C++
file(GLOB _emu_cu CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cu)
set(_emu_gen "")
foreach(cu ${_emu_cu})
  get_filename_component(n ${cu} NAME_WE)
  set(out ${PROJECT_BINARY_DIR}/cuda_emu/${n}.cpp)
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/cuda_emu
    COMMAND ${Python3_EXECUTABLE} ${_emu_dir}/rewrite_cu.py ${cu} ${out}
    DEPENDS ${cu} ${_emu_dir}/rewrite_cu.py VERBATIM)
  list(APPEND _emu_gen ${out})
endforeach()

# nvcc contracts a * b + c into one fma by default (--fmad=true); so do the emulated kernels where
# the host has FMA, so that a kernel whose result hangs on a product being rounded (a - b*c where
# b*c was rounded elsewhere) fails here as it does on a GPU. __fmul_rn and friends stay uncontracted.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64" AND EXISTS /proc/cpuinfo)
  file(READ /proc/cpuinfo _emu_cpuinfo)
  if(_emu_cpuinfo MATCHES "[ \t]fma[ \t\n]")
    set_source_files_properties(${_emu_gen} PROPERTIES COMPILE_OPTIONS "-mfma;-ffp-contract=fast")
    message(STATUS "zoff: emulated kernels built with FMA contraction, as nvcc builds them")
  endif()
endif()

# 2. the rest of zoff with ZOFF_HAVE_CUDA (CUDA runtime from the emulator's headers)
file(GLOB_RECURSE _emu_c CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/*.c)
# as the library without MPI, NCCL and liburing (the patterns of the top CMakeLists.txt)
list(FILTER _emu_c EXCLUDE REGEX "/src/cli/|/src/backend/cuda/|/src/comm/.*(mpi|nccl).*\\.c$|/src/aio/.*uring.*\\.c$")
list(APPEND _emu_c ${PROJECT_SOURCE_DIR}/src/backend/cuda/cuda_backend.c)
add_library(zoff_emu_obj OBJECT ${_emu_c} ${_emu_gen} ${_emu_dir}/emu.cpp ${_emu_dir}/emu_ptx.cpp)
target_include_directories(zoff_emu_obj PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
  ${_emu_dir}/include ${_emu_dir} ${PROJECT_SOURCE_DIR}/src/backend/cuda)
target_compile_definitions(zoff_emu_obj PUBLIC ZOFF_HAVE_CUDA=1 ZOFF_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_compile_options(zoff_emu_obj PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-std=c++17 -Wno-unknown-pragmas>
  $<$<COMPILE_LANGUAGE:C>:-w>)
target_link_libraries(zoff_emu_obj PUBLIC PkgConfig::JANSSON PkgConfig::OPENBLAS OpenMP::OpenMP_C Threads::Threads m)

# 3. the tests
add_executable(test_ops_emu ${PROJECT_SOURCE_DIR}/tests/test_ops.c $<TARGET_OBJECTS:zoff_emu_obj>)
target_include_directories(test_ops_emu PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
  ${PROJECT_SOURCE_DIR}/tests)
target_compile_definitions(test_ops_emu PRIVATE ZOFF_HAVE_CUDA=1 ZOFF_TEST_DIR="${PROJECT_SOURCE_DIR}/tests"
  ZOFF_BINARY="/bin/false")
target_compile_options(test_ops_emu PRIVATE ${ZOFF_WARNINGS} -Wno-missing-prototypes)
target_link_libraries(test_ops_emu PRIVATE PkgConfig::JANSSON PkgConfig::OPENBLAS OpenMP::OpenMP_C
  Threads::Threads PkgConfig::CMOCKA m)
set_target_properties(test_ops_emu PROPERTIES LINKER_LANGUAGE CXX)

add_executable(emu_ptx_check ${_emu_dir}/emu_ptx_check.cpp $<TARGET_OBJECTS:zoff_emu_obj>)
target_include_directories(emu_ptx_check PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src
  ${_emu_dir}/include ${_emu_dir})
target_compile_definitions(emu_ptx_check PRIVATE ZOFF_HAVE_CUDA=1)
target_compile_options(emu_ptx_check PRIVATE -std=c++17 -Wall -Wextra)
target_link_libraries(emu_ptx_check PRIVATE PkgConfig::JANSSON PkgConfig::OPENBLAS OpenMP::OpenMP_C
  Threads::Threads m)

add_executable(emu_check ${_emu_dir}/emu_check.cpp $<TARGET_OBJECTS:zoff_emu_obj>)
target_include_directories(emu_check PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
target_compile_options(emu_check PRIVATE -std=c++17 -Wall -Wextra)
target_link_libraries(emu_check PRIVATE PkgConfig::JANSSON PkgConfig::OPENBLAS OpenMP::OpenMP_C Threads::Threads m)

add_test(NAME cuda_emu_ptx COMMAND emu_ptx_check)
# emu_check: attention at head sizes 32-128 across tile boundaries (tensor-core and fp32 kernels),
# matmuls on misaligned operands, reduction caps, determinism, asynchronous error semantics
if(ZOFF_SANITIZE STREQUAL "")
  add_test(NAME cuda_emu_check COMMAND emu_check)
  set_tests_properties(cuda_emu_check PROPERTIES TIMEOUT 600
    FAIL_REGULAR_EXPRESSION "WARNING: .*(tensor-core attention|fused residual|cuBLASLt epilogue)")
else()
  add_test(NAME cuda_emu_check COMMAND sh -c "echo 'cuda_emu_check: SKIPPED under the sanitizers (slow); ZOFF_EMU_ASAN=1 bash tests/cuda_emu/run.sh runs it'; exit 77")
  set_tests_properties(cuda_emu_check PROPERTIES SKIP_RETURN_CODE 77)
endif()
# ZOFF_CPU_KERNELS set: test_ops does not re-run itself on the portable CPU kernels
add_test(NAME cuda_emu_ops COMMAND test_ops_emu)
# auto attention mode: the start-up comparison of the tensor-core kernels with the flash kernels runs,
# and its warning (they disagree: fallback) fails the test, so the op table checks the tensor-core kernels
# (likewise the matmul epilogues' comparison with the unfused path)
set_tests_properties(cuda_emu_ops PROPERTIES TIMEOUT 900
  FAIL_REGULAR_EXPRESSION "WARNING: .*(tensor-core attention|fused residual|cuBLASLt epilogue)" ENVIRONMENT
  "CMOCKA_MESSAGE_OUTPUT=stdout;OMP_WAIT_POLICY=passive;ZOFF_CPU_KERNELS=scalar;ZOFF_TEST_OPS=${_emu_ops};ZOFF_TEST_REQUIRE_CUDA=1;ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0")
# an emulated cuBLASLt whose GELU epilogue is the erf one: the start-up comparison must warn and fall back
# to the unfused path, and the epilogue ops must still pass
add_test(NAME cuda_emu_epilogue_fallback COMMAND sh -c
  "out=$(\"$0\" 2>&1); rc=$?; printf '%s\\n' \"$out\"; printf '%s' \"$out\" | grep -q 'epilogue GEMMs .*disagree' || { echo 'cuda_emu_epilogue_fallback: no fallback warning'; exit 1; }; exit $rc"
  $<TARGET_FILE:test_ops_emu>)
set_tests_properties(cuda_emu_epilogue_fallback PROPERTIES TIMEOUT 600 ENVIRONMENT
  "CMOCKA_MESSAGE_OUTPUT=stdout;OMP_WAIT_POLICY=passive;ZOFF_CPU_KERNELS=scalar;ZOFF_TEST_OPS=matmul_gelu_fwd,matmul_gelu_bwd;ZOFF_TEST_REQUIRE_CUDA=1;EMU_LT_GELU=erf;ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0")
set_tests_properties(cuda_emu_ptx PROPERTIES TIMEOUT 300)
