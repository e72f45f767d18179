#!/usr/bin/python3
"""torch.optim.AdamW on the CPU, for comparison with `zoff bench adam`.

Run with Debian's interpreter (python3-torch imports there):
    /usr/bin/python3 bench/bench_torch_adam.py --params 100M --threads 2 [--json]

Times optimizer.step() of torch.optim.AdamW (fp32 parameters, gradients and
state, weight_decay 0.01) with foreach off and on, over --tensors tensors that
hold --params elements in all (default: one flat tensor, torch's best case).
Reports the median over --repeats measurements of --iters steps each.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch


def count(text):
    mult = {"k": 1e3, "K": 1e3, "M": 1e6, "m": 1e6, "G": 1e9, "g": 1e9}
    if text and text[-1] in mult:
        return int(float(text[:-1]) * mult[text[-1]])
    return int(float(text))


def bench(n, tensors, foreach, iters, repeats):
    sizes = [n // tensors + (1 if i < n % tensors else 0) for i in range(tensors)]
    params = []
    for s in sizes:
        p = torch.nn.Parameter(torch.empty(s).uniform_(-0.1, 0.1))
        p.grad = torch.empty(s).uniform_(-0.01, 0.01)
        params.append(p)
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=foreach)
    opt.step()  # allocates the state
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            opt.step()
        times.append((time.perf_counter() - t0) / iters)
    del opt, params
    return statistics.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="100M")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: all cores)")
    ap.add_argument("--tensors", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    n = count(a.params)
    threads = a.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    res = {}
    for fe in (False, True):
        med, lo, hi = bench(n, a.tensors, fe, a.iters, a.repeats)
        res["foreach" if fe else "for_loop"] = {"sec_per_step": med, "params_per_s": n / med,
                                                "gb_per_s_28B": 28 * n / med / 1e9, "min_s": lo, "max_s": hi}
    out = {"bench": "torch_adamw", "torch": torch.__version__, "params": n, "threads": threads,
           "tensors": a.tensors, "iters": a.iters, "repeats": a.repeats, **res}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"torch {torch.__version__} AdamW, {n} params in {a.tensors} tensor(s), {threads} threads")
        for k in ("for_loop", "foreach"):
            r = res[k]
            print(f"  foreach={'True ' if k == 'foreach' else 'False'}  {r['params_per_s']:.4g} params/s  "
                  f"({r['sec_per_step'] * 1e3:.1f} ms/step, {r['gb_per_s_28B']:.2f} GB/s at 28 B/param)")


if __name__ == "__main__":
    sys.exit(main())
