#!/usr/bin/env python3
"""PyTorch reference for the Llama GPU benchmark (issue 19): training steps of meshtrain's
llama-150m and llama3.2-1b presets (bf16 autocast, fp32 master weights, fused AdamW), eager with
SDPA attention and/or torch.compile, random tokens, sequence 2048.

    python3 perf/reference/torch_llama_gpu.py --preset llama3.2-1b --micro-batch 4,8 --mode compile,eager
    python3 perf/reference/torch_llama_gpu.py --preset llama-150m --micro-batch 8,16 --profile 3
    python3 perf/reference/torch_llama_gpu.py --preset llama3.1-8b --layers 4 --seq 4096 \
        --micro-batch 1 --mode compile --linears bf16,float8

`--linears float8` runs every block's linear (q, k, v, o, gate, up, down) on torch._scaled_mm
with dynamic tensorwise scaling, E4M3 forward and E5M2 gradients (torch_float8.py, the reference
of issue 35); the embedding, the LM head, attention and the norms stay bf16. `--layers` cuts the
preset to its first N blocks (the 8B-shaped stack).

Prints one line per (mode, micro-batch): tokens/s, ms/step, MFU, peak memory (the caching
allocator's max allocated) and the device's used memory (total - free, as meshtrain reports
it). The model is meshtrain's (src/model/llama_block.cpp, model::preset), written from HF LlamaForCausalLM's
semantics: RMSNorm (eps 1e-5, weight times x * rsqrt(mean(x^2) + eps)), rotary embedding with
HF's rotate_half pairs (i, i + head_dim / 2) and Llama 3's frequency scaling where the preset
has it, grouped-query attention (SDPA, causal; kv heads shared by n_head / n_kv_head query
heads), SwiGLU (down(silu(gate(x)) * up(x)) with separate gate and up projections), no biases,
tied or untied head as the preset, vocabulary padded to a multiple of 128 as meshtrain pads it.
MFU counts meshtrain's FLOPs per token (GptConfig::flops_per_token: 6 N + 12 L (H head_dim) T,
N the parameters without padding, a tied head once) against the H200's 989 TFLOP/s dense bf16.
AdamW (0.9, 0.95), eps 1e-8, weight decay 0.1 on 2-D weights, gradient clipping at 1.0.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# model::preset's Llama shapes (src/model/config.cpp): layers, heads, kv heads, hidden,
# intermediate, vocabulary, tied head, rope theta, Llama 3 scaling factor (None: none).
PRESETS = {
    "llama-150m": dict(L=12, H=12, KV=4, C=768, I=2048, V=50257, tied=False, theta=5e5,
                       factor=None),
    "llama3.2-1b": dict(L=16, H=32, KV=8, C=2048, I=8192, V=128256, tied=True, theta=5e5,
                        factor=32.0),
    "llama3.1-8b": dict(L=32, H=32, KV=8, C=4096, I=14336, V=128256, tied=False, theta=5e5,
                        factor=8.0),
}


def rope_inv_freq(head_dim, theta, factor):
    """HF's _compute_default_rope_parameters, then _compute_llama3_parameters (low 1, high 4,
    original 8192) when the preset scales."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if factor is None:
        return inv
    low, high, orig = 1.0, 4.0, 8192
    low_wl, high_wl = orig / low, orig / high
    wavelen = 2 * math.pi / inv
    inv_l = torch.where(wavelen > low_wl, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(medium, smoothed, inv_l)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):  # HF LlamaRMSNorm: fp32 statistics, back to the input dtype
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


