#!/usr/bin/env bash
# NVMe offload as a user with a shared scratch disk meets it: the swap files' folder (nvme_path)
# missing or unusable, a disk too small for them, a name already taken there. Each failure exits
# with the right code, says what and where and what to do, and leaves nothing behind.
# The full-disk checks mount a small tmpfs in a private mount namespace (skipped where that is
# not allowed). Usage: cli_nvme.sh ZOFF SRCDIR
set -u
ZOFF=$(readlink -f "$1"); SRC=$(readlink -f "$2") # the checks run in their own folder
. "$SRC/tests/cli_lib.sh"
W=$(mktemp -d /tmp/zoff-cli-nvme-XXXXXX)
trap "rm -rf \"$W\"" EXIT; [ -n "${KEEP:-}" ] && trap - EXIT
byte_corpus "$SRC" "$W"
cd "$W" || exit 1
TINY=(--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 4
      --tokenizer byte --data-path corpus_train.bin --val-path corpus_val.bin --eval-iters 0
      --train-iters 2 --no-checkpoint)
nvme_cfg() { # FILE OPT_PATH [PARAM_PATH]: stage 2 (stage 3 with offload_param nvme at PARAM_PATH)
  if [ $# -ge 3 ]; then
    printf '{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3, "sub_group_size": 8000,
 "offload_optimizer": {"device": "nvme", "nvme_path": "%s"},
 "offload_param": {"device": "nvme", "nvme_path": "%s", "max_in_cpu": 0}}}' "$2" "$3" > "$1"
  else
    printf '{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2, "sub_group_size": 8000,
 "offload_optimizer": {"device": "nvme", "nvme_path": "%s"}}}' "$2" > "$1"
  fi
}

