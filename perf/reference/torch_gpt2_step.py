#!/usr/bin/env python3
"""The PyTorch reference for perf/bench/bench_train_step: one GPT-2 training step of a preset's shapes
(float32, one thread), the same math as meshtrain (tests/reference/gpt2_reference.py): tanh-GELU,
LayerNorm eps 1e-5, LM head tied to wte, HF Conv1D weights [in, out] used through addmm, causal
attention, AdamW betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on 2-D weights only, gradient
clipping at global norm 1.0. Random tokens, no dataset.

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python3 perf/reference/torch_gpt2_step.py \
        [--preset cpu-bench] [--micro-batch 8] [--steps 10] [--warmup 2]

Prints median/mean step time and tokens/s, and a "RESULT torch ..." line for perf/cpu/step_vs_torch.sh.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

# Shapes of src/model/config.cpp's presets: (n_layer, n_head, n_embd, vocab, vocab_pad, block).
PRESETS = {
    "cpu-bench": (4, 4, 256, 4096, 64, 128),
    "demo": (4, 4, 128, 256, 64, 128),
    "gpt2-124m": (12, 12, 768, 50257, 128, 1024),
}

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")  # PyTorch >= 2.0


def causal_attention(q, k, v, mask):
    """q, k, v: [B, NH, T, HS]."""
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    att = att.masked_fill(mask, float("-inf"))
    return F.softmax(att, dim=-1) @ v


class Gpt2(torch.nn.Module):
    def __init__(self, L, NH, C, V, pad, T):
        super().__init__()
        Vp = (V + pad - 1) // pad * pad
        self.L, self.NH, self.C, self.V, self.Vp = L, NH, C, V, Vp
        p = torch.nn.Parameter
        std, rstd = 0.02, 0.02 / math.sqrt(2 * L)
        wte = torch.randn(Vp, C) * std
        wte[V:] = 0  # padding rows, as in meshtrain
        self.wte, self.wpe = p(wte), p(torch.randn(T, C) * std)
        self.blocks = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.ln1_w, b.ln1_b = p(torch.ones(C)), p(torch.zeros(C))
            b.attn_w, b.attn_b = p(torch.randn(C, 3 * C) * std), p(torch.zeros(3 * C))
            b.proj_w, b.proj_b = p(torch.randn(C, C) * rstd), p(torch.zeros(C))
            b.ln2_w, b.ln2_b = p(torch.ones(C)), p(torch.zeros(C))
            b.fc_w, b.fc_b = p(torch.randn(C, 4 * C) * std), p(torch.zeros(4 * C))
            b.fcproj_w, b.fcproj_b = p(torch.randn(4 * C, C) * rstd), p(torch.zeros(C))
            self.blocks.append(b)
        self.lnf_w, self.lnf_b = p(torch.ones(C)), p(torch.zeros(C))
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

    def forward(self, idx, targets):
        B, T = idx.shape
        C, NH = self.C, self.NH
        x = (self.wte[idx] + self.wpe[:T]).view(B * T, C)
        mask = self.mask[:T, :T]
        for b in self.blocks:
            h = F.layer_norm(x, (C,), b.ln1_w, b.ln1_b, 1e-5)
            qkv = torch.addmm(b.attn_b, h, b.attn_w).view(B, T, 3, NH, C // NH)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, NH, T, HS] each
            y = causal_attention(q, k, v, mask).transpose(1, 2).reshape(B * T, C)
            x = x + torch.addmm(b.proj_b, y, b.proj_w)
            h = F.layer_norm(x, (C,), b.ln2_w, b.ln2_b, 1e-5)
            h = F.gelu(torch.addmm(b.fc_b, h, b.fc_w), approximate="tanh")
            x = x + torch.addmm(b.fcproj_b, h, b.fcproj_w)
        x = F.layer_norm(x, (C,), self.lnf_w, self.lnf_b, 1e-5)
        logits = x @ self.wte.t()  # tied head
        if self.Vp > self.V:  # padding columns are masked out of the softmax
            logits = logits[:, : self.V]
        return F.cross_entropy(logits, targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="cpu-bench", choices=sorted(PRESETS))
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    L, NH, C, V, pad, block = PRESETS[a.preset]
    B, T = a.micro_batch, a.seq_len or block
    model = Gpt2(L, NH, C, V, pad, block)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    kw = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    try:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}], foreach=True, **kw)
        impl = "foreach"
    except TypeError:  # PyTorch < 1.12 has no foreach argument
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}], **kw)
        impl = "for-loop"
    tokens = torch.randint(0, V, (B * T + 1,))
    idx, targets = tokens[:-1].view(B, T), tokens[1:].view(B, T)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    attn = ("F.scaled_dot_product_attention(is_causal=True)" if HAS_SDPA
            else "explicit masked softmax (q @ k^T, masked_fill, softmax, @ v)")
    print(f"# torch_gpt2_step: PyTorch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{a.preset} (L={L}, NH={NH}, C={C}, Vp={model.Vp}), micro-batch {B} x seq {T} = "
          f"{B * T} tokens/step, float32")
    print(f"# attention: {attn}; AdamW {impl}; "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters (wte once)")
    for _ in range(a.warmup):
        step()
    ms = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        ms.append((time.perf_counter() - t0) * 1e3)
    med, mean = statistics.median(ms), statistics.fmean(ms)
    print(f"step_ms: median {med:.2f}  mean {mean:.2f}  min {min(ms):.2f}  "
          f"({a.steps} steps after {a.warmup} warmup)")
    print(f"tokens/s: {B * T / med * 1e3:.0f} (median step)   loss of the last step "
          f"{loss.item():.4f}")
    print(f"RESULT torch median_ms={med:.3f} mean_ms={mean:.3f} tokens_per_s={B * T / med * 1e3:.1f}")


if __name__ == "__main__":
    main()
