#!/usr/bin/env bash
# The benches' paired-round statistics (src/cli/bench_stats.c), checked against Python's
# statistics module on the same pairs, and the JSON every comparing bench prints: per
# comparison ratio_median, ratio_min, ratio_max, spread, steady and a verdict that agrees with
# them. Timings are not checked (benchmarks, not timed tests). Usage: cli_bench.sh ZOFF SRCDIR
set -u
ZOFF="$1"
W=$(mktemp -d "${TMPDIR:-/tmp}/zoff-bench-XXXXXX")
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/cli_lib.sh" # pass/fail counters, ok, bad, check

# ---- zoff bench pairs against an independent reference
pairs_case() { # name, pairs text
    printf '%s\n' "$2" > "$W/pairs.txt"
    if "$ZOFF" bench pairs < "$W/pairs.txt" > "$W/pairs.json" 2>&1 && "$PY" - "$W/pairs.txt" "$W/pairs.json" <<'PY'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
a = [float(x) for x, _ in rows]; b = [float(y) for _, y in rows]
r = [x / y for x, y in zip(a, b)]
d = json.load(open(sys.argv[2]))
close = lambda x, y: abs(x - y) <= 1e-4 * max(1.0, abs(y))
med = statistics.median(r)
assert d["rounds"] == len(r), d
assert close(d["a_median"], statistics.median(a)) and close(d["b_median"], statistics.median(b)), d
assert close(d["ratio_median"], med) and close(d["ratio_min"], min(r)) and close(d["ratio_max"], max(r)), d
spread = (max(r) - min(r)) / med
assert close(d["spread"], spread), (d, spread)
steady = len(r) >= 3 and spread <= 0.2 + 1e-9
assert d["steady"] == steady and (d["verdict"] == "") == steady, d
PY
    then ok "bench pairs: $1"; else bad "bench pairs: $1: $(cat "$W/pairs.json")"; fi
}
pairs_case "5 steady rounds (the ratio of pairs, not of medians)" "$(printf '1.0 1.0\n2.0 2.1\n3.0 2.9\n1.5 1.45\n2.2 2.3')"
pairs_case "even count, a wide spread" "$(printf '1 2\n4 2\n1 1\n3 2.5')"
pairs_case "one round: no spread measured" "0.9 1"
pairs_case "two rounds: a spread of two, still too few" "$(printf '1 1\n1.05 1')"
printf '1 1\n1.05 1\n' | "$ZOFF" bench pairs > "$W/two.json" 2>&1
check "bench pairs, two rounds: the verdict gives their range, not 'no spread, one sample'" \
    "grep -q '\"verdict\":\"only 2 rounds: their ratios go from 1 to 1.05, too few' '$W/two.json' \
     && ! grep -q 'one sample\\|no spread' '$W/two.json'"
pairs_case "comments and blank lines" "$(printf '# a b\n\n5e8 6e8\n4e8 4.1e8\n7e8 7e8')"
printf '1 2\n3\n' | "$ZOFF" bench pairs >/dev/null 2>"$W/err.txt"
[ $? -eq 2 ] && grep -q "line 2" "$W/err.txt" && ok "bench pairs: a bad line is refused naming it (exit 2)" \
    || bad "bench pairs: bad line: $(cat "$W/err.txt")"
# a ratio beyond a double (before: "ratio_max":inf, not JSON, and a spread of -1)
printf '1e308 1e-308\n2 1\n' | "$ZOFF" bench pairs >"$W/pairs.json" 2>"$W/err.txt"
[ $? -eq 2 ] && grep -q "line 1: the ratio" "$W/err.txt" && [ ! -s "$W/pairs.json" ] \
    && ok "bench pairs: a ratio that overflows is refused naming its line (exit 2)" \
    || bad "bench pairs: overflowing ratio: $(cat "$W/pairs.json" "$W/err.txt")"
# finite ratios whose median or spread go beyond a double: still JSON (no inf, nan), spread never negative
for pairs in '1.5e308 1\n1.7e308 1' '1e300 1e-5\n1e-300 1\n1e-300 1'; do
    printf "$pairs\n" | "$ZOFF" bench pairs >"$W/pairs.json" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && "$PY" -c '
