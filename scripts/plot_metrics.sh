#!/usr/bin/env bash
# Draw a training run's loss curve and per-step time breakdown as PNG.
#   bash scripts/plot_metrics.sh out/gpt2-small [OUTDIR]
# Reads DIR/metrics.jsonl (written by zoff train); writes OUTDIR/loss.png and
# OUTDIR/breakdown.png (OUTDIR defaults to DIR). Needs gnuplot (gnuplot-nox).
set -euo pipefail
dir="${1:?usage: plot_metrics.sh RUN_DIR [OUTDIR]}"
out="${2:-$dir}"
metrics="$dir/metrics.jsonl"
[ -f "$metrics" ] || { echo "plot_metrics: $metrics not found (run zoff train --save $dir first)" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "plot_metrics: gnuplot not found: apt-get install gnuplot-nox" >&2; exit 2; }
mkdir -p "$out"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# JSON lines -> whitespace columns (python3's json module only: no extra packages). A resumed run
# appends to metrics.jsonl from its checkpoint's step S (its start line: {"step":S,"startup_time":..}),
# so the steps after S that an earlier start logged (trained past its last checkpoint, or a resume
# of an older step) are not this run's: each start drops them; one point per step, in step order.
python3 - "$metrics" "$tmp" <<'PY'
import json, sys
src, tmp = sys.argv[1], sys.argv[2]
keys = ["forward", "backward", "wait_grads", "host_step", "device_step", "wait_weights", "other"]
steps, vals = {}, {}
with open(src) as f:
    for line in f:
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        if "startup_time" in r:
            for d in (steps, vals):
                for k in [k for k in d if k > r["step"]]:
                    del d[k]
        if "val_loss" in r:
            vals[r["step"]] = f"{r['step']} {r['val_loss']}\n"
        elif "loss" in r:
            steps[r["step"]] = " ".join(str(x) for x in [r["step"], r["loss"], r.get("step_time", 0)] +
                                        [r.get(k, 0) for k in keys]) + "\n"
with open(tmp + "/steps.dat", "w") as s, open(tmp + "/val.dat", "w") as v:
    s.write("".join(steps[k] for k in sorted(steps)))
    v.write("".join(vals[k] for k in sorted(vals)))
PY
gnuplot <<GP
set terminal pngcairo size 900,500
set output "$out/loss.png"
set title "zoff train: loss ($dir)"
set xlabel "step"; set ylabel "loss"; set grid
plot "$tmp/steps.dat" using 1:2 with lines title "train loss", \
     "$tmp/val.dat" using 1:2 with points pt 7 ps 1.5 title "validation loss"
set output "$out/breakdown.png"
set title "zoff train: step time breakdown ($dir)"
set ylabel "seconds"; set key outside right
set style data histograms; set style histogram rowstacked; set style fill solid 0.8 noborder
set boxwidth 1; set xrange [0:*]
set xtics auto
plot "$tmp/steps.dat" using 4 title "forward", "" using 5 title "backward", "" using 6 title "wait grads", \
     "" using 7 title "host step", "" using 8 title "device step", "" using 9 title "wait weights", \
     "" using 10 title "other"
GP
echo "wrote $out/loss.png and $out/breakdown.png"
