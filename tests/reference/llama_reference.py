#!/usr/bin/env python3
"""PyTorch reference for meshtrain's Llama-family model: writes the tiny test fixture.

Regenerate with (from the repository root; Debian's python3-torch and python3-numpy):

    /usr/bin/python3 tests/reference/llama_reference.py --out tests/fixtures/llama_tiny_v1.safetensors

Plain torch + numpy only (no transformers, no safetensors package), written from the semantics
of HuggingFace's LlamaForCausalLM (transformers/models/llama/modeling_llama.py): RMSNorm,
rotary embedding in the rotate_half convention, grouped-query attention, SwiGLU MLP, untied LM
head, no biases. Everything the fixture holds is computed in float64 and stored as float32,
except the rotary frequencies and angles, which HF computes in float32 whatever the model's
dtype: the reference does the same, so a float64 HF model computes exactly this function (up to
its RMSNorm, which HF evaluates in float32; see tests/reference/README.md).

What the script does:
  1. builds a tiny Llama (n_layer 2, hidden 32, 4 query heads, 2 key-value heads, head size 8,
     intermediate 48, vocab 61 padded to 64, untied head, rope_theta 1e4) with numpy-generated
     parameters (seed 1234), HuggingFace names and nn.Linear shapes [out, in];
  2. forward + backward in float64 on one batch (B=2, T=16) -> logits, loss, grads; the same
     with Llama 3 rope scaling (logits, loss, grads under `llama3.`);
  3. 10 steps of AdamW (float64) on 10 more batches with meshtrain's global-norm clip;
  4. self-checks: finite differences of gradient entries of every kind of parameter, the
     grouped-query attention against multi-head attention with repeated k/v weights, the
     rotation against the complex-number form of RoPE, torch AdamW against a textbook AdamW, a
     float32 re-run (measured fp32-vs-fp64 deviations) and a re-read of the written file;
  5. writes the fixture as safetensors with a small pure-Python writer.
"""

import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_reference import (TextbookAdamW, clip_scale, load_safetensors, rel_elementwise,  # noqa: E402
                            rel_maxabs, save_safetensors)

FORMAT = "meshtrain-llama-fixture"
VERSION = "1"

CFG = dict(
    n_layer=2,
    hidden=32,
    n_head=4,
    n_kv_head=2,            # grouped-query attention: 2 query heads per key-value head
    head_size=8,
    intermediate=48,        # SwiGLU's own width (not 4 * hidden)
    vocab_size=61,          # real vocabulary (deliberately odd)
    padded_vocab_size=64,   # meshtrain pads to a multiple of 64; the fixture stores 61 rows
    block_size=16,
    B=2,
    T=16,
    rms_eps=1e-5,
    rope_theta=10000.0,
    seed=1234,
)
# Llama 3 frequency scaling for the `llama3.` variant. original_max_position_embeddings 64 puts
# the 4 frequencies of head size 8 (wavelengths 6.3, 63, 628, 6283) into all three bands: kept
# (< 64/4), interpolated ([16, 64]) and divided by the factor (> 64/1).
LLAMA3_SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=64)
TRAIN = dict(steps=10, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_norm=1.0)
IGNORED = [(0, 5), (1, 15)]  # (batch row, position) with target -1


def param_shapes(cfg):
    """Ordered (name, shape) list: HF Llama names, nn.Linear weights [out, in]."""
    C, V, L, I = cfg["hidden"], cfg["vocab_size"], cfg["n_layer"], cfg["intermediate"]
    q_out, kv_out = cfg["n_head"] * cfg["head_size"], cfg["n_kv_head"] * cfg["head_size"]
    out = [("model.embed_tokens.weight", (V, C))]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (C,)),
            (p + "self_attn.q_proj.weight", (q_out, C)),
            (p + "self_attn.k_proj.weight", (kv_out, C)),
            (p + "self_attn.v_proj.weight", (kv_out, C)),
            (p + "self_attn.o_proj.weight", (C, q_out)),
            (p + "post_attention_layernorm.weight", (C,)),
            (p + "mlp.gate_proj.weight", (I, C)),
            (p + "mlp.up_proj.weight", (I, C)),
            (p + "mlp.down_proj.weight", (C, I)),
        ]
    out += [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]
    return out


def decays(name, shape):
    """Weight decay on the 2-D tensors: every projection, embed_tokens and lm_head; not the
    RMSNorm weights."""
    return len(shape) == 2


