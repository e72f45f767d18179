#!/bin/bash
# zoff's host AdamW vs torch.optim.AdamW (foreach off and on) on the same sizes
# and threads: fp32 parameters, gradients and state in both (zoff mode
# fp32-grads, 28 bytes per parameter). The two run alternately, --rounds times,
# and the ratio is taken of the medians, because memory bandwidth drifts.
#
# usage: bench/adam_vs_torch.sh [--zoff BIN] [--params N] [--threads T] [--rounds R]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
zoff=${ZOFF:-$here/../build/zoff}
params=100M
threads=$(nproc)
rounds=3
while [ $# -gt 0 ]; do
    case "$1" in
        --zoff) zoff=$2; shift 2 ;;
        --params) params=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
        *) echo "adam_vs_torch.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -x "$zoff" ] || { echo "adam_vs_torch.sh: $zoff is not built (cmake --build build)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
    "$zoff" bench adam --params "$params" --threads "$threads" --mode fp32-grads --iters 3 --repeats 3 --json \
        > "$tmp/zoff_$r.json"
    /usr/bin/python3 "$here/bench_torch_adam.py" --params "$params" --threads "$threads" --iters 3 --repeats 3 --json \
        > "$tmp/torch_$r.json"
done
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
z = [json.load(open(f"{d}/zoff_{r}.json")) for r in range(1, rounds + 1)]
t = [json.load(open(f"{d}/torch_{r}.json")) for r in range(1, rounds + 1)]
zp = statistics.median(x["modes"][0]["params_per_s"] for x in z)
zb = statistics.median(x["modes"][0]["pct_of_bound"] for x in z)
tl = statistics.median(x["for_loop"]["params_per_s"] for x in t)
tf = statistics.median(x["foreach"]["params_per_s"] for x in t)
print(f"params {z[0]['params']}, threads {z[0]['threads']}, {rounds} alternating rounds (medians); "
      f"zoff simd {z[0]['simd']}, torch {t[0]['torch']}")
print(f"  zoff AdamW (fp32 grads)     {zp:.4g} params/s  ({zp * 28e-9:.2f} GB/s, {zb:.1f}% of the in-place bound)")
print(f"  torch AdamW foreach=False   {tl:.4g} params/s  -> zoff is {zp / tl:.2f}x")
print(f"  torch AdamW foreach=True    {tf:.4g} params/s  -> zoff is {zp / tf:.2f}x")
PY
