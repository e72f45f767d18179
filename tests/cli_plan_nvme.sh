#!/usr/bin/env bash
# zoff plan's disk check with the two swap files of stage 3 (offload_optimizer.nvme_path and
# offload_param.nvme_path) on different file systems, as on a box with two NVMe drives. Before, plan
# read the free space at the first path only and checked both files' total against it: a row
# could be said to fit when the parameters' disk was too small, or not to fit when each file had
# room on its own disk. Now each file system is checked for what it holds (two paths on one file
# system share its free space). Two small tmpfs mounts of known sizes in a private mount namespace
# (skipped where that is not allowed); the expected verdicts come from df's free space and the
# row's own file sizes. Usage: cli_plan_nvme.sh ZOFF SRCDIR
set -u
ZOFF=$(readlink -f "$1"); SRC=$(readlink -f "$2")
. "$SRC/tests/cli_lib.sh"
W=$(mktemp -d /tmp/zoff-cli-plannvme-XXXXXX)
trap 'rm -rf "$W"' EXIT; [ -n "${KEEP:-}" ] && trap - EXIT
cd "$W" || exit 1
if [ "$(id -u)" -ne 0 ] || ! unshare --mount true 2>/dev/null; then
  echo "skip - zoff plan with two swap disks: no private mount namespace here (needs root)"; exit 77
fi

# inner.sh SIZE_A SIZE_B OPT_DIR PARAM_DIR NAME: mounts a (SIZE_A) and b (SIZE_B), plans a stage 3
# config with the swap files at OPT_DIR and PARAM_DIR (relative to $W), writes NAME.json (plan --json),
# NAME.txt (the table) and NAME.df (df's free bytes of a and b), unmounts
cat > inner.sh <<'INNER'
set -u
ZOFF="$1"; A="$2"; B="$3"; OD="$4"; PD="$5"; NAME="$6"
mkdir -p a b
mount -t tmpfs -o "size=$A" tmpfs a 2>/dev/null || exit 77
if ! mount -t tmpfs -o "size=$B" tmpfs b 2>/dev/null; then umount a; exit 77; fi
printf '{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3, "sub_group_size": 8000,
 "offload_optimizer": {"device": "nvme", "nvme_path": "%s"},
 "offload_param": {"device": "nvme", "nvme_path": "%s", "max_in_cpu": 0}}}' "$PWD/$OD" "$PWD/$PD" > "$NAME.cfg"
P=(plan --config "$NAME.cfg" --num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16
   --vocab-size 256 --device cpu --no-probe)
"$ZOFF" "${P[@]}" --json > "$NAME.json" 2>"$NAME.err"; echo "$?" > "$NAME.rc"
"$ZOFF" "${P[@]}" > "$NAME.txt" 2>&1
echo "$(df -B1 --output=avail a | tail -1) $(df -B1 --output=avail b | tail -1)" > "$NAME.df"
umount a b
INNER

# expect NAME SHARED: every row's fits_detail.disk against df's free space, with the 10% margin:
# one file system (SHARED=1) holds optimizer + parameters; two hold one file each
expect() {
  "$PY" - "$1" "$2" <<'PY'
import json, sys
name, shared = sys.argv[1], sys.argv[2] == "1"
fa, fb = (int(x) for x in open(name + ".df").read().split())
keep = lambda f: int(f * (1 - 0.1))
bad, n = [], 0
for r in json.load(open(name + ".json"))["rows"]:
    o, p = r["breakdown"]["disk_optimizer"], r["breakdown"]["disk_params"]
    want = o + p <= keep(fa) if shared else (o <= keep(fa) and p <= keep(fb))
    n += o + p > 0
    if r["fits_detail"]["disk"] != want:
        bad.append("row %d (stage %d %s+p:%s ratio %s: optimizer %d, params %d): plan %s, expected %s" % (
            r["index"], r["stage"], r["offload"], r["param_offload"], r["ratio"], o, p, r["fits_detail"]["disk"], want))
print("; ".join(bad[:3]) if bad else "ok %d rows with swap files" % n)
PY
}
# the config's own row (stage 3, nvme + p:nvme, ratio 1, the config's sub_group_size): fits_detail.disk
own_row() { "$PY" -c 'import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["stage"] == 3 and r["offload"] == "nvme"
        and r["param_offload"] == "nvme" and r["ratio"] == 1 and not r["sub_group_size_changed"]]
print("%s %s" % (rows[0]["fits_detail"]["disk"], rows[0]["why"]) if rows else "none")' "$1.json"; }

run() { unshare --mount bash inner.sh "$ZOFF" "$@"; }

# 1. the optimizer's disk has room for its file but not for both; the parameters' disk has plenty:
#    the config's own row fits (before: "no:disk", both files counted against the first disk)
run 512K 64M a/o b/p split1; rc=$?
[ $rc -eq 77 ] && { echo "skip - zoff plan with two swap disks: cannot mount tmpfs here"; exit 77; }
check "two file systems, the optimizer's one small: plan --json exits 0, both disks in 'machine'" \
  "[ \"\$(cat split1.rc)\" = 0 ] && \"\$PY\" -c 'import json, sys; m = json.load(open(\"split1.json\"))[\"machine\"]; sys.exit(not (m[\"param_disk_own\"] and m[\"disk_path\"].endswith(\"/a/o\") and m[\"param_disk_path\"].endswith(\"/b/p\") and m[\"param_disk_bytes\"] > m[\"disk_bytes\"] > 0))'" \
  || cat split1.err
got=$(expect split1 0)
check "... every row's disk verdict is per file system (df's free space) ($got)" "[ '${got%% *}' = ok ]"
check "... the config's own row fits the disks (before: no, its two files checked against the small one)" \
  "[ \"\$(own_row split1)\" = 'True ' ]"
check "... the text names both disks and their free space" \
  "grep -q 'disk 512.00 KiB free at .*/a/o (optimizer), 64.00 MiB free at .*/b/p' split1.txt"

# 2. the optimizer's disk is large, the parameters' too small for their file: not a fit
#    (before: "yes", the parameters' disk never looked at)
run 64M 128K a/o b/p split2
got=$(expect split2 0)
check "two file systems, the parameters' one too small: every row's disk verdict per file system ($got)" "[ '${got%% *}' = ok ]"
check "... the config's own row does not fit, and why says the parameter disk" \
  "[ \"\$(own_row split2)\" = 'False parameter disk 144.00 KiB > 115.20 KiB' ]"

# 3. both paths on one file system: its free space shared by the two files
run 512K 64M a/o a/p same
got=$(expect same 1)
check "two paths on one file system: both files checked together against its free space ($got)" \
  "[ '${got%% *}' = ok ] && [ \"\$(own_row same)\" = 'False disk 568.00 KiB > 460.80 KiB' ] && \"\$PY\" -c 'import json, sys; sys.exit(json.load(open(\"same.json\"))[\"machine\"][\"param_disk_own\"])'"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