import json, sys
bad = lambda c: (_ for _ in ()).throw(ValueError(c))
d = json.load(open(sys.argv[1]), parse_constant=bad)
assert d["spread"] is None or d["spread"] >= 0, d
assert d["ratio_median"] > 0 and not d["steady"], d' "$W/pairs.json" 2>"$W/err.txt"
    then ok "bench pairs: extreme ratios ($pairs): valid JSON, no negative spread"
    else bad "bench pairs: extreme ratios $pairs: rc $rc $(head -c 300 "$W/pairs.json") $(cat "$W/err.txt")"; fi
done
: | "$ZOFF" bench pairs >/dev/null 2>&1
[ $? -eq 2 ] && ok "bench pairs: no pairs: exit 2" || bad "bench pairs: no pairs"

# ---- every comparison in the benches' JSON carries the paired statistics
check_cmp() { # name, json file, python expression listing the comparison objects of d
    if "$PY" - "$2" "$3" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
cmps = eval(sys.argv[2], {"d": d})
assert cmps, "no comparisons"
for c in cmps:
    for k in ("ratio_median", "ratio_min", "ratio_max", "spread", "steady", "verdict"):
        assert k in c, (k, c)
    assert c["ratio_min"] <= c["ratio_median"] <= c["ratio_max"], c
    assert (c["verdict"] == "") == c["steady"], c
    # the JSON gives ratios to 6 significant digits: the recomputed spread carries that rounding,
    # well within (1e-4 / median) absolute plus (5e-5 / median) relative to the spread
    m = c["ratio_median"]
    tol = 2e-3 + 1e-4 / m + c["spread"] * 1e-4 / m
    assert abs(c["spread"] - (c["ratio_max"] - c["ratio_min"]) / m) < tol, c
PY
    then ok "$1"; else bad "$1: $(head -c 600 "$2")"; fi
}
if command -v fio >/dev/null; then
    "$ZOFF" bench nvme --dir "$W" --size 8MiB --block-size 256KiB --rounds 3 --json --num-layers 1 --hidden-size 32 \
        --num-attention-heads 2 --seq-length 16 --vocab-size 256 --micro-batch-size 2 --iters 1 \
        > "$W/nvme.json" 2>"$W/nvme.err" \
        && check_cmp "bench nvme --json: read, write, read+write and nvme/cpu steps paired" "$W/nvme.json" \
           '[d["io"][k] for k in ("read", "write", "read+write")] + [d["steps"]["nvme_over_cpu"]]' \
        || bad "bench nvme: $(tail -3 "$W/nvme.err")"
    [ -z "$(ls -A "$W" | grep -v '\.json$\|\.err$\|\.txt$')" ] && ok "bench nvme leaves no file in --dir" \
        || bad "bench nvme left: $(ls -A "$W")"
else
    echo "skip - bench nvme: fio not installed"
fi
# --dir is the user's folder on the disk to measure: it must exist (a mistyped mount point is an
# error, not another disk measured), and only the benchmark's own folder in it is removed afterwards
mkdir "$W/ckpt" && echo keep > "$W/ckpt/user-file"
"$ZOFF" bench ckpt --dir "$W/no-such-dir" --rounds 1 > "$W/nodir.txt" 2>&1
rc=$?
check "bench ckpt --dir missing: exit 2, named, not created" \
    "[ $rc -eq 2 ] && grep -q 'no-such-dir: no such directory' '$W/nodir.txt' && [ ! -e '$W/no-such-dir' ]"
"$ZOFF" bench nvme --dir "$W/no-such-dir" --rounds 1 > "$W/nodir.txt" 2>&1
rc=$?
check "bench nvme --dir missing: exit 2, named, not created" \
    "[ $rc -eq 2 ] && grep -q 'no-such-dir: no such directory' '$W/nodir.txt' && [ ! -e '$W/no-such-dir' ]"
# --dtype f16 is fp16 here as in bench step and export (one parser; before: "'f16' is not one of")
"$ZOFF" bench nvme --dir "$W" --dtype f16 --bf16-states > "$W/f16.txt" 2>&1
rc=$?
check "bench nvme --dtype f16: read as fp16 (then --bf16-states refused for it, exit 2)" \
    "[ $rc -eq 2 ] && grep -q 'needs --dtype bf16.*got --dtype fp16' '$W/f16.txt'"
