#!/usr/bin/python3
"""zoff train against an independent float64 PyTorch training loop (tests/cli_train_torch.sh).

    train_torch_ref.py setup DIR --layers L --hidden C --heads NH --seq T --windows N [--val-windows V]
        DIR/init.safetensors: a random GPT-2 in Hugging Face's layout (float32, for
        zoff train --init-from); DIR/train.bin: a token shard (llm.c format, byte tokenizer)
        of exactly N windows of T + 1 tokens, so that a step whose micro-batches take N
        windows in all reads every window once, whatever zoff's shuffled order: the step's
        mean loss and gradient do not depend on which window lands in which micro-batch.
        DIR/val.bin: the first V windows (default 2) of the same stream.

    train_torch_ref.py check DIR NAME:CONFIG:RUN:EXPORT[:TOL[:RANKS]] ...
        For each run: trains the reference from DIR/init.safetensors on DIR/train.bin as the
        DeepSpeed config CONFIG says (micro-batch, accumulation, optimizer, scheduler,
        gradient_clipping), for as many steps as RUN/metrics.jsonl has, and compares every
        step's loss, lr and grad_norm with zoff's metrics.jsonl (and each val_loss line with the
        mean loss over all of DIR/val.bin's windows at the reference's weights after that step:
        --eval-iters x micro-batch must be a multiple of V, so that every evaluation reads each
        window equally often)
        and the final weights with
        EXPORT (zoff export of the run's last checkpoint, f32). TOL: fp32 (default) or 16bit
        (bf16/fp16 runs, only expected to be close to float64), the tolerances in TOLS. RANKS: the
        run's number of data-parallel ranks N (default 1): the step's batch is N x micro-batch x
        accumulation windows (DeepSpeed's train_batch_size; any one of the three config keys may
        be left out and is derived as DeepSpeed does), the shard one step's worth of them.

The reference is written here in plain PyTorch (nn.Linear, nn.LayerNorm, F.gelu tanh,
explicit causal attention, F.cross_entropy, torch.optim.AdamW / Adam,
torch.nn.utils.clip_grad_norm_), in float64; it shares no code with zoff. What it
implements is DeepSpeed's documented behaviour, written independently:

- the loss of a micro-batch is its mean token loss; with gradient_accumulation_steps k the
  engine scales each micro-batch's loss by 1/k (the step's gradient is the mean over
  micro-batches) and reports their mean;
- gradient_clipping c > 0: the global 2-norm of the step's (accumulated, unscaled)
  gradient over all parameters, and every gradient times c / (norm + 1e-6) when the norm
  is above c, before the optimizer step; the reported grad_norm is the one before clipping;
- weight decay on the parameters docs/config.md names: not on biases, not on LayerNorm
  weights (every other tensor: the matrices and both embeddings);
- the scheduler's lr for optimizer step s (1-based) is its value after s - 1 calls of
  scheduler.step() (DeepSpeed steps the scheduler after the optimizer; a fresh
  scheduler's last_batch_iteration is -1), as deepspeed/runtime/lr_schedules.py computes it
  (OneCycle: also the betas, (momentum, 0.99));
- fp16 with dynamic loss scaling: a step whose gradients overflow is skipped (no update, the
  schedule does not advance: DeepSpeed's engine steps its scheduler only after an update). Which
  steps overflow depends on fp16 rounding a float64 loop does not have, so the reference skips the
  steps zoff's metrics.jsonl marks skipped (fp16 runs only; any other run's skip is a failure) and
  still compares their loss; with N ranks every rank's metrics must record the same steps, losses,
  norms and loss scales (metrics_rank_R.jsonl);
- zero_optimization.zoff_delayed_param_update (a zoff extension, no DeepSpeed counterpart), as
  docs/config.md says: after zoff_delayed_param_update_warmup exact steps, the forward and
  backward of step s + 1 use the weights of update s - 1, and each update applies to the newest.

The key bias (the middle third of attn.c_attn.bias) is left out of the weight comparison: it
adds q.b_k to every score of a query's row, which the softmax cancels, so its exact gradient
is 0 and what either side computes is rounding noise, which Adam's normalisation turns into
updates of up to lr (float32 noise ~1e-9 >> eps; float64 noise ~1e-17 << eps).

Exit status 0 when every comparison is within its tolerance, 1 otherwise. Runs with
/usr/bin/python3 (python3-torch, numpy).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
from safetensors_gpt2_ref import hf_shapes, read_safetensors, strip_names, write_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)


# ------------------------------------------------------------------ the model


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        b, t, C = x.shape
        hs = C // self.NH
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, self.NH, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, C, NH, maxT, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(maxT, C)
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the head tied to wte
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    # Hugging Face names and layout (Conv1D matrices are (in, out): nn.Linear's transposed)
    HF = {"ln_1.weight": "ln_1.weight", "ln_1.bias": "ln_1.bias", "attn.c_attn.weight": "c_attn.weight",
          "attn.c_attn.bias": "c_attn.bias", "attn.c_proj.weight": "attn_proj.weight",
          "attn.c_proj.bias": "attn_proj.bias", "ln_2.weight": "ln_2.weight", "ln_2.bias": "ln_2.bias",
          "mlp.c_fc.weight": "c_fc.weight", "mlp.c_fc.bias": "c_fc.bias", "mlp.c_proj.weight": "mlp_proj.weight",
          "mlp.c_proj.bias": "mlp_proj.bias"}

    def hf_params(self):
        """(HF name, parameter, transposed) for every parameter."""
        out = [("wte.weight", self.wte.weight, False), ("wpe.weight", self.wpe.weight, False)]
        for l, blk in enumerate(self.h):
            mods = dict(blk.named_parameters())
            for hf, mine in self.HF.items():
                out.append((f"h.{l}.{hf}", mods[mine], hf.endswith("weight") and mods[mine].dim() == 2))
        out += [("ln_f.weight", self.ln_f.weight, False), ("ln_f.bias", self.ln_f.bias, False)]
        return out

    def load_hf(self, P):
        with torch.no_grad():
            for name, p, tr in self.hf_params():
                p.copy_(P[name].t() if tr else P[name])

    def hf_state(self):
        return {name: (p.detach().t() if tr else p.detach()) for name, p, tr in self.hf_params()}


def shape_of(P):
    L = 1 + max(int(n.split(".")[1]) for n in P if n.startswith("h."))
    V, C = P["wte.weight"].shape
    return L, C, P["wpe.weight"].shape[0], V


# ------------------------------------------------------------------ DeepSpeed's schedules, by the step


def ds_lr(sched, base_lr, step):
    """The lr of optimizer step `step` (1-based): the scheduler after step - 1 scheduler.step() calls."""
    if not sched:
        return base_lr
    typ, p = sched["type"], sched.get("params", {})
    it = step - 2  # last_batch_iteration: -1 fresh, +1 per scheduler.step()
    w = max(2, p.get("warmup_num_steps", 1000))
    linear = p.get("warmup_type", "log") == "linear"

    def warm(i):
        return i / w if linear else math.log(i + 1) / math.log(w)

    if typ in ("WarmupLR", "WarmupDecayLR"):
        lo = p.get("warmup_min_lr", 0.0)
        hi = p.get("warmup_max_lr", base_lr if typ == "WarmupLR" else 0.001)
        if it < 0:
            return lo  # the constructor sets min_lr before the first step
        if it < w:
            g = warm(it)
        elif typ == "WarmupLR":
            g = 1.0
        else:
            g = max(0.0, (p["total_num_steps"] - it) / max(1.0, p["total_num_steps"] - w))
        return lo + (hi - lo) * g
    if typ == "WarmupCosineLR":
        if it < 0:
            return 0.0
        if it < w:
            r0 = p.get("warmup_min_ratio", 0.0)
            return base_lr * (r0 + warm(it) * (1 - r0))
        prog = min(1.0, (it - w + 1) / max(1, p["total_num_steps"] - w))
        c = p.get("cos_min_ratio", 0.0001)
        return base_lr * max(0.0, c + (1 - c) * (1 + math.cos(math.pi * prog)) / 2)
    if typ == "OneCycle":
        return one_cycle(p, it)[0]
    if typ == "LRRangeTest":  # min_lr * (1 + rate * (it + 1) / step_size), the interval floored in stairs
        n = (it + 1) / p.get("lr_range_test_step_size", 2000)
        n = math.floor(n) if p.get("lr_range_test_staircase", False) else n
        return p.get("lr_range_test_min_lr", 1e-3) * (1 + p.get("lr_range_test_step_rate", 1.0) * n)
    raise SystemExit(f"train_torch_ref.py: scheduler {typ} not modelled")


def one_cycle(p, it):
    """DeepSpeed's OneCycle at last_batch_iteration `it` (continuous, no stairs): (lr, beta1 or None).
    Up from cycle_min_lr to cycle_max_lr over cycle_first_step_size steps and back over the second,
    then lr = min / (1 + decay_lr_rate * decay steps); beta1 the other way between cycle_max_mom and
    cycle_min_mom, with beta2 0.99 (DeepSpeed sets the betas to (momentum, 0.99))."""
    lo, hi = p["cycle_min_lr"], p["cycle_max_lr"]
    first = p.get("cycle_first_step_size", 2000)
    total = first + (p.get("cycle_second_step_size") or first)
    mlo, mhi = p.get("cycle_min_mom", 0.8), p.get("cycle_max_mom", 0.9)
    mom = p.get("cycle_momentum", True)
    if it < 0:  # the constructor's values
        return lo, (mlo if mom else None)
    if it < total:
        x = (it + 1) / total - math.floor((it + 1) / total)
        ratio = first / total
        f = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
        return lo + (hi - lo) * f, (mhi - (mhi - mlo) * f if mom else None)
    ds = p.get("decay_step_size", 0)
    n = (it - total + 1) / ds if ds else 0
    return lo / (1 + p.get("decay_lr_rate", 0.0) * n), (mhi * (1 + p.get("decay_mom_rate", 0.0) * n) if mom else None)


# ------------------------------------------------------------------ setup


def write_shard(path, tokens):
    hdr = np.zeros(256, dtype="<i4")
    hdr[0], hdr[1], hdr[2], hdr[3] = 20240520, 1, len(tokens), 256
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def setup(d, L, C, NH, T, N, NV=2):
    g = torch.Generator().manual_seed(20261129)
    out = []
    for name, shape in hf_shapes(L, C, T, 256).items():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            v = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("bias"):
            v = 0.05 * torch.randn(shape, generator=g)
        else:
            v = 0.2 * torch.randn(shape, generator=g)
        out.append((name, "F32", v.to(torch.float32).numpy().astype("<f4")))
    write_safetensors(os.path.join(d, "init.safetensors"), out, {"format": "pt", "zoff.num_heads": str(NH)})
    # a learnable stream (a noisy repeating pattern) so the loss moves
    rng = np.random.default_rng(7)
    base = rng.integers(0, 256, size=37)
    toks = [int(base[i % 37]) if rng.random() < 0.8 else int(rng.integers(0, 256)) for i in range(N * T + 1)]
    write_shard(os.path.join(d, "train.bin"), toks)
    write_shard(os.path.join(d, "val.bin"), toks[: NV * T + 1])


# ------------------------------------------------------------------ the reference run


def read_windows(path, T):
    tok = np.frombuffer(open(path, "rb").read()[1024:], dtype="<u2").astype(np.int64)
    n = (len(tok) - 1) // T
    return torch.from_numpy(np.stack([tok[k * T:k * T + T + 1] for k in range(n)]))


def param_groups(model, wd):
    decay, no = [], []
    for name, p, _ in model.hf_params():
        is_ln = ".ln_" in name or name.startswith("ln_")
        (no if name.endswith("bias") or is_ln else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no, "weight_decay": 0.0}]


def make_optimizer(model, cfg):
    o = cfg.get("optimizer", {"type": "AdamW", "params": {}})
    p = o.get("params", {})
    typ = o["type"].lower()
    lr, betas, eps, wd = p.get("lr", 1e-3), tuple(p.get("betas", (0.9, 0.999))), p.get("eps", 1e-8), \
        p.get("weight_decay", 0.0)
    adamw = typ == "adamw" or (typ == "adam" and p.get("adam_w_mode", True))
    groups = param_groups(model, wd)
    if typ == "adagrad":  # weight decay added to the gradient (L2), as torch's and DeepSpeed's Adagrad
        return torch.optim.Adagrad(groups, lr=lr, eps=p.get("eps", 1e-10),
                                   initial_accumulator_value=p.get("initial_accumulator_value", 0.0)), lr
    if typ == "lion":
        return Lion(groups, lr, tuple(p.get("betas", (0.9, 0.999)))), lr  # DeepSpeed's default betas
    if typ not in ("adam", "adamw"):
        raise SystemExit(f"train_torch_ref.py: optimizer {o['type']} not modelled")
    if not p.get("bias_correction", True):
        return NoBiasCorrectionAdam(groups, lr, betas, eps, adamw), lr
    cls = torch.optim.AdamW if adamw else torch.optim.Adam
    return cls(groups, lr=lr, betas=betas, eps=eps), lr


class NoBiasCorrectionAdam:
    """Adam / AdamW without bias correction (DeepSpeed's bias_correction false):
    p -= lr * m / (sqrt(v) + eps) (+ lr * wd * p decoupled, or wd * p added to the gradient)."""

    def __init__(self, groups, lr, betas, eps, adamw):
        self.param_groups = [dict(g, lr=lr) for g in groups]
        self.b1, self.b2, self.eps, self.adamw = betas[0], betas[1], eps, adamw
        self.state = {}

    def step(self):
        with torch.no_grad():
            for g in self.param_groups:
                for p in g["params"]:
                    grad = p.grad.clone()
                    if not self.adamw:
                        grad += g["weight_decay"] * p
                    m, v = self.state.setdefault(p, (torch.zeros_like(p), torch.zeros_like(p)))
                    m.mul_(self.b1).add_(grad, alpha=1 - self.b1)
                    v.mul_(self.b2).addcmul_(grad, grad, value=1 - self.b2)
                    if self.adamw:
                        p.mul_(1 - g["lr"] * g["weight_decay"])
                    p.sub_(g["lr"] * m / (v.sqrt() + self.eps))


class Lion:
    """Lion (Chen et al. 2023, as DeepSpeed's FusedLion / CPU Lion): c = b1 m + (1 - b1) g;
    p = p (1 - lr wd) - lr sign(c); m = b2 m + (1 - b2) g."""

    def __init__(self, groups, lr, betas):
        self.param_groups = [dict(g, lr=lr) for g in groups]
        self.b1, self.b2 = betas
        self.state = {}

    def step(self):
        with torch.no_grad():
            for g in self.param_groups:
                for p in g["params"]:
                    m = self.state.setdefault(p, torch.zeros_like(p))
                    c = self.b1 * m + (1 - self.b1) * p.grad
                    p.mul_(1 - g["lr"] * g["weight_decay"]).sub_(g["lr"] * torch.sign(c))
                    m.mul_(self.b2).add_(p.grad, alpha=1 - self.b2)


def reference(d, cfg, steps, T, ranks=1, skipped=(), val_steps=()):
    P = strip_names(read_safetensors(os.path.join(d, "init.safetensors"))[0])
    L, C, maxT, V = shape_of(P)
    NH = int(read_safetensors(os.path.join(d, "init.safetensors"))[1]["zoff.num_heads"])
    model = GPT2(L, C, NH, maxT, V)
    model.load_hf(P)
    win = read_windows(os.path.join(d, "train.bin"), T)
    # N ranks at micro-batch m: a micro-batch of the step is N x m windows (rank r reads m of them); the
    # step's gradient is the mean over all its windows, whichever rank reads which
    # DeepSpeed's batch rule: train_batch_size = micro x accumulation x ranks, any one of the three derived
    # from the other two (only train_batch_size: accumulation 1)
    mb, ga, tbs = (cfg.get(k) for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                        "train_batch_size"))
    if mb is None:
        ga = ga or 1
        mb = tbs // (ga * ranks)
    elif ga is None:
        ga = tbs // (mb * ranks) if tbs else 1
    mb *= ranks
    assert mb * ga == len(win), f"the shard must hold one step's windows: {len(win)} != {mb} x {ga}"
    clip = cfg.get("gradient_clipping", 1.0)
    opt, base_lr = make_optimizer(model, cfg)
    # zoff's delayed parameter update (docs/config.md): updates after the first `warmup` run one step
    # behind, so the forward and backward of step s + 1 use the weights of update s - 1
    zo = cfg.get("zero_optimization", {})
    delay_from = zo.get("zoff_delayed_param_update_warmup", 10) + 1 if zo.get("zoff_delayed_param_update") else None
    params = list(model.parameters())
    prev = [p.detach().clone() for p in params]  # the weights before the last update
    val = read_windows(os.path.join(d, "val.bin"), T)
    vals = {}

    def validate(step):  # the mean loss over every validation window (equal batches: the mean of theirs)
        if step in val_steps:
            with torch.no_grad():
                vals[step] = model(val[:, :-1], val[:, 1:]).item()

    validate(0)
    rows = []
    taken = 0  # optimizer steps taken: a skipped step does not advance the schedule (DeepSpeed's fp16)
    for step in range(1, steps + 1):
        skip = step <= len(skipped) and skipped[step - 1]
        s = taken + 1
        lr = ds_lr(cfg.get("scheduler"), base_lr, s)
        for g in opt.param_groups:
            g["lr"] = lr
        if cfg.get("scheduler", {}).get("type") == "OneCycle":
            b1 = one_cycle(cfg["scheduler"]["params"], s - 2)[1]
            for g in opt.param_groups:
                if b1 is not None:
                    g["betas"] = (b1, 0.99)
        for p in model.parameters():
            p.grad = None
        stale = delay_from is not None and s - 1 >= delay_from
        now = [p.detach().clone() for p in params]
        if stale:  # the forward of step s sees update s - 2's weights
            with torch.no_grad():
                for p, q in zip(params, prev):
                    p.copy_(q)
        loss = 0.0
        for k in range(ga):  # the micro-batches: order does not matter for the step's mean
            w = win[k * mb:(k + 1) * mb]
            l = model(w[:, :-1], w[:, 1:])
            (l / ga).backward()
            loss += l.item() / ga
        if stale:  # the update applies to the newest weights
            with torch.no_grad():
                for p, q in zip(params, now):
                    p.copy_(q)
        prev = now
        if skip:  # fp16 overflow: no update (the forward's loss is still the step's)
            rows.append({"loss": loss, "lr": lr, "grad_norm": None, "clipped": False, "skipped": True})
            validate(step)
            continue
        taken += 1
        norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in model.parameters()))
        if clip > 0:
            nn.utils.clip_grad_norm_(list(model.parameters()), clip)
        opt.step()
        rows.append({"loss": loss, "lr": lr, "grad_norm": norm, "clipped": 0 < clip < norm})
        validate(step)
    return rows, model.hf_state(), vals


# tolerances (relative): fp32 runs are zoff's float32 against float64; 16-bit runs (bf16, fp16) are
# only expected to be close to float64
TOLS = {"fp32": {"loss": 5e-5, "grad_norm": 2e-4, "weights": 2e-4},
        "16bit": {"loss": 3e-3, "grad_norm": 5e-2, "weights": 0.15}}


def check(d, specs):
    fails = 0
    init = os.path.join(d, "init.safetensors")
    P0 = strip_names(read_safetensors(init)[0])
    T = P0["wpe.weight"].shape[0]
    for spec in specs:
        parts = spec.split(":")
        name, cfg_path, run, export = parts[:4]
        tol = TOLS[parts[4] if len(parts) > 4 and parts[4] else "fp32"]
        ranks = int(parts[5]) if len(parts) > 5 else 1
        cfg = json.load(open(cfg_path))
        if not os.path.exists(os.path.join(run, "metrics.jsonl")) or not os.path.exists(export):
            print(f"FAIL: {name}: the run left no metrics.jsonl or no export")
            fails += 1
            continue
        got = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl")) if '"loss"' in x and '"step"' in x]
        # fp16 overflow skips a step (a float64 reference cannot tell which): the reference skips the
        # steps zoff skipped, as DeepSpeed does (no update, the schedule does not advance); only fp16
        # runs may skip, and every rank's metrics must record the same steps skipped (checked below)
        fp16 = cfg.get("fp16", {}).get("enabled", False)
        skipped = [bool(a.get("skipped")) and fp16 for a in got]
        # validation (--eval-iters batches of the micro-batch, val.bin one evaluation's windows: the mean
        # over all of them, whichever rank evaluates which batch), before training and every eval interval
        vgot = {a["step"]: a["val_loss"] for a in (json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))
                                                  if '"val_loss"' in x)}
        if cfg.get("zero_optimization", {}).get("zoff_delayed_param_update"):
            vgot = {}  # the weights a delayed update's evaluation sees are not modelled here
        ref, W, vref = reference(d, cfg, len(got), T, ranks, skipped, set(vgot))
        bad = [] if got else ["no steps in metrics.jsonl"]
        for r in range(1, ranks):  # rank r's own metrics file: the same decisions, step by step
            mr = os.path.join(run, f"metrics_rank_{r:05d}.jsonl")
            other = [json.loads(x) for x in open(mr) if '"loss"' in x] if os.path.exists(mr) else []
            keys = ("step", "loss", "grad_norm", "loss_scale", "skipped")
            if [[a.get(k) for k in keys] for a in other] != [[a.get(k) for k in keys] for a in got]:
                bad.append(f"rank {r}'s metrics (step, loss, grad_norm, loss_scale, skipped) differ from rank 0's")
        worst = {"loss": 0.0, "lr": 0.0, "grad_norm": 0.0}
        for s, (a, b) in enumerate(zip(got, ref), 1):
            for key in worst:
                if key == "grad_norm" and b.get("skipped"):  # both skipped: no norm
                    continue
                if a.get(key) is None:  # a skipped (overflowed) step: the reference has none
                    bad.append(f"step {s} {key}: zoff {a.get(key)} (skipped: {a.get('skipped')})")
                    continue
                err = abs(a[key] - b[key]) / max(abs(b[key]), 1e-12)
                worst[key] = max(worst[key], err)
                if not err <= tol.get(key, 1e-6):  # lr: metrics.jsonl prints 7 digits
                    bad.append(f"step {s} {key}: zoff {a[key]:.7g}, reference {b[key]:.7g}")
        verr = 0.0
        for step, v in sorted(vgot.items()):
            err = abs(v - vref[step]) / abs(vref[step])
            verr = max(verr, err)
            if not err <= tol["loss"]:
                bad.append(f"val_loss after step {step}: zoff {v:.7g}, reference {vref[step]:.7g}")
        Z = strip_names(read_safetensors(export)[0])
        werr, wname = 0.0, ""
        for n, ref_w in W.items():  # each tensor: |zoff - reference| / |reference - initial|
            keep = torch.ones(ref_w.shape, dtype=torch.bool)
            if n.endswith("attn.c_attn.bias"):  # not the key bias: its exact gradient is 0 (above)
                keep[ref_w.shape[0] // 3:2 * ref_w.shape[0] // 3] = False
            e = float((Z[n] - ref_w)[keep].norm()) / max(1e-30, float((ref_w - P0[n])[keep].norm()))
            if e > werr:
                werr, wname = e, n
        if not werr <= tol["weights"]:
            bad.append(f"final weights: {wname} differs from the reference by {werr:.3g} of its change in training "
                       f"(tolerance {tol['weights']:g})")
        print(f"{name}: {len(got)} steps, clipped: {''.join('y' if r['clipped'] else 'n' for r in ref)}"
              f"{', skipped: ' + ''.join('y' if k else 'n' for k in skipped) if any(skipped) else ''}; worst rel "
              f"err loss {worst['loss']:.2g}{f', val_loss {verr:.2g} ({len(vgot)})' if vgot else ''}, lr {worst['lr']:.2g}, grad_norm {worst['grad_norm']:.2g}; final "
              f"weights {werr:.2g} ({wname}); reference losses " + " ".join(f"{r['loss']:.4f}" for r in ref))
        for b in bad:
            print(f"FAIL: {name}: {b}")
        fails += bool(bad)
    return fails


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "setup":
        a = dict(zip(sys.argv[3::2], map(int, sys.argv[4::2])))
        setup(sys.argv[2], a["--layers"], a["--hidden"], a["--heads"], a["--seq"], a["--windows"],
              a.get("--val-windows", 2))
        return 0
    if len(sys.argv) > 3 and sys.argv[1] == "check":
        return 1 if check(sys.argv[2], sys.argv[3:]) else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
