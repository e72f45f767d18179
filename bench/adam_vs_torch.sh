#!/bin/bash
# zoff's host AdamW vs torch.optim.AdamW (foreach off and on) on the same sizes
# and threads: fp32 parameters, gradients and state in both (zoff mode
# fp32-grads, 28 bytes per parameter). The two run next to each other, --rounds
# times (the order alternating), because memory bandwidth drifts; the ratio is
# taken of each round's pair and reported as the median with its min and max by
# `zoff bench pairs` (the statistics every zoff bench uses), which also says when
# the rounds spread too wide for the median to mean much.
#
# usage: bench/adam_vs_torch.sh [--zoff BIN] [--params N] [--threads T] [--rounds R]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
zoff=${ZOFF:-$here/../build/zoff}
params=100M
threads=$(nproc)
rounds=5
while [ $# -gt 0 ]; do
    case "$1" in
        --zoff) zoff=$2; shift 2 ;;
        --params) params=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "adam_vs_torch.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -x "$zoff" ] || { echo "adam_vs_torch.sh: $zoff is not built (cmake --build build)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
zoff_round() {
    "$zoff" bench adam --params "$params" --threads "$threads" --mode fp32-grads --iters 3 --repeats 1 --json \
        > "$tmp/zoff_$1.json"
}
torch_round() {
    /usr/bin/python3 "$here/bench_torch_adam.py" --params "$params" --threads "$threads" --iters 3 --repeats 1 --json \
        > "$tmp/torch_$1.json"
}
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then zoff_round "$r"; torch_round "$r"; else torch_round "$r"; zoff_round "$r"; fi
done
field() { # file-prefix python-expression-on-d -> one value per round
    for r in $(seq 1 "$rounds"); do
        /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$tmp/$1_$r.json"
    done
}
field zoff 'd["modes"][0]["params_per_s"]' > "$tmp/z"
field torch 'd["for_loop"]["params_per_s"]' > "$tmp/tl"
field torch 'd["foreach"]["params_per_s"]' > "$tmp/tf"
paste -d' ' "$tmp/z" "$tmp/tl" | "$zoff" bench pairs > "$tmp/loop.json"
paste -d' ' "$tmp/z" "$tmp/tf" | "$zoff" bench pairs > "$tmp/foreach.json"
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
z = [json.load(open(f"{d}/zoff_{r}.json")) for r in range(1, rounds + 1)]
t = [json.load(open(f"{d}/torch_{r}.json")) for r in range(1, rounds + 1)]
lp, fe = json.load(open(f"{d}/loop.json")), json.load(open(f"{d}/foreach.json"))
zb = statistics.median(x["modes"][0]["pct_of_bound"] for x in z)
print(f"params {z[0]['params']}, threads {z[0]['threads']}, {rounds} rounds of pairs next to each other; "
      f"zoff simd {z[0]['simd']}, torch {t[0]['torch']}")
zp = lp["a_median"]
print(f"  zoff AdamW (fp32 grads)     {zp:.4g} params/s  ({zp * 28e-9:.2f} GB/s, {zb:.1f}% of the in-place bound)")
for name, p in (("foreach=False", lp), ("foreach=True ", fe)):
    print(f"  torch AdamW {name}   {p['b_median']:.4g} params/s  -> zoff is {p['ratio_median']:.2f}x "
          f"(paired rounds: {p['ratio_min']:.2f}..{p['ratio_max']:.2f})")
    if not p["steady"]:
        print(f"    {p['verdict']}")
PY