# sizes: zoff_parse_size's units in any case (tests/test_core.c); a unit it does not read: the list, G in it
"$ZOFF" bench nvme --dir "$W" --size 8X > "$W/size.txt" 2>&1
rc=$?
check "bench nvme --size 8X: exit 2, the units listed (G among them, any case)" \
    "[ $rc -eq 2 ] && grep -q -- \"--size: invalid size unit in '8X'; the units: .*binary K, M, G, T.*any case\" '$W/size.txt'"
# too few buffers for the swapper's pipeline: a usage error said before any measuring (before: exit 1)
mkdir "$W/nvme1"
"$ZOFF" bench nvme --dir "$W/nvme1" --size 1MiB --rounds 1 --no-step --buffer-count 1 > "$W/nvme1.txt" 2>&1
rc=$?
check "bench nvme --buffer-count 1: exit 2 naming the flag and the count needed, nothing measured" \
    "[ $rc -eq 2 ] && grep -q -- '--buffer-count 1 is too few.*give --buffer-count 3 or more' '$W/nvme1.txt' \
     && [ \$(grep -c . '$W/nvme1.txt') -eq 1 ] && [ -z \"\$(ls -A '$W/nvme1')\" ]"
"$ZOFF" bench ckpt --dir "$W/ckpt" --num-layers 1 --hidden-size 32 --num-attention-heads 2 --vocab-size 256 \
    --max-position-embeddings 16 --rounds 3 --json > "$W/ckpt.json" 2>"$W/ckpt.err" \
    && check_cmp "bench ckpt --json: save, load, export, import against the bound, paired" "$W/ckpt.json" \
       '[d[k] for k in ("save", "load", "export", "import")]' \
    || bad "bench ckpt: $(tail -3 "$W/ckpt.err")"
check "bench ckpt leaves --dir as it found it (the user's file kept, its own folder gone)" \
    "[ \"\$(ls -A '$W/ckpt')\" = user-file ] && [ \"\$(cat '$W/ckpt/user-file')\" = keep ]"
"$ZOFF" bench adam --params 20k --threads 1 --iters 1 --rounds 3 --mode fp32-grads --json > "$W/adam.json" 2>&1 \
    && check_cmp "bench adam --json: each mode against the bound, paired" "$W/adam.json" 'd["modes"]' \
    || bad "bench adam: $(cat "$W/adam.json")"

# counts in the banners: one of a thing is singular, a small model's size exact (before: "1 steps x 1
# repeats", "GPT-2 1 layers", "(0.0M parameters)")
"$ZOFF" bench adam --params 20k --threads 1 --iters 1 --rounds 1 --mode fp32-grads > "$W/adam1.txt" 2>&1
check "bench adam, one of each: '1 thread', '1 step x 1 round'" \
    "grep -q '^zoff bench adam: adamw, 20000 parameters, 1 thread, simd [a-z0-9-]*, 1 step x 1 round (' '$W/adam1.txt'"
mkdir -p "$W/ck1"
"$ZOFF" bench ckpt --dir "$W/ck1" --num-layers 1 --hidden-size 32 --num-attention-heads 2 --vocab-size 256 \
    --max-position-embeddings 16 --rounds 1 > "$W/ck1.txt" 2>&1
check "bench ckpt of a 1-layer model: 'GPT-2 1 layer, width 32 (21472 parameters)', '1 round'" \
    "grep -q '^zoff bench ckpt: GPT-2 1 layer, width 32 (21472 parameters): checkpoint .*; 1 round$' '$W/ck1.txt'"
"$ZOFF" plan --num-layers 1 --hidden-size 32 --num-attention-heads 1 --vocab-size 64 --no-probe > "$W/plan1.txt" 2>&1
check "zoff plan of a 1-layer model: 'GPT-2 1 layer, ..., 1 head, ...: 18912 parameters'" \
    "grep -q '^zoff plan: GPT-2 1 layer, width 32, 1 head, seq 64, vocab 64 (padded 128): 18912 parameters, f32' '$W/plan1.txt'"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
