#!/usr/bin/env bash
# `zoff bench step --json` on the CPU backend, a small shape: one valid JSON object
# with the four configurations, each with its components and host_hidden (null for
# the device optimizer, a fraction in [0, 1] with offload), and the same losses
# are not its business (tests/test_engine.c). Timings are not checked (a benchmark,
# not a timed test). Usage: cli_bench_step.sh ZOFF SRCDIR
set -u
ZOFF="$1"
out=$("$ZOFF" bench step --device cpu --num-layers 2 --hidden-size 64 --vocab-size 512 --seq-length 32 \
      --micro-batch-size 2 --iters 3 --rounds 1 --json 2>/dev/null)
rc=$?
if [ $rc -ne 0 ]; then echo "FAIL - exit $rc: $out"; exit 1; fi
if /usr/bin/python3 - "$out" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
c = d["configs"]
assert list(c) == ["device-optimizer", "offload", "offload+delayed", "offload+speculative"], list(c)
assert c["device-optimizer"]["host_hidden"] is None, c["device-optimizer"]
for k in ("offload", "offload+delayed", "offload+speculative"):
    h = c[k]["host_hidden"]
    assert isinstance(h, float) and 0.0 <= h <= 1.0, (k, h)
    assert c[k]["host_work"] > 0 and c[k]["step"] > 0 and c[k]["forward"] > 0 and c[k]["backward"] > 0, c[k]
PY
then echo "ok   - JSON with host_hidden per config"; else echo "FAIL - JSON check: $out"; exit 1; fi
"$ZOFF" bench step --device cpu --iters 0 >/dev/null 2>&1
[ $? -eq 2 ] && echo "ok   - bad usage exits 2" || { echo "FAIL - --iters 0 should exit 2"; exit 1; }