class Block(nn.Module):
    def __init__(self, C, H, KV, I):
        super().__init__()
        self.H, self.KV, self.hd = H, KV, C // H
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(C), RMSNorm(C)
        self.q_proj = nn.Linear(C, H * self.hd, bias=False)
        self.k_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.v_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.o_proj = nn.Linear(H * self.hd, C, bias=False)
        self.gate_proj = nn.Linear(C, I, bias=False)
        self.up_proj = nn.Linear(C, I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        try:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        except TypeError:  # torch < 2.5: expand the kv heads
            rep = self.H // self.KV
            y = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1),
                                               v.repeat_interleave(rep, 1), is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, C))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, L, H, KV, C, I, V, tied, theta, factor, T):
        super().__init__()
        Vp = (V + 127) // 128 * 128  # meshtrain's model.vocab_pad 128 for these presets
        self.embed_tokens = nn.Embedding(Vp, C)
        self.layers = nn.ModuleList([Block(C, H, KV, I) for _ in range(L)])
        self.norm = RMSNorm(C)
        self.lm_head = None if tied else nn.Linear(C, Vp, bias=False)
        inv = rope_inv_freq(C // H, theta, factor)
        ang = torch.arange(T, dtype=torch.int64).float()[:, None] * inv[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos()[None, None], persistent=False)
        self.register_buffer("sin", emb.sin()[None, None], persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed_tokens(idx)
        cos, sin = self.cos[:, :, :T].to(x.dtype), self.sin[:, :, :T].to(x.dtype)
        for b in self.layers:
            x = b(x, cos, sin)
        x = self.norm(x)
        logits = x @ (self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight).t()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def flops_per_token(p, T):
    """GptConfig::flops_per_token (src/model/config.cpp) for the preset."""
    C, L, H, KV, I, V = p["C"], p["L"], p["H"], p["KV"], p["I"], p["V"]
    hd = C // H
    per_block = 2 * C + C * (H * hd + 2 * KV * hd) + H * hd * C + 3 * C * I
    n = V * C * (1 if p["tied"] else 2) + L * per_block + C
    return n, 6 * n + 12 * L * H * hd * T


def run(preset, mode, mb, T, steps, warmup, profile=0, layers=0, linears="bf16",
        wgrad_bf16=False):
    torch.manual_seed(0)
    p = dict(PRESETS[preset])
    if layers:
        p["L"] = layers
    model = Llama(**p, T=T).cuda()
    if linears == "float8":
        from torch_float8 import float8_linears  # same directory
        n = float8_linears(model, lambda name, m: name.startswith("layers."), wgrad_bf16)
        assert n == 7 * p["L"], n
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    x = torch.randint(0, p["V"], (mb, T), device="cuda")
    y = torch.randint(0, p["V"], (mb, T), device="cuda")

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
    n, flops = flops_per_token(p, T)
    name = preset + (f"[{p['L']} layers]" if layers else "")
    print(f"pytorch-{mode:8s} {linears:6s} {name} ({n / 1e6:.1f}M) mb {mb:3d} seq {T}: "
          f"{tok:10.0f} tok/s  "
          f"{dt * 1e3:8.1f} ms/step  MFU {tok * flops / 989e12:.3f}  "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB  device {device_gib:.1f} GiB", flush=True)
    if profile:
        from torch_gpt2_gpu import kernel_table  # same directory
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
    ap.add_argument("--preset", default="llama3.2-1b", choices=sorted(PRESETS))
    ap.add_argument("--micro-batch", default="4")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--mode", default="compile,eager")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--layers", type=int, default=0, help="the preset's first N blocks only")
    ap.add_argument("--linears", default="bf16",
                    help="bf16 and/or float8 (the blocks' linears on torch._scaled_mm)")
    ap.add_argument("--wgrad-bf16", action="store_true",
                    help="with float8: the weight-gradient GEMM in bf16")
    ap.add_argument("--profile", type=int, default=0,
                    help="then profile this many steps and print CUDA time per kernel")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if "float8" in a.linears:
        from torch_float8 import self_check
        self_check()
    for linears in a.linears.split(","):
        for mode in a.mode.split(","):
            for mb in (int(m) for m in a.micro_batch.split(",")):
                try:
                    run(a.preset, mode, mb, a.seq, a.steps, a.warmup, a.profile, a.layers,
                        linears, a.wgrad_bf16)
                except torch.cuda.OutOfMemoryError:
                    print(f"pytorch-{mode:8s} {linears:6s} {a.preset} mb {mb:3d} seq {a.seq}: "
                          f"out of memory", flush=True)
                    torch.cuda.empty_cache()
