#!/usr/bin/env python3
"""PyTorch reference for meshtrain's GPT-2: writes the tiny test fixture.

Regenerate with (from the repository root):

    python3 tests/reference/gpt2_reference.py --out tests/fixtures/gpt2_tiny_v1.safetensors

Plain torch + numpy only (no transformers, no safetensors package). Everything the fixture
holds is computed in float64 and stored as float32. See tests/reference/README.md for the
tensor list and the tolerances the C++ tests should use.

What the script does:
  1. builds a tiny GPT-2 (n_layer=2, n_head=4, n_embd=32, vocab 61 padded to 64, block 16)
     with numpy-generated parameters (seed 1234), HuggingFace names and Conv1D shapes [in, out];
  2. forward + backward in float64 on one batch (B=2, T=16) -> logits, loss, grads;
  3. 10 steps of AdamW (float64) on 10 more batches with meshtrain's global-norm clip;
  4. self-checks: finite differences of a few gradient entries, torch AdamW vs a hand-written
     textbook AdamW, a float32 re-run of the whole pipeline (measured fp32-vs-fp64 deviations,
     printed; they justify the C++ tolerances), and a re-read of the written file;
  5. writes the fixture as safetensors with a small pure-Python writer.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

FORMAT = "meshtrain-gpt2-fixture"
VERSION = "1"

# ---------------------------------------------------------------- configuration
CFG = dict(
    n_layer=2,
    n_head=4,
    n_embd=32,
    vocab_size=61,          # real vocabulary (deliberately odd)
    padded_vocab_size=64,   # meshtrain pads the vocab to a multiple of 64; fixture stores 61 rows
    block_size=16,
    B=2,
    T=16,
    ln_eps=1e-5,
    seed=1234,
)
TRAIN = dict(
    steps=10,
    lr=1e-3,
    beta1=0.9,
    beta2=0.95,
    eps=1e-8,
    weight_decay=0.1,
    max_norm=1.0,
)
# targets set to -1 (ignored by the loss): (batch row, position)
IGNORED = [(0, 5), (1, 15)]


def param_shapes(cfg):
    """Ordered (name, shape) list, HF GPT-2 names, Conv1D weights as [in, out]."""
    C, V, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_layer"]
    out = [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (cfg["block_size"], C))]
    for i in range(L):
        p = f"transformer.h.{i}."
        out += [
            (p + "ln_1.weight", (C,)),
            (p + "ln_1.bias", (C,)),
            (p + "attn.c_attn.weight", (C, 3 * C)),
            (p + "attn.c_attn.bias", (3 * C,)),
            (p + "attn.c_proj.weight", (C, C)),
            (p + "attn.c_proj.bias", (C,)),
            (p + "ln_2.weight", (C,)),
            (p + "ln_2.bias", (C,)),
            (p + "mlp.c_fc.weight", (C, 4 * C)),
            (p + "mlp.c_fc.bias", (4 * C,)),
            (p + "mlp.c_proj.weight", (4 * C, C)),
            (p + "mlp.c_proj.bias", (C,)),
        ]
    out += [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]
    return out


def decays(name, shape):
    """Weight decay applies to wte, wpe and the c_attn/c_proj/c_fc weights: the 2-D tensors."""
    return name.endswith(".weight") and len(shape) == 2


def make_params(cfg, rng):
    """Parameters generated in float64 by numpy, then rounded to float32 (the stored values);
    the float64 reference starts from exactly those float32 values."""
    scale_proj = 1.0 / math.sqrt(2 * cfg["n_layer"])
    params = {}
    for name, shape in param_shapes(cfg):
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
            a = 1.0 + rng.normal(0.0, 0.1, size=shape)
        elif name.endswith(".bias"):
            a = rng.normal(0.0, 0.02, size=shape)
        else:
            a = rng.normal(0.0, 0.02, size=shape)
            if name.endswith("attn.c_proj.weight") or name.endswith("mlp.c_proj.weight"):
                a = a * scale_proj
        params[name] = a.astype(np.float32)
    return params


def make_batch(cfg, rng, nbatch=None):
    """Random token sequences of length T+1: inputs = seq[:, :T], targets = seq[:, 1:], then
    the IGNORED positions get target -1."""
    B, T, V = cfg["B"], cfg["T"], cfg["vocab_size"]
    shape = (B, T + 1) if nbatch is None else (nbatch, B, T + 1)
    seq = rng.integers(0, V, size=shape).astype(np.int32)
    inputs = np.ascontiguousarray(seq[..., :T])
    targets = np.ascontiguousarray(seq[..., 1:])
    for b, t in IGNORED:
        targets[..., b, t] = -1
    return inputs, targets


# ---------------------------------------------------------------- model
def layernorm(x, w, b, eps):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased variance
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(x, w, b, nh):
    B, T, C = x.shape
    hs = C // nh
    qkv = x @ w + b                                   # [B, T, 3C], columns [q | k | v]
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, nh, hs).transpose(1, 2)          # [B, nh, T, hs], head h = cols [h*hs,(h+1)*hs)
    k = k.view(B, T, nh, hs).transpose(1, 2)
    v = v.view(B, T, nh, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf"))
    att = torch.softmax(att, dim=-1)
    y = att @ v                                       # [B, nh, T, hs]
    return y.transpose(1, 2).contiguous().view(B, T, C)


def forward(P, inputs, targets, cfg):
    """P: dict name -> tensor. inputs/targets: int64 tensors [B, T]. Returns (logits, loss)."""
    B, T = inputs.shape
    eps = cfg["ln_eps"]
    x = P["transformer.wte.weight"][inputs] + P["transformer.wpe.weight"][torch.arange(T)]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        h = layernorm(x, P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
        a = attention(h, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"], cfg["n_head"])
        x = x + (a @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"])
        h = layernorm(x, P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
        h = gelu_tanh(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"])
        x = x + (h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"])
    x = layernorm(x, P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], eps)
    logits = x @ P["transformer.wte.weight"].t()      # tied LM head
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=-1, reduction="mean")
    return logits, loss


def to_torch_params(np_params, dtype):
    return {k: torch.tensor(v.astype(np.float64), dtype=dtype, requires_grad=True)
            for k, v in np_params.items()}


def loss_and_grads(P, inputs, targets, cfg):
    for t in P.values():
        t.grad = None
    logits, loss = forward(P, torch.from_numpy(inputs).long(), torch.from_numpy(targets).long(), cfg)
    loss.backward()
    return logits.detach(), loss.detach(), {k: t.grad.detach().clone() for k, t in P.items()}


# ---------------------------------------------------------------- training
def clip_scale(norm, max_norm):
    """meshtrain's clip: scale = max_norm / max(norm, max_norm) (no +1e-6 as in
    torch.nn.utils.clip_grad_norm_); max_norm <= 0 disables clipping."""
    if max_norm <= 0:
        return 1.0
    return max_norm / max(norm, max_norm)


class TextbookAdamW:
    """Hand-written AdamW, float64 numpy, used only to check torch.optim.AdamW. Implements
    form (b) below; torch implements form (a); they are algebraically identical:
      (a) p <- p * (1 - lr*wd);  p <- p - lr * mhat / (sqrt(vhat) + eps)
      (b) p <- p - lr * (mhat / (sqrt(vhat) + eps) + wd * p)      (p on the right = before step)
    """

    def __init__(self, params, hp, decay_names):
        self.p = {k: v.copy() for k, v in params.items()}
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.hp, self.decay, self.t = hp, decay_names, 0

    def step(self, grads):
        hp = self.hp
        self.t += 1
        b1, b2 = hp["beta1"], hp["beta2"]
        for k, g in grads.items():
            wd = hp["weight_decay"] if k in self.decay else 0.0
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            mhat = self.m[k] / (1 - b1 ** self.t)
            vhat = self.v[k] / (1 - b2 ** self.t)
            self.p[k] = self.p[k] - hp["lr"] * (mhat / (np.sqrt(vhat) + hp["eps"]) + wd * self.p[k])


def train(np_params, train_inputs, train_targets, cfg, hp, dtype, check_textbook=False):
    P = to_torch_params(np_params, dtype)
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
        _, loss = forward(P, torch.from_numpy(train_inputs[s]).long(),
                          torch.from_numpy(train_targets[s]).long(), cfg)
        loss.backward()
        with torch.no_grad():
            sumsq = sum((P[n].grad ** 2).sum() for n in names)
            norm = torch.sqrt(sumsq)
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


# ---------------------------------------------------------------- safetensors
def save_safetensors(path, tensors, metadata):
    """tensors: dict name -> numpy array (float32 or int32). Data in sorted name order."""
    dtype_name = {np.dtype("<f4"): "F32", np.dtype("<i4"): "I32"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = tensors[name]
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        b = a.tobytes()
        header[name] = {"dtype": dtype_name[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":"), sort_keys=False).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path):
    """Minimal reader; checks the layout strictly. Returns (tensors, metadata)."""
    np_dtype = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4")}
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, "header length not a multiple of 8"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors, expect = {}, 0
    for name in sorted(header):
        info = header[name]
        begin, end = info["data_offsets"]
        assert begin == expect, f"{name}: gap or overlap in data offsets"
        dt = np_dtype[info["dtype"]]
        count = int(np.prod(info["shape"])) if info["shape"] else 1
        assert end - begin == count * dt.itemsize, f"{name}: size mismatch"
        tensors[name] = np.frombuffer(data[begin:end], dtype=dt).reshape(info["shape"])
        expect = end
    assert expect == len(data), "trailing bytes after the last tensor"
    return tensors, metadata


# ---------------------------------------------------------------- checks
def finite_difference_check(np_params, inputs, targets, grads, cfg):
    """Central differences in float64 on a few entries. Returns the worst error as a multiple of
    the allowed error 1e-6*|g| + 1e-10 (the absolute floor covers the O(h^2) truncation and the
    O(eps*loss/h) rounding of the difference quotient for entries whose gradient is tiny)."""
    probes = [
        ("transformer.wte.weight", (int(inputs[0, 3]), 7)),   # used as embedding and LM head
        ("transformer.wte.weight", (60, 0)),                   # last real row: LM head only (likely)
        ("transformer.wpe.weight", (5, 11)),
        ("transformer.h.0.ln_1.weight", (3,)),
        ("transformer.h.0.attn.c_attn.weight", (4, 40)),       # a k column
        ("transformer.h.1.attn.c_attn.bias", (70,)),           # a v column
        ("transformer.h.1.attn.c_proj.weight", (9, 2)),
        ("transformer.h.0.mlp.c_fc.weight", (17, 100)),
        ("transformer.h.1.mlp.c_proj.bias", (31,)),
        ("transformer.ln_f.bias", (12,)),
    ]
    base = {k: torch.tensor(v.astype(np.float64)) for k, v in np_params.items()}
    ti, tt = torch.from_numpy(inputs).long(), torch.from_numpy(targets).long()
    h, worst = 1e-5, 0.0
    print("finite-difference check (float64, central, h=1e-5):")
    for name, idx in probes:
        Pp = {k: v.clone() for k, v in base.items()}
        Pm = {k: v.clone() for k, v in base.items()}
        Pp[name][idx] += h
        Pm[name][idx] -= h
        with torch.no_grad():
            lp = float(forward(Pp, ti, tt, cfg)[1])
            lm = float(forward(Pm, ti, tt, cfg)[1])
        fd = (lp - lm) / (2 * h)
        ad = float(grads[name][idx])
        err = abs(fd - ad)
        worst = max(worst, err / (1e-6 * abs(ad) + 1e-10))
        print(f"  {name}{list(idx)}: autograd {ad:+.10e}  fd {fd:+.10e}  abs {err:.1e}  "
              f"rel {err / max(abs(ad), 1e-300):.1e}")
    return worst


def rel_maxabs(a, ref):
    """max |a - ref| / max |ref| (a scale-aware relative error that is robust near zeros)."""
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-300))


def rel_elementwise(a, ref):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float((np.abs(a - ref) / np.abs(ref)).max())


def sensitivity(np_params, tr_inputs, tr_targets, cfg, hp, ref_final):
    """How far the float64 final parameters move when the optimizer is implemented wrongly:
    tells how much a tolerance on train.final.* can discriminate."""
    global clip_scale, decays
    def run(hp2):
        return train(np_params, tr_inputs, tr_targets, cfg, hp2, torch.float64)[2]
    def diff(f):
        return max(float((f[n] - ref_final[n]).abs().max()) for n in ref_final)
    print("sensitivity of train.final.* (float64, max abs change vs the fixture):")
    print(f"  no clipping                         {diff(run(dict(hp, max_norm=0.0))):.2e}")
    saved = clip_scale
    clip_scale = lambda n, m: m / (n + 1e-6) if n > m else 1.0
    print(f"  clip_grad_norm_'s max_norm/(n+1e-6) {diff(run(hp)):.2e}")
    clip_scale = saved
    print(f"  no weight decay                     {diff(run(dict(hp, weight_decay=0.0))):.2e}")
    saved = decays
    decays = lambda n, s: True
    print(f"  weight decay on every parameter     {diff(run(hp)):.2e}")
    decays = saved
    print(f"  adam eps 1e-6 instead of 1e-8       {diff(run(dict(hp, eps=1e-6))):.2e}")
    print(f"  beta2 0.999 instead of 0.95         {diff(run(dict(hp, beta2=0.999))):.2e}")
    print(f"  lr 1.1e-3 instead of 1e-3           {diff(run(dict(hp, lr=1.1e-3))):.2e}")


# ---------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/gpt2_tiny_v1.safetensors",
                    help="output safetensors path")
    ap.add_argument("--skip-checks", action="store_true",
                    help="skip the finite-difference and float32 deviation checks")
    ap.add_argument("--sensitivity", action="store_true",
                    help="also print how much wrong optimizer variants change train.final.*")
    args = ap.parse_args()

    torch.set_num_threads(1)          # fixed summation order: the fixture is bit-reproducible
    cfg, hp = CFG, TRAIN
    rng = np.random.default_rng(cfg["seed"])
    np_params = make_params(cfg, rng)                          # 1. parameters
    inputs, targets = make_batch(cfg, rng)                     # 2. the single batch
    tr_inputs, tr_targets = make_batch(cfg, rng, hp["steps"])  # 3. the training batches

    # ---- forward/backward on the batch, float64
    P64 = to_torch_params(np_params, torch.float64)
    logits64, loss64, grads64 = loss_and_grads(P64, inputs, targets, cfg)
    print(f"loss (float64) = {float(loss64):.12f}   (ln(61) = {math.log(61):.6f})")
    counted = int((targets >= 0).sum())
    print(f"counted target positions: {counted} of {targets.size}")

    # ---- training, float64, with the textbook-AdamW cross-check
    losses64, norms64, final64, tb_diff, decay_names = train(
        np_params, tr_inputs, tr_targets, cfg, hp, torch.float64, check_textbook=True)
    print("train losses (float64):", " ".join(f"{x:.6f}" for x in losses64))
    print("train grad norms (float64, pre-clip):", " ".join(f"{x:.4f}" for x in norms64))
    print(f"torch.optim.AdamW vs textbook AdamW (float64), max |dp| over 10 steps: {tb_diff:.3e}")
    assert tb_diff < 1e-14, "torch AdamW does not match the textbook formula"

    deviations = {}
    if not args.skip_checks:
        fd_worst = finite_difference_check(np_params, inputs, targets, grads64, cfg)
        print(f"finite differences: worst error = {fd_worst:.3f} x allowed (1e-6*|g| + 1e-10)")
        assert fd_worst < 1.0, "finite-difference check failed"

        # ---- the same computation in float32 -> measured fp32-vs-fp64 deviations
        P32 = to_torch_params(np_params, torch.float32)
        logits32, loss32, grads32 = loss_and_grads(P32, inputs, targets, cfg)
        losses32, norms32, final32, _, _ = train(np_params, tr_inputs, tr_targets, cfg, hp,
                                                 torch.float32)
        g_worst = max(((rel_maxabs(grads32[n], grads64[n]), n) for n in grads64))
        f_worst = max(((rel_maxabs(final32[n], final64[n]), n) for n in final64))
        f_abs = max(float((final32[n].double() - final64[n]).abs().max()) for n in final64)
        # parameter change over training, for scale
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
            print(f"    {n:40s} {rel_maxabs(grads32[n], grads64[n]):.2e}")
        print(f"  (largest parameter change over the 10 steps: {moved:.3e}; lr*steps = "
              f"{hp['lr'] * hp['steps']:.1e})")

    if args.sensitivity:
        sensitivity(np_params, tr_inputs, tr_targets, cfg, hp, final64)

    # ---- assemble the fixture
    f32 = lambda t: np.ascontiguousarray(
        (t.detach().numpy() if torch.is_tensor(t) else np.asarray(t)).astype(np.float32))
    out = {}
    for n, a in np_params.items():
        out["param." + n] = a
        out["grad." + n] = f32(grads64[n])
        out["train.final." + n] = f32(final64[n])
    out["batch.inputs"] = inputs
    out["batch.targets"] = targets
    out["logits"] = f32(logits64)
    out["loss"] = np.array([float(loss64)], dtype=np.float32)
    out["train.inputs"] = tr_inputs
    out["train.targets"] = tr_targets
    out["train.losses"] = f32(losses64)
    out["train.grad_norms"] = f32(norms64)
    assert out["logits"].shape == (cfg["B"], cfg["T"], cfg["vocab_size"])

    shapes = dict(param_shapes(cfg))
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "n_layer": cfg["n_layer"],
        "n_head": cfg["n_head"],
        "n_embd": cfg["n_embd"],
        "head_size": cfg["n_embd"] // cfg["n_head"],
        "vocab_size": cfg["vocab_size"],
        "padded_vocab_size": cfg["padded_vocab_size"],
        "block_size": cfg["block_size"],
        "B": cfg["B"],
        "T": cfg["T"],
        "mlp_hidden": 4 * cfg["n_embd"],
        "layernorm_eps": repr(cfg["ln_eps"]),
        "gelu": "tanh approximation: 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))",
        "attention": "causal softmax, scores scaled by 1/sqrt(head_size); c_attn columns "
                     "[q | k | v], each n_embd wide, head h at [h*hs, (h+1)*hs) of its part",
        "lm_head": "tied to transformer.wte.weight: logits = ln_f(x) @ wte^T (real vocab rows "
                   "only; padded rows 61..63 are not stored)",
        "weight_layout": "HF Conv1D: weights are [in, out], y = x @ W + b",
        "loss": "mean cross-entropy over positions with target >= 0 (ignore_index=-1)",
        "ignored_targets": "batch.targets[0][5], batch.targets[1][15], train.targets[:,0,5], "
                           "train.targets[:,1,15] are -1",
        "init": "numpy default_rng(seed); weights N(0,0.02), attn.c_proj.weight and "
                "mlp.c_proj.weight scaled by 1/sqrt(2*n_layer); LayerNorm weights 1+N(0,0.1); "
                "all biases N(0,0.02); rounded to float32 (the stored param.*), the float64 "
                "reference starts from exactly those values",
        "seed": cfg["seed"],
        "compute_dtype": "float64 (stored as float32)",
        "train_steps": hp["steps"],
        "lr": repr(hp["lr"]),
        "lr_schedule": "constant",
        "beta1": repr(hp["beta1"]),
        "beta2": repr(hp["beta2"]),
        "adam_eps": repr(hp["eps"]),
        "weight_decay": repr(hp["weight_decay"]),
        "weight_decay_params": "2-D tensors only: transformer.wte.weight, transformer.wpe.weight "
                               "and every attn.c_attn/attn.c_proj/mlp.c_fc/mlp.c_proj .weight; "
                               "no decay on biases and LayerNorm weights/biases",
        "adamw": "torch.optim.AdamW (decoupled): t=step (1-based); m=b1*m+(1-b1)*g; "
                 "v=b2*v+(1-b2)*g^2; mhat=m/(1-b1^t); vhat=v/(1-b2^t); p=p*(1-lr*wd); "
                 "p=p-lr*mhat/(sqrt(vhat)+eps). Equivalent: p=p-lr*(mhat/(sqrt(vhat)+eps)+wd*p_old). "
                 "m, v start at 0; g is the clipped gradient",
        "grad_clip": "norm=sqrt(sum over all params of g^2) of the gradient of the mean loss; "
                     "scale=max_norm/max(norm,max_norm); g=g*scale (NOT clip_grad_norm_'s "
                     "max_norm/(norm+1e-6))",
        "max_norm": repr(hp["max_norm"]),
        "train_losses": "train.losses[s]: loss of step s with the parameters before that "
                        "step's update",
        "train_grad_norms": "train.grad_norms[s]: global norm before clipping",
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "command": "python3 " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
    }
    for k, v in deviations.items():
        metadata["measured_fp32_deviation: " + k] = f"{v:.3e}"

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_safetensors(args.out, out, metadata)

    # ---- round trip
    back, meta_back = load_safetensors(args.out)
    assert set(back) == set(out), "tensor names differ after re-reading"
    for n, a in out.items():
        assert back[n].dtype == a.dtype and back[n].shape == a.shape, n
        assert np.array_equal(back[n].view(np.uint32), a.view(np.uint32)), n
    assert meta_back == {k: str(v) for k, v in metadata.items()}, "metadata differs"
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {len(out)} tensors, {size} bytes; round trip OK")


if __name__ == "__main__":
    main()
