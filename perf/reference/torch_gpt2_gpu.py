#!/usr/bin/env python3
"""PyTorch reference for the GPU benchmark: GPT-2 training steps (124M by default, --preset for the
larger shapes) (bf16 autocast, fp32
master weights, fused AdamW), eager with SDPA attention and/or torch.compile, random tokens.

    python3 perf/reference/torch_gpt2_gpu.py --micro-batch 16 --seq 1024 --mode eager,compile --steps 20
    python3 perf/reference/torch_gpt2_gpu.py --micro-batch 16 --mode compile --profile 3   # + kernel table
    python3 perf/reference/torch_gpt2_gpu.py --preset gpt2-1.5b --micro-batch 4 --mode compile
    python3 perf/reference/torch_gpt2_gpu.py --preset gpt2-1.5b --micro-batch 4 --mode compile \
        --linears bf16,float8     # + the blocks' linears on torch._scaled_mm (torch_float8.py)

Prints one line per mode: tokens/s, ms/step, MFU (6N + 12 L C T FLOPs per token against
989 TFLOP/s), peak memory (the caching allocator's max allocated) and the device's used memory
(total - free, as meshtrain reports it). Same model as meshtrain: tanh GELU, LayerNorm eps 1e-5, tied head,
vocab padded to 50304, AdamW (0.9, 0.95), eps 1e-8, wd 0.1 on 2-D weights, clip 1.0.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


# meshtrain's GPT-2 presets (src/model/config.cpp): layers, heads, width.
PRESETS = {"gpt2-124m": (12, 12, 768), "gpt2-350m": (24, 16, 1024),
           "gpt2-774m": (36, 20, 1280), "gpt2-1.5b": (48, 25, 1600)}


class GPT(nn.Module):
    def __init__(self, L=12, H=12, C=768, V=50304, T=1024):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def kernel_table(prof, steps, top=40):
    """CUDA time per kernel per step, grouped into the classes meshtrain's profile uses."""
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = e.cuda_time_total
        if t > 0 and e.device_type.name == "CUDA":
            rows.append((t / steps / 1e3, e.count / steps, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    classes = {}
    for ms, _, name in rows:
        n = name.lower()
        cls = ("gemm" if any(k in n for k in ("gemm", "cutlass", "sm90_xmma", "nvjet", "matmul"))
               else "attention" if any(k in n for k in ("flash", "fmha", "attention"))
               else "optimizer" if any(k in n for k in ("adam", "multi_tensor", "foreach"))
               else "other")
        classes[cls] = classes.get(cls, 0) + ms
    print(f"# kernel time per step {total:.3f} ms: " +
          ", ".join(f"{k} {v:.3f}" for k, v in sorted(classes.items(), key=lambda kv: -kv[1])))
    for ms, calls, name in rows[:top]:
        print(f"  {ms:8.3f} ms {calls:6.1f}x  {name[:110]}")


def run(mode, mb, T, steps, warmup, profile=0, preset="gpt2-124m", linears="bf16"):
    torch.manual_seed(0)
    L, H, C = PRESETS[preset]
    model = GPT(L=L, H=H, C=C, T=T).cuda()
    if linears == "float8":  # the blocks' c_attn, c_proj, c_fc, mlp_proj; not the tied head
        from torch_float8 import float8_linears  # same directory
        float8_linears(model, lambda name, m: name.startswith("h."))
    # MFU counts the unpadded vocabulary, as meshtrain does.
    n_params = sum(p.numel() for p in model.parameters()) - model.wte.weight.numel() + 50257 * C
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    x = torch.randint(0, 50257, (mb, T), device="cuda")
    y = torch.randint(0, 50257, (mb, T), device="cuda")

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
    # The device's used memory as meshtrain reports it (cudaMemGetInfo: total - free, so the
    # CUDA context, library workspaces and the caching allocator's reserve count too): the
    # allocator keeps what it reserved, so after the timed steps this is the run's peak.
    free_b, total_b = torch.cuda.mem_get_info()
    device_gib = (total_b - free_b) / 2**30
    times.sort()
    dt = times[len(times) // 2]
    tok = mb * T / dt
    flops = 6 * n_params + 12 * L * C * T
    print(f"pytorch-{mode:8s} {linears:6s} {preset} mb {mb:3d}: {tok:10.0f} tok/s  {dt * 1e3:8.1f} ms/step  "
          f"MFU {tok * flops / 989e12:.3f}  peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB  "
          f"device {device_gib:.1f} GiB", flush=True)
    if profile:
        from torch.profiler import profile as tprofile, ProfilerActivity
        with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(profile):
                step()
            torch.cuda.synchronize()
        kernel_table(prof, profile)
    del model, opt, fwd
    torch.cuda.empty_cache()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt2-124m", choices=sorted(PRESETS))
    ap.add_argument("--micro-batch", default="16")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--mode", default="eager,compile")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0,
                    help="then profile this many steps and print CUDA time per kernel")
    ap.add_argument("--linears", default="bf16",
                    help="bf16 and/or float8 (the blocks' linears on torch._scaled_mm)")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if "float8" in a.linears:
        from torch_float8 import self_check
        self_check()
    for linears in a.linears.split(","):
        for mode in a.mode.split(","):
            for mb in (int(m) for m in a.micro_batch.split(",")):
                run(mode, mb, a.seq, a.steps, a.warmup, a.profile, a.preset, linears)
