#!/usr/bin/env python3
"""Plain PyTorch's GPT-2 training step, the peer `zoff bench step` is compared with on a GPU.

Hugging Face's GPT2LMHeadModel (random init) with scaled_dot_product_attention ("sdpa"),
bf16 autocast over fp32 weights, torch.optim.AdamW(fused=True), micro-batch B of seq-length
tokens drawn at random: the "plain PyTorch" of the project's issues. No torch.compile.

    python3 bench/torch_gpt2_step.py --num-layers 12 --hidden-size 768 --num-attention-heads 12 \
        --seq-length 1024 --micro-batch-size 16 --iters 10 --warmup 3

Prints one JSON object: the median step time and tokens/s over --iters timed steps (each step
timed with CUDA events around forward, backward and optimizer step), and the peak device memory.
"""
import argparse
import json
import math
import statistics
import sys
import time


def own_gpt2(torch, a):
    """GPT-2 as Hugging Face builds it: pre-LayerNorm blocks, tanh GELU, causal attention through
    scaled_dot_product_attention, tied input/output embeddings, mean cross-entropy of the next token."""
    nn, F = torch.nn, torch.nn.functional
    C, H, T = a.hidden_size, a.num_attention_heads, a.seq_length

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.c_fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B = x.shape[0]
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
            x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.c_fc_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class Out:
        def __init__(self, loss):
            self.loss = loss

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(a.vocab_size, C), nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(a.num_layers))
            self.ln_f = nn.LayerNorm(C)
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)

        def forward(self, input_ids, labels):
            x = self.wte(input_ids) + self.wpe(torch.arange(T, device=input_ids.device))
            for b in self.h:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(),
                                   labels[:, 1:].reshape(-1))
            return Out(loss)

    return GPT2()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-layers", type=int, default=12)
    ap.add_argument("--hidden-size", type=int, default=768)
    ap.add_argument("--num-attention-heads", type=int, default=12)
    ap.add_argument("--seq-length", type=int, default=1024)
    ap.add_argument("--vocab-size", type=int, default=50257)
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--impl", choices=["hf", "own"], default="hf",
                    help="hf: transformers' GPT2LMHeadModel (falls back to own when transformers is "
                         "missing); own: the same architecture written here")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to check the script itself")
    a = ap.parse_args()

    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 1
    torch.manual_seed(1234)
    dev = torch.device(a.device)
    impl = a.impl
    if impl == "hf":
        try:
            from transformers import GPT2Config, GPT2LMHeadModel
        except ImportError:
            impl = "own"
    model = None
    if impl == "hf":
      try:
        cfg = GPT2Config(n_layer=a.num_layers, n_embd=a.hidden_size, n_head=a.num_attention_heads,
                         n_positions=a.seq_length, vocab_size=a.vocab_size,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        try:
            cfg._attn_implementation = "sdpa"
        except Exception:  # noqa: BLE001 (a transformers version where it is read-only: its default)
            pass
        model = GPT2LMHeadModel(cfg)
        attn = getattr(model.config, "_attn_implementation", "?")
      except Exception as e:  # noqa: BLE001
        print(f"torch_gpt2_step: transformers' GPT-2 failed ({e}); using the model written here",
              file=sys.stderr)
        impl, model = "own", None
    if model is None:
        model = own_gpt2(torch, a)
        attn = "sdpa" if hasattr(torch.nn.functional, "scaled_dot_product_attention") else "matmul"
    model = model.to(dev)
    model.train()
    fused = {"fused": True} if a.device == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **fused)
    params = sum(p.numel() for p in model.parameters())

    def step():
        x = torch.randint(0, a.vocab_size, (a.micro_batch_size, a.seq_length), device=dev)
        with torch.autocast(a.device, dtype=torch.bfloat16):
            out = model(input_ids=x, labels=x)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss

    for _ in range(a.warmup):
        step()
    if a.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.iters):
        if a.device == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            loss = step()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            loss = step()
            times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    tokens = a.micro_batch_size * a.seq_length
    print(json.dumps({
        "peer": "pytorch", "impl": impl, "attention": attn, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu",
        "params": params, "micro_batch_size": a.micro_batch_size, "seq_length": a.seq_length,
        "step_ms_median": round(med, 3), "step_ms_min": round(min(times), 3),
        "step_ms_max": round(max(times), 3), "tokens_per_s": round(tokens / (med / 1e3), 1),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if a.device == "cuda" else None,
        "last_loss": float(loss)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
