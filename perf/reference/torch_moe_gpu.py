#!/usr/bin/env python3
"""PyTorch reference for the MoE GPU benchmark (issue 20): GPT-2 124M's dense part (attention,
LayerNorms, embeddings, tied head) with every block's MLP replaced by 8 GELU experts of width
4C, top-2 softmax routing renormalised (Mixtral's router, meshtrain's moe.router_score softmax),
the Switch load-balancing loss (coefficient 0.01, Megatron-Core's top-k normalisation), bf16
autocast with an fp32 router, fp32 master weights, fused AdamW, random tokens.

    python3 perf/reference/torch_moe_gpu.py --micro-batch 8 --seq 1024 --mode eager,compile --steps 20
    python3 perf/reference/torch_moe_gpu.py --experts-impl loop      # a GEMM loop instead of _grouped_mm

The experts run as grouped GEMMs: tokens sorted by expert (a stable argsort of the k choices),
torch._grouped_mm over the expert offsets (PyTorch >= 2.8, bf16, CUDA sm90), or a Python loop of
GEMMs over the experts ("loop"; data-dependent shapes, so torch.compile breaks its graph
there). Prints one line per mode: tokens/s, ms/step, MFU (6 N_active + 12 L C T FLOPs per token
against 989 TFLOP/s), peak memory. meshtrain's counterpart: build/cuda/perf/bench/bench_train_step
--preset gpt2-124m --moe-experts 8 --moe-top-k 2 --precision bf16 (bf16 experts, fp32 router,
docs/moe.md).
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Experts(nn.Module):
    """E GELU experts, weights stacked [E, C, I] and [E, I, C] (meshtrain's w_in / w_out)."""

    def __init__(self, E, C, I, impl):
        super().__init__()
        self.E, self.impl = E, impl
        self.w_in = nn.Parameter(torch.randn(E, C, I) * 0.02)
        self.w_out = nn.Parameter(torch.randn(E, I, C) * 0.02)

    def forward(self, xs, counts):
        # xs: [M, C] rows sorted by expert; counts: [E] rows per expert.
        if self.impl == "grouped":
            # autocast does not cover _grouped_mm, and LayerNorm's output under autocast is fp32:
            # the rows go in as bf16, as the expert GEMMs of the other linears run (and ours).
            xs = xs.to(torch.bfloat16)
            offs = torch.cumsum(counts, 0).to(torch.int32)
            h = torch._grouped_mm(xs, self.w_in.to(xs.dtype), offs=offs)
            h = F.gelu(h, approximate="tanh")
            return torch._grouped_mm(h, self.w_out.to(xs.dtype), offs=offs)
        out, start = [], 0
        for e, n in enumerate(counts.tolist()):
            if n:
                x = xs[start:start + n]
                out.append(F.gelu(x @ self.w_in[e].to(x.dtype), approximate="tanh")
                           @ self.w_out[e].to(x.dtype))
            start += n
        return torch.cat(out, 0)


class MoE(nn.Module):
    def __init__(self, C, E, k, I, impl, aux_coeff):
        super().__init__()
        self.E, self.k, self.aux_coeff = E, k, aux_coeff
        self.router = nn.Linear(C, E, bias=False)
        self.experts = Experts(E, C, I, impl)

    def forward(self, x):
        B, T, C = x.shape
        xt = x.view(-1, C)
        N = xt.shape[0]
        with torch.autocast("cuda", enabled=False):  # the router in fp32
            logits = self.router(xt.float())
            p = logits.softmax(-1)
            top_p, top_e = p.topk(self.k, dim=-1)
            w = top_p / top_p.sum(-1, keepdim=True)
            counts = torch.bincount(top_e.view(-1), minlength=self.E)
            aux = self.aux_coeff * self.E / (N * N * self.k) * (counts.float() * p.sum(0)).sum()
        order = torch.argsort(top_e.view(-1), stable=True)   # rows grouped by expert
        token = order // self.k
        ys = self.experts(xt[token], counts)
        y = torch.zeros_like(xt).index_add_(0, token, (ys * w.view(-1)[order, None].to(ys.dtype)).to(xt.dtype))
        return y.view(B, T, C), aux


class Block(nn.Module):
    def __init__(self, C, H, moe):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.moe = moe

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        m, aux = self.moe(self.ln_2(x))
        return x + m, aux


class GPT(nn.Module):
    def __init__(self, E, k, impl, L=12, H=12, C=768, V=50304, T=1024, aux_coeff=0.01):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H, MoE(C, E, k, 4 * C, impl, aux_coeff))
                                for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        aux = 0.0
        for b in self.h:
            x, a = b(x)
            aux = aux + a
        logits = self.ln_f(x) @ self.wte.weight.t()
        ce = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return ce + aux


def run(mode, mb, T, steps, warmup, E, k, impl):
    torch.manual_seed(0)
    model = GPT(E, k, impl).cuda()
    L, C, V = 12, 768, 50257
    total = sum(p.numel() for p in model.parameters()) - model.wte.weight.numel() + V * C
    active = total - L * (E - k) * 2 * C * 4 * C
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    x = torch.randint(0, V, (mb, T), device="cuda")
    y = torch.randint(0, V, (mb, T), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    dt = times[len(times) // 2]
    tok = mb * T / dt
    flops = 6 * active + 12 * L * C * T
    print(f"pytorch-moe-{mode:8s} {impl:7s} E {E} top-{k} mb {mb:3d}: {tok:10.0f} tok/s  "
          f"{dt * 1e3:8.1f} ms/step  MFU {tok * flops / 989e12:.3f}  "
          f"params {total / 1e6:.1f}M ({active / 1e6:.1f}M active)  "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    del model, opt, fwd
    torch.cuda.empty_cache()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--micro-batch", default="8")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--mode", default="eager,compile")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--experts-impl", default="grouped", choices=["grouped", "loop"])
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    impl = a.experts_impl
    if impl == "grouped" and not hasattr(torch, "_grouped_mm"):
        print("# torch._grouped_mm not available in this PyTorch: using the GEMM loop")
        impl = "loop"
    for mode in a.mode.split(","):
        for mb in (int(m) for m in a.micro_batch.split(",")):
            run(mode, mb, a.seq, a.steps, a.warmup, a.experts, a.top_k, impl)