def make_params(cfg, rng):
    """float64 numpy draws in param_shapes() order, rounded to float32 (the stored values)."""
    scale_proj = 1.0 / math.sqrt(2 * cfg["n_layer"])
    params = {}
    for name, shape in param_shapes(cfg):
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            a = 1.0 + rng.normal(0.0, 0.1, size=shape)
        else:
            a = rng.normal(0.0, 0.02, size=shape)
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                a = a * scale_proj
        params[name] = a.astype(np.float32)
    return params


def make_batch(cfg, rng, nbatch=None):
    B, T, V = cfg["B"], cfg["T"], cfg["vocab_size"]
    shape = (B, T + 1) if nbatch is None else (nbatch, B, T + 1)
    seq = rng.integers(0, V, size=shape).astype(np.int32)
    inputs = np.ascontiguousarray(seq[..., :T])
    targets = np.ascontiguousarray(seq[..., 1:])
    for b, t in IGNORED:
        targets[..., b, t] = -1
    return inputs, targets


# ---------------------------------------------------------------- rotary tables (float32, HF)
def rope_inv_freq(cfg, scaling=None):
    """HF's _compute_default_rope_parameters and _compute_llama3_parameters, in float32 as HF
    runs them (torch tensor ops, Python scalars)."""
    dim, base = cfg["head_size"], cfg["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_cos_sin(inv_freq, T):
    """LlamaRotaryEmbedding.forward: fp32 angles position * inv_freq (a matmul with K = 1),
    cos/sin of [freqs, freqs] in fp32 (attention scaling 1 for default and llama3 rope)."""
    inv = inv_freq[None, :, None].float()
    pos = torch.arange(T, dtype=torch.int64)[None, None, :].float()
    freqs = (inv @ pos).transpose(1, 2)[0]            # [T, HS/2]
    emb = torch.cat((freqs, freqs), dim=-1)           # [T, HS]
    return emb.cos(), emb.sin()


# ---------------------------------------------------------------- model
def rmsnorm(x, w, eps):
    """LlamaRMSNorm in the model's dtype: w * (x * rsqrt(mean(x^2) + eps))."""
    var = (x * x).mean(dim=-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, cos, sin):
    """x: [B, heads, T, HS]; cos/sin: [T, HS] (HF's apply_rotary_pos_emb)."""
    return x * cos + rotate_half(x) * sin


def attention(h, P, p, cfg, cos, sin):
    B, T, _ = h.shape
    nh, nkv, hs = cfg["n_head"], cfg["n_kv_head"], cfg["head_size"]
    q = (h @ P[p + "self_attn.q_proj.weight"].t()).view(B, T, nh, hs).transpose(1, 2)
    k = (h @ P[p + "self_attn.k_proj.weight"].t()).view(B, T, nkv, hs).transpose(1, 2)
    v = (h @ P[p + "self_attn.v_proj.weight"].t()).view(B, T, nkv, hs).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    # repeat_kv: query head j uses key-value head j // (nh / nkv)
    k = k.repeat_interleave(nh // nkv, dim=1)
    v = v.repeat_interleave(nh // nkv, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, nh * hs)
    return y @ P[p + "self_attn.o_proj.weight"].t()


def mlp(h, P, p):
    gate = h @ P[p + "mlp.gate_proj.weight"].t()
    up = h @ P[p + "mlp.up_proj.weight"].t()
    return (F.silu(gate) * up) @ P[p + "mlp.down_proj.weight"].t()


def forward(P, inputs, targets, cfg, cos, sin):
    """P: name -> tensor; cos/sin [T, HS] in P's dtype. Returns (logits, loss)."""
    eps = cfg["rms_eps"]
    x = P["model.embed_tokens.weight"][inputs]
    for i in range(cfg["n_layer"]):
        p = f"model.layers.{i}."
        x = x + attention(rmsnorm(x, P[p + "input_layernorm.weight"], eps), P, p, cfg, cos, sin)
        x = x + mlp(rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps), P, p)
    x = rmsnorm(x, P["model.norm.weight"], eps)
    logits = x @ P["lm_head.weight"].t()             # untied head
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=-1, reduction="mean")
    return logits, loss


def to_torch_params(np_params, dtype):
    return {k: torch.tensor(v.astype(np.float64), dtype=dtype, requires_grad=True)
            for k, v in np_params.items()}


def tables(cfg, dtype, scaling=None):
    cos, sin = rope_cos_sin(rope_inv_freq(cfg, scaling), cfg["T"])
    return cos.to(dtype), sin.to(dtype)


def loss_and_grads(P, inputs, targets, cfg, cos, sin):
    for t in P.values():
        t.grad = None
    logits, loss = forward(P, torch.from_numpy(inputs).long(), torch.from_numpy(targets).long(),
                           cfg, cos, sin)
    loss.backward()
    return logits.detach(), loss.detach(), {k: t.grad.detach().clone() for k, t in P.items()}


# ---------------------------------------------------------------- training
def train(np_params, tr_inputs, tr_targets, cfg, hp, dtype, check_textbook=False):
    P = to_torch_params(np_params, dtype)
    cos, sin = tables(cfg, dtype)
    names = list(P.keys())
    shapes = dict(param_shapes(cfg))
    decay_names = {n for n in names if decays(n, shapes[n])}
    groups = [
        {"params": [P[n] for n in names if n in decay_names], "weight_decay": hp["weight_decay"]},
        {"params": [P[n] for n in names if n not in decay_names], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"], amsgrad=False)
    textbook = None
    if check_textbook:
        textbook = TextbookAdamW({n: P[n].detach().numpy().astype(np.float64) for n in names},
                                 hp, decay_names)
    losses, norms, worst_textbook = [], [], 0.0
    for s in range(hp["steps"]):
        for t in P.values():
            t.grad = None
        _, loss = forward(P, torch.from_numpy(tr_inputs[s]).long(),
                          torch.from_numpy(tr_targets[s]).long(), cfg, cos, sin)
        loss.backward()
        with torch.no_grad():
            norm = torch.sqrt(sum((P[n].grad ** 2).sum() for n in names))
            scale = clip_scale(float(norm), hp["max_norm"])
            for n in names:
                P[n].grad.mul_(scale)
        losses.append(float(loss))
        norms.append(float(norm))
        if textbook is not None:
            textbook.step({n: P[n].grad.numpy().astype(np.float64) for n in names})
        opt.step()
        if textbook is not None:
            d = max(float(np.abs(textbook.p[n] - P[n].detach().numpy()).max()) for n in names)
            worst_textbook = max(worst_textbook, d)
    final = {n: P[n].detach().clone() for n in names}
    return np.array(losses), np.array(norms), final, worst_textbook, decay_names


# ---------------------------------------------------------------- checks
def finite_difference_check(np_params, inputs, targets, grads, cfg, cos, sin, label):
    """Central differences in float64; worst error as a multiple of 1e-6*|g| + 1e-10."""
    probes = [
        ("model.embed_tokens.weight", (int(inputs[0, 3]), 7)),
        ("model.layers.0.input_layernorm.weight", (3,)),
        ("model.layers.0.self_attn.q_proj.weight", (13, 4)),    # query head 1
        ("model.layers.1.self_attn.k_proj.weight", (9, 20)),    # kv head 1, shared by q heads 2, 3
        ("model.layers.0.self_attn.v_proj.weight", (2, 30)),
        ("model.layers.1.self_attn.o_proj.weight", (5, 27)),
        ("model.layers.1.post_attention_layernorm.weight", (17,)),
        ("model.layers.0.mlp.gate_proj.weight", (40, 11)),
        ("model.layers.1.mlp.up_proj.weight", (3, 29)),
        ("model.layers.0.mlp.down_proj.weight", (31, 47)),
        ("model.norm.weight", (12,)),
        ("lm_head.weight", (60, 0)),
    ]
    base = {k: torch.tensor(v.astype(np.float64)) for k, v in np_params.items()}
    ti, tt = torch.from_numpy(inputs).long(), torch.from_numpy(targets).long()
    h, worst = 1e-5, 0.0
    print(f"finite-difference check ({label}, float64, central, h=1e-5):")
    for name, idx in probes:
        Pp = {k: v.clone() for k, v in base.items()}
        Pm = {k: v.clone() for k, v in base.items()}
        Pp[name][idx] += h
        Pm[name][idx] -= h
        with torch.no_grad():
            lp = float(forward(Pp, ti, tt, cfg, cos, sin)[1])
            lm = float(forward(Pm, ti, tt, cfg, cos, sin)[1])
        fd = (lp - lm) / (2 * h)
        ad = float(grads[name][idx])
        err = abs(fd - ad)
        worst = max(worst, err / (1e-6 * abs(ad) + 1e-10))
        print(f"  {name}{list(idx)}: autograd {ad:+.10e}  fd {fd:+.10e}  abs {err:.1e}")
    return worst


def gqa_check(np_params, inputs, targets, cfg, cos, sin, logits):
    """Grouped-query attention equals multi-head attention whose k/v projections repeat each
    key-value head's rows for its query heads: pins the head-to-group map j -> j // rep."""
    rep = cfg["n_head"] // cfg["n_kv_head"]
    hs = cfg["head_size"]
    mha = dict(cfg, n_kv_head=cfg["n_head"])
    P = {k: torch.tensor(v.astype(np.float64)) for k, v in np_params.items()}
    for i in range(cfg["n_layer"]):
        for w in ("k_proj", "v_proj"):
            name = f"model.layers.{i}.self_attn.{w}.weight"
            heads = P[name].view(cfg["n_kv_head"], hs, -1)
            P[name] = heads.repeat_interleave(rep, dim=0).reshape(cfg["n_head"] * hs, -1)
    with torch.no_grad():
        ref = forward(P, torch.from_numpy(inputs).long(), torch.from_numpy(targets).long(), mha,
                      cos, sin)[0]
    return float((ref - logits).abs().max())


def rope_complex_check(cfg):
    """The rotate_half rotation equals multiplying the complex numbers x_i + i x_{i+HS/2} by
    exp(i * angle) (the original RoPE form in that pairing)."""
    g = torch.Generator().manual_seed(7)
    T, hs = cfg["T"], cfg["head_size"]
    x = torch.randn(1, 3, T, hs, dtype=torch.float64, generator=g)
    inv = rope_inv_freq(cfg, LLAMA3_SCALING)
    cos, sin = rope_cos_sin(inv, T)
    y = apply_rope(x, cos.double(), sin.double())
    rot = torch.complex(cos[:, : hs // 2].double(), sin[:, : hs // 2].double())  # exp(i angle)
    z = torch.complex(x[..., : hs // 2], x[..., hs // 2:]) * rot
    return float((torch.cat((z.real, z.imag), dim=-1) - y).abs().max())


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/llama_tiny_v1.safetensors")
    ap.add_argument("--skip-checks", action="store_true",
                    help="skip the finite-difference and float32 deviation checks")
    args = ap.parse_args()

    torch.set_num_threads(1)          # fixed summation order: the fixture is bit-reproducible
    cfg, hp = CFG, TRAIN
    rng = np.random.default_rng(cfg["seed"])
    np_params = make_params(cfg, rng)
    inputs, targets = make_batch(cfg, rng)
    tr_inputs, tr_targets = make_batch(cfg, rng, hp["steps"])
    cos64, sin64 = tables(cfg, torch.float64)
    cos64_l3, sin64_l3 = tables(cfg, torch.float64, LLAMA3_SCALING)

    P64 = to_torch_params(np_params, torch.float64)
    logits64, loss64, grads64 = loss_and_grads(P64, inputs, targets, cfg, cos64, sin64)
    print(f"loss (float64) = {float(loss64):.12f}   (ln(61) = {math.log(61):.6f})")
    P64 = to_torch_params(np_params, torch.float64)
    logits_l3, loss_l3, grads_l3 = loss_and_grads(P64, inputs, targets, cfg, cos64_l3, sin64_l3)
    print(f"loss with llama3 rope scaling (float64) = {float(loss_l3):.12f}; max |logits - "
          f"default rope's| = {float((logits_l3 - logits64).abs().max()):.3e}")
    assert float((logits_l3 - logits64).abs().max()) > 1e-4, "llama3 scaling changed nothing"
    g_moved = max(((rel_maxabs(grads_l3[n], grads64[n]), n) for n in grads64))
    print(f"llama3 rope scaling moves the gradients by up to {g_moved[0]:.3e} of the tensor's "
          f"max|g| ({g_moved[1]})")

    losses64, norms64, final64, tb_diff, decay_names = train(
        np_params, tr_inputs, tr_targets, cfg, hp, torch.float64, check_textbook=True)
    print("train losses (float64):", " ".join(f"{x:.6f}" for x in losses64))
    print("train grad norms (float64, pre-clip):", " ".join(f"{x:.4f}" for x in norms64))
    print(f"torch.optim.AdamW vs textbook AdamW (float64), max |dp| over 10 steps: {tb_diff:.3e}")
    assert tb_diff < 1e-14, "torch AdamW does not match the textbook formula"
    print("decayed:", ", ".join(sorted(n for n in decay_names if "layers.1" not in n)))

    gqa = gqa_check(np_params, inputs, targets, cfg, cos64, sin64, logits64)
    print(f"GQA vs MHA with repeated k/v weights: max |logits diff| = {gqa:.3e}")
    assert gqa < 1e-14, "grouped-query attention does not map query head j to kv head j // rep"
    rc = rope_complex_check(cfg)
    print(f"rotate_half rope vs the complex-number form: max diff = {rc:.3e}")
    assert rc < 1e-14, "rotary embedding does not match its complex form"

    deviations = {}
    if not args.skip_checks:
        for label, (grads, c, s) in {"default rope": (grads64, cos64, sin64),
                                     "llama3 rope": (grads_l3, cos64_l3, sin64_l3)}.items():
            fd_worst = finite_difference_check(np_params, inputs, targets, grads, cfg, c, s, label)
            print(f"finite differences ({label}): worst error = {fd_worst:.3f} x allowed")
            assert fd_worst < 1.0, "finite-difference check failed"

        P32 = to_torch_params(np_params, torch.float32)
        cos32, sin32 = tables(cfg, torch.float32)
        logits32, loss32, grads32 = loss_and_grads(P32, inputs, targets, cfg, cos32, sin32)
        losses32, norms32, final32, _, _ = train(np_params, tr_inputs, tr_targets, cfg, hp,
                                                 torch.float32)
        g_worst = max(((rel_maxabs(grads32[n], grads64[n]), n) for n in grads64))
        f_worst = max(((rel_maxabs(final32[n], final64[n]), n) for n in final64))
        f_abs = max(float((final32[n].double() - final64[n]).abs().max()) for n in final64)
        moved = max(float((final64[n] - torch.from_numpy(np_params[n].astype(np.float64)))
                          .abs().max()) for n in final64)
        deviations = {
            "logits (rel. to max|logits|)": rel_maxabs(logits32, logits64),
            "logits (elementwise rel., max)": rel_elementwise(logits32, logits64),
            "loss (rel.)": rel_elementwise(float(loss32), float(loss64)),
            "grads (max over tensors, rel. to tensor max|g|)": g_worst[0],
            "train.losses (elementwise rel., max)": rel_elementwise(losses32, losses64),
            "train.grad_norms (elementwise rel., max)": rel_elementwise(norms32, norms64),
            "train.final (max over tensors, rel. to tensor max|p|)": f_worst[0],
            "train.final (max abs diff)": f_abs,
        }
        print("float32 vs float64 (torch CPU, same inputs):")
        for k, v in deviations.items():
            print(f"  {k:58s} {v:.3e}")
        print(f"  worst grad tensor: {g_worst[1]}; worst final tensor: {f_worst[1]}")
        print("  per-tensor grad deviation (rel. to tensor max|g|):")
        for n in grads64:
            print(f"    {n:48s} {rel_maxabs(grads32[n], grads64[n]):.2e}")
        print(f"  (largest parameter change over the 10 steps: {moved:.3e}; lr*steps = "
              f"{hp['lr'] * hp['steps']:.1e})")

    f32 = lambda t: np.ascontiguousarray(
        (t.detach().numpy() if torch.is_tensor(t) else np.asarray(t)).astype(np.float32))
    out = {}
    for n, a in np_params.items():
        out["param." + n] = a
        out["grad." + n] = f32(grads64[n])
        out["train.final." + n] = f32(final64[n])
        out["llama3.grad." + n] = f32(grads_l3[n])
    half = cfg["head_size"] // 2
    for prefix, scaling in (("rope.", None), ("llama3.rope.", LLAMA3_SCALING)):
        inv = rope_inv_freq(cfg, scaling)
        c, s = rope_cos_sin(inv, cfg["T"])
        out[prefix + "inv_freq"] = f32(inv)
        out[prefix + "cos"] = f32(c[:, :half])
        out[prefix + "sin"] = f32(s[:, :half])
    out["batch.inputs"] = inputs
    out["batch.targets"] = targets
    out["logits"] = f32(logits64)
    out["loss"] = np.array([float(loss64)], dtype=np.float32)
    out["llama3.logits"] = f32(logits_l3)
    out["llama3.loss"] = np.array([float(loss_l3)], dtype=np.float32)
    out["train.inputs"] = tr_inputs
    out["train.targets"] = tr_targets
    out["train.losses"] = f32(losses64)
    out["train.grad_norms"] = f32(norms64)

    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "architecture": "LlamaForCausalLM semantics (HF transformers modeling_llama.py), "
                        "attention_bias=False, mlp_bias=False, tie_word_embeddings=False",
        "n_layer": cfg["n_layer"],
        "hidden_size": cfg["hidden"],
        "n_head": cfg["n_head"],
        "n_kv_head": cfg["n_kv_head"],
        "head_size": cfg["head_size"],
        "intermediate_size": cfg["intermediate"],
        "vocab_size": cfg["vocab_size"],
        "padded_vocab_size": cfg["padded_vocab_size"],
        "block_size": cfg["block_size"],
        "B": cfg["B"],
        "T": cfg["T"],
        "rms_norm_eps": repr(cfg["rms_eps"]),
        "rope_theta": repr(cfg["rope_theta"]),
        "llama3.rope_scaling": repr(LLAMA3_SCALING),
        "rmsnorm": "w * (x * rsqrt(mean(x^2) + eps)), in float64",
        "rope": "HF rotate_half: pairs (i, i + HS/2) of each head; inv_freq, angles pos*inv_freq "
                "and cos/sin in float32 as HF computes them (rope.*, llama3.rope.*: [T, HS/2]), "
                "then used in float64",
        "attention": "causal softmax of q k^T / sqrt(head_size); q_proj rows [h*hs, (h+1)*hs) "
                     "are query head h, k_proj/v_proj rows likewise for kv heads; query head j "
                     "uses kv head j // (n_head / n_kv_head)",
        "mlp": "down_proj(silu(gate_proj(x)) * up_proj(x))",
        "lm_head": "untied: logits = norm(x) @ lm_head.weight^T (61 real rows stored)",
        "weight_layout": "nn.Linear: weights are [out, in], y = x @ W^T",
        "loss": "mean cross-entropy over positions with target >= 0 (ignore_index=-1)",
        "ignored_targets": "batch.targets[0][5], batch.targets[1][15], train.targets[:,0,5], "
                           "train.targets[:,1,15] are -1",
        "init": "numpy default_rng(seed) in param order; weights N(0,0.02), o_proj and down_proj "
                "scaled by 1/sqrt(2*n_layer); RMSNorm weights 1+N(0,0.1); rounded to float32",
        "seed": cfg["seed"],
        "compute_dtype": "float64 (stored as float32)",
        "train_steps": hp["steps"],
        "lr": repr(hp["lr"]),
        "lr_schedule": "constant",
        "beta1": repr(hp["beta1"]),
        "beta2": repr(hp["beta2"]),
        "adam_eps": repr(hp["eps"]),
        "weight_decay": repr(hp["weight_decay"]),
        "weight_decay_params": "2-D tensors only: embed_tokens, lm_head and every q/k/v/o/gate/"
                               "up/down_proj weight; none on the RMSNorm weights",
        "adamw": "torch.optim.AdamW (decoupled), as gpt2_tiny_v1: p=p*(1-lr*wd); "
                 "p=p-lr*mhat/(sqrt(vhat)+eps)",
        "grad_clip": "scale=max_norm/max(norm,max_norm) on the global norm of the mean loss's "
                     "gradient (NOT clip_grad_norm_'s max_norm/(norm+1e-6))",
        "max_norm": repr(hp["max_norm"]),
        "train_losses": "train.losses[s]: loss of step s before that step's update",
        "train_grad_norms": "train.grad_norms[s]: global norm before clipping",
        "llama3": "llama3.logits, llama3.loss, llama3.grad.*: the same batch and parameters with "
                  "llama3.rope_scaling (no training)",
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "command": "python3 " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
    }
    for k, v in deviations.items():
        metadata["measured_fp32_deviation: " + k] = f"{v:.3e}"

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_safetensors(args.out, out, metadata)
    back, meta_back = load_safetensors(args.out)
    assert set(back) == set(out), "tensor names differ after re-reading"
    for n, a in out.items():
        assert back[n].dtype == a.dtype and back[n].shape == a.shape, n
        assert np.array_equal(back[n].view(np.uint32), a.view(np.uint32)), n
    assert meta_back == {k: str(v) for k, v in metadata.items()}, "metadata differs"
    print(f"wrote {args.out}: {len(out)} tensors, {os.path.getsize(args.out)} bytes; round trip OK")


if __name__ == "__main__":
    main()
