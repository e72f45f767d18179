#!/usr/bin/env bash
# The compiled tensor-core attention kernels use tensor-core instructions: the SASS of
# cuda_attention_mma.cu's object holds HMMA (mma.sync), LDSM (ldmatrix) and LDGSTS
# (cp.async) for sm_90 (and sm_80 when built), and its PTX mma.sync.aligned.m16n8k16.
#
#   bash tests/cuda_sass_check.sh "OBJECT;OBJECT;..."   (ctest passes $<TARGET_OBJECTS:zoff_obj>)
#
# Without cuobjdump (some toolkits ship nvcc alone) it checks the PTX text the object embeds.
# Exit 0: found; 1: missing (with what is missing).
set -uo pipefail
obj=""
IFS=';' read -ra objs <<< "${1:-}"
for o in "${objs[@]}"; do
  case "$o" in *cuda_attention_mma.cu.o) obj=$o ;; esac
done
if [ -z "$obj" ] || [ ! -f "$obj" ]; then
  echo "cuda_sass_check: no object of cuda_attention_mma.cu among the arguments (got: ${1:-nothing})"
  exit 1
fi
# check TEXT KERNEL INSTRUCTION...: each instruction occurs in the kernel's part of TEXT, where a
# kernel's part starts at a line naming it ("Function : name" in SASS, ".entry name" in PTX)
fail=0
check() {
  local text=$1 start=$2; shift 2
  for kernel in mma_fwd_kernel mma_bwd_dkdv_kernel mma_bwd_dq_kernel; do
    body=$(echo "$text" | awk -v k="$kernel" -v s="$start" 'index($0, s) {on = index($0, k) > 0} on')
    if [ -z "$body" ]; then echo "cuda_sass_check: $kernel not found in $obj"; fail=1; continue; fi
    for ins in "$@"; do
      n=$(echo "$body" | grep -c -- "$ins")
      if [ "$n" -eq 0 ]; then echo "cuda_sass_check: $kernel: no $ins"; fail=1
      else echo "cuda_sass_check: $kernel: $n lines with $ins"; fi
    done
  done
}
CUOBJDUMP=$(command -v cuobjdump || true)
[ -z "$CUOBJDUMP" ] && [ -x /usr/local/cuda/bin/cuobjdump ] && CUOBJDUMP=/usr/local/cuda/bin/cuobjdump
if [ -n "$CUOBJDUMP" ]; then
  echo "cuda_sass_check: SASS of $obj ($CUOBJDUMP -sass)"
  sass=$("$CUOBJDUMP" -sass "$obj" 2>&1) || { echo "cuda_sass_check: cuobjdump -sass failed:"; echo "$sass" | head; exit 1; }
  check "$sass" "Function :" HMMA.16816.F32 LDSM LDGSTS
else
  # no cuobjdump in this toolkit: the PTX the object embeds (compute_80, as text); ptxas turns
  # mma.sync into HMMA, ldmatrix into LDSM, cp.async into LDGSTS
  echo "cuda_sass_check: cuobjdump not found; checking the PTX embedded in $obj instead of SASS"
  ptx=$(strings -n 4 "$obj" | grep -E "\.entry|mma\.sync|ldmatrix|cp\.async")
  if ! grep -q "\.entry" <<< "$ptx"; then
    echo "cuda_sass_check: no PTX text in $obj (compressed fatbin?); install cuobjdump (cuda-cuobjdump) to check SASS"
    exit 1
  fi
  check "$ptx" ".entry" "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" \
    "ldmatrix.sync.aligned.m8n8.x4.shared.b16" "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" "cp.async.cg.shared.global"
fi
[ "$fail" = 0 ] && echo "cuda_sass_check: tensor-core instructions present" || echo "cuda_sass_check: FAILED"
exit $fail
