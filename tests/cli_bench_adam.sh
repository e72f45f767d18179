#!/usr/bin/env bash
# `zoff bench adam`: runs every mode and optimizer on a small size, prints one
# valid JSON object with --json (fields, byte counts, positive rates), and
# rejects bad usage with exit code 2. Timings are not checked (benchmarks, not
# timed tests). Usage: cli_bench_adam.sh ZOFF SRCDIR
set -u
ZOFF="$1"
pass=0; fail=0
ok() { echo "ok   - $1"; pass=$((pass + 1)); }
bad() { echo "FAIL - $1"; fail=$((fail + 1)); }

for opt in adamw adam adagrad lion; do
    out=$("$ZOFF" bench adam --params 50k --threads 2 --iters 1 --rounds 2 --optimizer "$opt" --json 2>&1)
    rc=$?
    if [ $rc -ne 0 ]; then bad "$opt: exit $rc: $out"; continue; fi
    if /usr/bin/python3 - "$opt" "$out" <<'PY'
import json, sys
opt, d = sys.argv[1], json.loads(sys.argv[2])
assert d["bench"] == "adam" and d["optimizer"] == opt and d["params"] == 50000 and d["threads"] == 2, d
names = [m["mode"] for m in d["modes"]]
assert names == ["fp32-grads", "bf16-grads+bf16-copy", "fp16-grads+fp16-copy", "bf16-states"], names
states = 2 if opt.startswith("adam") and opt != "adagrad" else 1
want = [8 + 8 * states + 4, 8 + 8 * states + 2 + 2, 8 + 8 * states + 2 + 2, 8 + 4 * states + 2 + 2]
got = [m["bytes_per_param"] for m in d["modes"]]
assert got == want, (got, want)
for m in d["modes"]:
    assert m["params_per_s"] > 0 and m["bound_params_per_s"] > 0 and m["pct_of_bound"] > 0, m
    assert abs(m["gb_per_s"] - m["params_per_s"] * m["bytes_per_param"] / 1e9) < 0.02 + 0.01 * m["gb_per_s"], m
PY
    then ok "$opt: JSON with 4 modes and their byte counts"; else bad "$opt: JSON check: $out"; fi
done

for p in scalar avx2 avx512; do
    out=$("$ZOFF" bench adam --params 20k --iters 1 --rounds 1 --simd "$p" --mode bf16-states 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then
        echo "$out" | grep -q "bf16-states" && ok "--simd $p table" || bad "--simd $p: no table: $out"
    elif [ $rc -eq 2 ] && echo "$out" | grep -q "not available"; then
        ok "--simd $p: not available on this CPU (exit 2)"
    else
        bad "--simd $p: exit $rc: $out"
    fi
done

out=$("$ZOFF" bench adam --params 20k --iters 1 --rounds 1 --latency 2>&1) && echo "$out" | grep -q "threaded us" \
    && ok "--latency table" || bad "--latency: $out"

for args in "--bogus" "--params 0" "--params 12x" "--mode nope" "--optimizer sgd" "--simd sse9" "--threads"; do
    # shellcheck disable=SC2086
    "$ZOFF" bench adam $args >/dev/null 2>&1
    rc=$?
    [ $rc -eq 2 ] && ok "bad usage '$args' -> exit 2" || bad "bad usage '$args' -> exit $rc (want 2)"
done

"$ZOFF" bench adam --help | grep -q -- "--params" && ok "--help" || bad "--help"

echo "cli_bench_adam: $pass passed, $fail failed"
[ $fail -eq 0 ]