# 1. Stage 3 with the optimizer's and the parameters' swap files on one disk that holds neither
#    both: the second file's reservation fails while the first holds its space. Before, the message
#    said only "needs 144 KiB (76 KiB free)", and once zoff had exited df showed 500 KiB free: more
#    than "needed". Now it also says what the run's other swap file holds and the total needed.
cat > inner_full.sh <<'INNER'
set -u
ZOFF="$1"; shift; mkdir -p m; mount -t tmpfs -o size=500k tmpfs m || exit 77
"$ZOFF" train "$@" --quiet --config s3.json >/dev/null 2>s3err.txt; echo "rc=$?"
echo "left=$(find m -type f | wc -l)"
umount m
INNER
nvme_cfg s3.json "$W/m/o" "$W/m/p"
if unshare --user --map-root-user --mount true 2>/dev/null; then NS=(unshare --user --map-root-user --mount)
elif [ "$(id -u)" -eq 0 ] && unshare --mount true 2>/dev/null; then NS=(unshare --mount)
else NS=(); fi
out=""; rc=77
if [ ${#NS[@]} -gt 0 ]; then out=$("${NS[@]}" bash inner_full.sh "$ZOFF" "${TINY[@]}" 2>&1); rc=$?; fi
if [ $rc -eq 77 ]; then echo "skip - swap files on a really full disk: cannot mount a tmpfs here"
else
  # the sizes from the run's own log line on a roomy disk (zoff_swapper / stage 3's describe)
  mkdir -p big; nvme_cfg s3big.json "$W/big/o" "$W/big/p"
  "$ZOFF" train "${TINY[@]}" --config s3big.json > big.txt 2>&1 || bad "stage 3 nvme on a roomy disk trains"
  opt=$(grep -o 'zoff-optimizer-[0-9]*-[0-9]*\.swp ([0-9.]* KiB' big.txt | head -1 | sed 's/.*(//; s/ KiB//')
  par=$(grep -o 'zoff-param-[0-9]*-[0-9]*\.swp ([0-9.]* KiB' big.txt | head -1 | sed 's/.*(//; s/ KiB//')
  all=$(awk -v a="$opt" -v b="$par" 'BEGIN { printf "%.2f", a + b }')
  check "stage 3, both swap files on a 500 KiB disk: exit 1, nothing left there" \
    "echo '$out' | grep -q '^rc=1$' && echo '$out' | grep -q '^left=0$'" || echo "$out"
  check "... the message says the other swap file holds ${opt} KiB there: ${all} KiB needed in all" \
    "[ -n '$opt' ] && [ -n '$par' ] && grep -q \"disk full: swap file .*/m/p/zoff-param-[0-9]*-0.swp needs ${par} KiB (.* free in .*/m/p; this process's other swap file there already holds ${opt} KiB: ${all} KiB needed in all)\" s3err.txt" \
    || cat s3err.txt big.txt
fi

# 2. nvme_path whose parent folder is missing (a typo, a scratch disk not mounted): zoff creates only
#    the last folder. Before: "cannot create ... nvme_path X: No such file or directory", exit 2,
#    without saying which folder is missing or what to do. Now the parent is named, with the fix.
nvme_cfg miss.json "$W/no/such/swap"
"$ZOFF" train "${TINY[@]}" --quiet --config miss.json >/dev/null 2>err.txt
check "offload_optimizer.nvme_path under a missing folder: exit 2, the missing parent and mkdir -p named" \
  "[ \$? -eq 2 ] && grep -q \"cannot create zero_optimization.offload_optimizer.nvme_path $W/no/such/swap: its parent folder $W/no/such does not exist .*: create it (mkdir -p $W/no/such/swap) or correct the path\" err.txt && [ ! -e no ]" \
  || cat err.txt
mkdir -p ok; nvme_cfg miss3.json "$W/ok" "$W/no/such/pswap"
"$ZOFF" train "${TINY[@]}" --quiet --config miss3.json >/dev/null 2>err.txt
check "offload_param.nvme_path under a missing folder: exit 2, the same message for its key, nothing left" \
  "[ \$? -eq 2 ] && grep -q \"cannot create zero_optimization.offload_param.nvme_path $W/no/such/pswap: its parent folder $W/no/such does not exist\" err.txt && [ ! -e no ] && [ -z \"\$(ls -A ok)\" ]"

# 3. zoff bench nvme on a shared scratch disk: fio's file had one fixed name in --dir
#    (zoff-bench-fio.dat), so a second benchmark there measured on the first one's file and removed
#    it at its end (or any file of that name). Now the name carries the pid; another's file stays.
if command -v fio >/dev/null 2>&1; then
  mkdir scratch && printf 'another benchmark file' > scratch/zoff-bench-fio.dat
  "$ZOFF" bench nvme --dir scratch --size 1MiB --block-size 256KiB --rounds 1 --no-step >out.txt 2>&1
  check "bench nvme beside another's zoff-bench-fio.dat: exit 0, that file unchanged, nothing of its own left" \
    "[ \$? -eq 0 ] && [ \"\$(cat scratch/zoff-bench-fio.dat 2>/dev/null)\" = 'another benchmark file' ] && [ \"\$(ls -A scratch)\" = zoff-bench-fio.dat ]" \
    || tail -3 out.txt
  # ... and a file of a killed benchmark (SIGKILL: no handler removes it) is said at start, kept
  sleep 0 & dead=$!; wait $dead
  printf 'left' > "scratch/zoff-bench-fio-$dead.dat"
  "$ZOFF" bench nvme --dir scratch --size 1MiB --block-size 256KiB --rounds 1 --no-step >out.txt 2>&1
  check "bench nvme beside a killed benchmark's fio file: a note names it, its size, the dead pid, and keeps it" \
    "[ \$? -eq 0 ] && grep -q \"note: scratch/zoff-bench-fio-$dead.dat (4 B) is left by a benchmark that was killed (no process $dead runs here): remove it, unless\" out.txt && [ -f scratch/zoff-bench-fio-$dead.dat ]" \
    || tail -3 out.txt
  # ... and a file of the very name this benchmark takes (zoff-bench-fio-<pid>.dat), left by an older
  #     process with the same pid (a container where zoff is pid 1; hosts sharing the disk): before,
  #     fio wrote over it and the benchmark removed it at its end. Now it takes the next free name
  #     and the file found is noted and kept as it was. zoff runs as pid 1 in a pid namespace.
  if unshare --fork --pid --mount-proc true 2>/dev/null; then
    mkdir pid1 && printf 'an older pid 1 benchmark' > pid1/zoff-bench-fio-1.dat
    unshare --fork --pid --mount-proc "$ZOFF" bench nvme --dir pid1 --size 1MiB --block-size 256KiB --rounds 1 --no-step >out.txt 2>&1
    check "bench nvme as pid 1 beside an older pid 1's zoff-bench-fio-1.dat: exit 0, that file unchanged, nothing of its own left" \
      "[ \$? -eq 0 ] && [ \"\$(cat pid1/zoff-bench-fio-1.dat 2>/dev/null)\" = 'an older pid 1 benchmark' ] && [ \"\$(ls -A pid1)\" = zoff-bench-fio-1.dat ]" \
      || tail -3 out.txt
    check "... a note names it with its size and says the next name is used" \
      "grep -q 'note: pid1/zoff-bench-fio-1.dat (24 B) is left by an older benchmark with this process.s id 1 .*kept, this benchmark uses the next free name' out.txt"
  else echo "skip - bench nvme beside an older same-pid fio file: no pid namespace here (unshare --pid)"; fi
else echo "skip - bench nvme beside another's fio file: fio not installed"; fi

# 4. Two ranks on one host, nvme_path on a disk that holds one rank's swap file, not both: each
#    rank reserves its own and the later one (or both, racing) fails. Before, a rank said only
#    "needs 220 KiB (96 KiB free)" or even "needs 220 KiB (300 KiB free)" (the other rank's
#    reservation gone by then); now it says every rank on the host reserves its own and the total.
if command -v mpirun >/dev/null 2>&1 && "$ZOFF" version | grep -q '^mpi: built' && [ ${#NS[@]} -gt 0 ]; then
  cat > inner_mpi.sh <<'INNER'
set -u
ZOFF="$1"; shift; mkdir -p m; mount -t tmpfs -o size=300k tmpfs m || exit 77
timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader \
  --mca btl_vader_single_copy_mechanism none -x ZOFF_THREADS=1 -x OMP_NUM_THREADS=1 -x ZOFF_COMM_TIMEOUT=60 \
  -np 2 "$ZOFF" train "$@" --quiet --config mpi.json >/dev/null 2>mpierr.txt; echo "rc=$?"
echo "left=$(find m -type f | wc -l)"
umount m
INNER
  nvme_cfg mpi.json "$W/m/o"
  out=$("${NS[@]}" bash inner_mpi.sh "$ZOFF" "${TINY[@]}" 2>&1); rc=$?
  if [ $rc -eq 77 ]; then echo "skip - two ranks on a full disk: cannot mount a tmpfs here"
  else
    check "2 ranks, one disk too small for both swap files: exit 1, nothing left there" \
      "echo '$out' | grep -q '^rc=1$' && echo '$out' | grep -q '^left=0$'" || echo "$out"
    check "... the message says each of the 2 ranks on this host reserves its own, and the total" \
      "grep -q 'disk full: swap file .*/m/o/zoff-optimizer-[0-9]*-0.swp needs [0-9.]* KiB (.* free in .*/m/o; each of the 2 ranks on this host reserves its own: about 2 x [0-9.]* KiB = [0-9.]* KiB there)' mpierr.txt" \
      || cat mpierr.txt
  fi
else echo "skip - two ranks on a full disk: zoff built without MPI, no mpirun, or no mount namespace"; fi

# 5. A swap file in nvme_path of a zoff that is gone (an older zoff killed with SIGKILL before swap
#    files were unlinked at open, or one killed between create and unlink): it held 12 B per
#    parameter for ever and nothing said so. Now a note at start names it with its size; it is kept
#    (zoff removes nothing it did not create) and the run trains beside it.
sleep 0 & dead=$!; wait $dead
mkdir -p stale && head -c 5000 /dev/zero > "stale/zoff-optimizer-$dead-0.swp"
nvme_cfg stale.json "$W/stale"
"$ZOFF" train "${TINY[@]}" --config stale.json >out.txt 2>&1
check "a dead zoff's swap file in nvme_path: exit 0, a note naming it, its size and the pid; kept, nothing else left" \
  "[ \$? -eq 0 ] && grep -q \"note: $W/stale/zoff-optimizer-$dead-0.swp (4.88 KiB) is a swap file of a zoff that is no longer running (no process $dead here): .*remove it\" out.txt && [ \"\$(ls -A stale)\" = zoff-optimizer-$dead-0.swp ]" \
  || tail -3 out.txt

# 5b. The same name as this run's (zoff-<stem>-<pid>-<n>.swp) left by an older process with the same
#     pid: a container where zoff is always pid 1, hosts sharing an nvme_path over NFS. Before, the
#     run failed ("cannot create .../zoff-optimizer-1-0.swp: File exists"); now it takes the next
#     free name, the note names the old file, and the old file is kept as it was. zoff runs as pid 1
#     in a new pid namespace (skipped where that is not allowed).
if unshare --fork --pid --mount-proc true 2>/dev/null; then
  mkdir -p same/o same/p && head -c 5000 /dev/zero > same/o/zoff-optimizer-1-0.swp && head -c 3000 /dev/zero > same/p/zoff-param-1-0.swp
  nvme_cfg same.json "$W/same/o" "$W/same/p"
  unshare --fork --pid --mount-proc "$ZOFF" train "${TINY[@]}" --config same.json >out.txt 2>&1
  rc5b=$?; cp out.txt out5b.txt
  check "pid 1 with an older pid 1's swap files in both nvme_paths (stage 3): the run trains (exit 0) on the next names" \
    "[ $rc5b -eq 0 ] && grep -q 'trained 2 steps' out.txt && grep -q 'same/o/zoff-optimizer-1-1.swp' out.txt && grep -q 'same/p/zoff-param-1-1.swp' out.txt" \
    || tail -3 out.txt
  check "... a note names each old file with its size and says to remove it" \
    "grep -q \"note: $W/same/o/zoff-optimizer-1-0.swp (4.88 KiB) is a swap file left by an older zoff with this process's id 1.*remove it\" out.txt && grep -q \"note: $W/same/p/zoff-param-1-0.swp (2.93 KiB) is a swap file left by an older zoff\" out.txt"
  check "... the old files kept as they were, nothing else left" \
    "[ \"\$(ls -A same/o)\" = zoff-optimizer-1-0.swp ] && [ \"\$(ls -A same/p)\" = zoff-param-1-0.swp ] && [ \$(stat -c %s same/o/zoff-optimizer-1-0.swp) -eq 5000 ] && [ \$(stat -c %s same/p/zoff-param-1-0.swp) -eq 3000 ]"
else echo "skip - a swap file name taken by an older process of the same pid: no pid namespace here (unshare --pid)"; fi

# 5c. A swap file of an older process with this pid but another <n> (zoff-optimizer-1-7.swp beside a
#     run as pid 1): its name is not the one this run takes, so it was never tried. Before, it got no
#     note at all (the folder's note skipped every file of this pid, the name-taken note saw only
#     the names tried); now the note names it as an older same-pid process's. Kept as it was.
if unshare --fork --pid --mount-proc true 2>/dev/null; then
  mkdir -p samen && head -c 5000 /dev/zero > samen/zoff-optimizer-1-7.swp
  nvme_cfg samen.json "$W/samen"
  unshare --fork --pid --mount-proc "$ZOFF" train "${TINY[@]}" --config samen.json >out.txt 2>&1
  check "pid 1 beside an older pid 1's zoff-optimizer-1-7.swp: exit 0 on -0, a note names it with its size (before: none), kept" \
    "[ \$? -eq 0 ] && grep -q 'samen/zoff-optimizer-1-0.swp' out.txt && grep -q \"note: $W/samen/zoff-optimizer-1-7.swp (4.88 KiB) is a swap file left by an older zoff with this process's id 1.*remove it\" out.txt && [ \"\$(ls -A samen)\" = zoff-optimizer-1-7.swp ] && [ \$(stat -c %s samen/zoff-optimizer-1-7.swp) -eq 5000 ]" \
    || tail -3 out.txt
  check "... and one note per old file in 5b's folders (the taken name is not named twice)" \
    "[ \$(grep -c 'note: .*same/o/zoff-optimizer-1-0.swp' out5b.txt) -eq 1 ] && [ \$(grep -c 'note: .*same/p/zoff-param-1-0.swp' out5b.txt) -eq 1 ]"
else echo "skip - a swap file of an older same-pid process with another number: no pid namespace here (unshare --pid)"; fi

# 6. A swap file larger than the free space of an ext4 disk (a loop-mounted image, skipped where
#    that cannot be mounted): ext4 keeps what a failed fallocate got, so the message said
#    "needs 18.88 MiB (0 B free ...)" while df showed 5.86 MiB free before and after. Now the partial
#    reservation is given back first and the free space said is df's.
cat > inner_ext4.sh <<'INNER'
set -u
ZOFF="$1"; shift
command -v mkfs.ext4 >/dev/null 2>&1 || exit 77
truncate -s 8M ext4.img && mkfs.ext4 -q -F ext4.img >/dev/null 2>&1 || exit 77
mkdir -p e; mount -o loop ext4.img e 2>/dev/null || exit 77
"$ZOFF" train "$@" --quiet --hidden-size 256 --config ext4.json >/dev/null 2>ext4err.txt; echo "rc=$?"
echo "avail_kib=$(df -k e | awk 'NR == 2 { print $4 }')"
echo "left=$(find e/o -type f 2>/dev/null | wc -l)"
umount e
INNER
nvme_cfg ext4.json "$W/e/o"
out=""; rc=77
if [ "$(id -u)" -eq 0 ] && unshare --mount true 2>/dev/null; then
  out=$(unshare --mount bash inner_ext4.sh "$ZOFF" "${TINY[@]}" 2>&1); rc=$?
fi
if [ $rc -eq 77 ]; then echo "skip - swap file on a small ext4 disk: cannot mount a loop device here"
else
  free=$(echo "$out" | sed -n 's/^avail_kib=//p' | awk '{ printf "%.2f MiB", $1 / 1024 }')
  check "swap file larger than a small ext4 disk: exit 1, nothing left there" \
    "echo '$out' | grep -q '^rc=1$' && echo '$out' | grep -q '^left=0$'" || echo "$out"
  check "... the free space said is df's ($free), not what the failed reservation left" \
    "grep -q \"disk full: swap file .*/e/o/zoff-optimizer-[0-9]*-0.swp needs [0-9.]* MiB ($free free in .*/e/o)\" ext4err.txt" \
    || cat ext4err.txt
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
