#!/usr/bin/env python3
"""Cross-checks of meshtrain's Llama against HuggingFace transformers, in two modes.

1. The fixture (default): loads the fixture's parameters (tests/fixtures/llama_tiny_v1.safetensors,
   written by llama_reference.py) into a real transformers LlamaForCausalLM in float64 and
   compares its logits, loss and every parameter gradient with the fixture, for the default
   rope and the fixture's Llama 3 rope scaling.

    python3 tests/reference/hf_llama_crosscheck.py [--fixture tests/fixtures/llama_tiny_v1.safetensors]

2. An exported folder (--folder, with --meshtrain): `transformers` loads the HuggingFace folder
   meshtrain exported (train.save or `meshtrain convert`: config.json, shards, index) with
   AutoModelForCausalLM.from_pretrained, in float32 and in bfloat16 (on the GPU when there is
   one). `meshtrain generate --generate.temperature 0 --generate.dump` gives the prompt's
   token ids, meshtrain's logits at every prompt position and its greedy continuation; the
   script compares transformers' logits of the same ids (float32: 1e-4 of max|logits|;
   bfloat16: 3e-2, bf16's 8-bit mantissa over a few layers) and its greedy continuation
   (generate(do_sample=False), min_new_tokens = the same count, so no EOS stops it early):
   float32 must equal meshtrain's token for token; bfloat16's agreeing prefix is reported.

    python3 tests/reference/hf_llama_crosscheck.py --folder out/model \
        --meshtrain "build/cuda/src/meshtrain" [--prompt "And God said"] [--tokens 48]

Needs torch and transformers (run on the GPU machine, transformers 5.x; the fixture mode runs on
the CPU in a few seconds). Prints the max deviations and PASS or FAIL; exit status 0 on PASS.

Two runs per rope variant:
  * "HF as is": transformers' own code. Its LlamaRMSNorm computes in float32 whatever the
    model's dtype (hidden_states.to(torch.float32)), so a float64 model deviates from the
    float64 fixture by float32 rounding: held to the C++ tests' tolerances (logits 1e-5 of
    max|logits|, loss 1e-5 relative, gradients 1e-5 of each tensor's max|g|).
  * "HF, RMSNorm in float64": the same model with only that cast removed (each RMSNorm
    module's forward replaced by weight * (x * rsqrt(mean(x^2) + eps)) in the input dtype).
    Compared with llama_reference.py's float64 forward recomputed here: 1e-12 relative, i.e.
    every other part of the model (rope layout and frequencies, GQA head mapping, SwiGLU,
    weight layouts, untied head) is the same function. Against the stored fixture (float32
    values) the same 1e-5 tolerances apply.
The attention is SDPA (float64 throughout on the CPU); eager attention would add its float32
softmax.
"""
import argparse
import inspect
import json
import os
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as ref  # noqa: E402
from gpt2_reference import load_safetensors  # noqa: E402


def make_config(cfg, scaling):
    from transformers import LlamaConfig
    theta = cfg["rope_theta"]
    kw = dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden"],
              intermediate_size=cfg["intermediate"], num_hidden_layers=cfg["n_layer"],
              num_attention_heads=cfg["n_head"], num_key_value_heads=cfg["n_kv_head"],
              head_dim=cfg["head_size"], max_position_embeddings=128,
              rms_norm_eps=cfg["rms_eps"], hidden_act="silu", attention_bias=False,
              mlp_bias=False, tie_word_embeddings=False, attention_dropout=0.0)
    rope = {"rope_type": "default", "rope_theta": theta}
    if scaling is not None:
        rope = dict(scaling, rope_theta=theta)
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        kw["rope_parameters"] = rope  # transformers >= 5
    else:
        kw["rope_theta"] = theta
        if scaling is not None:
            kw["rope_scaling"] = dict(scaling)
    return LlamaConfig(**kw)


def rmsnorm_in_input_dtype(self, hidden_states):
    var = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(var + self.variance_epsilon))


def build_model(cfg, scaling, params, patch_rmsnorm):
    from transformers import LlamaForCausalLM
    config = make_config(cfg, scaling)
    try:
        config._attn_implementation = "sdpa"
    except Exception:  # read-only in some versions: the constructor argument below then rules
        pass
    try:
        model = LlamaForCausalLM(config, attn_implementation="sdpa")
    except TypeError:
        model = LlamaForCausalLM(config)
    model = model.to(torch.float64).eval()
    names = dict(model.named_parameters())
    missing = sorted(set(names) - set(params))
    extra = sorted(set(params) - set(names))
    assert not missing and not extra, f"parameter names differ: missing {missing}, extra {extra}"
    with torch.no_grad():
        for n, p in names.items():
            assert tuple(p.shape) == params[n].shape, f"{n}: HF {tuple(p.shape)} vs {params[n].shape}"
            p.copy_(torch.from_numpy(params[n].astype(np.float64)))
    if patch_rmsnorm:
        count = 0
        for m in model.modules():
            if type(m).__name__.endswith("RMSNorm"):
                m.forward = types.MethodType(rmsnorm_in_input_dtype, m)
                count += 1
        assert count == 2 * cfg["n_layer"] + 1, f"found {count} RMSNorm modules"
    return model


def run_hf(model, inputs, targets):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=torch.from_numpy(inputs).long(), use_cache=False)
    logits = out.logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           torch.from_numpy(targets).long().reshape(-1), ignore_index=-1)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return logits.detach(), loss.detach(), grads


def rel_max(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def load_pretrained(folder, dtype, device):
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except TypeError:  # transformers 4 spells it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=dtype)
    return model.to(device).eval()


def check_exported(a):
    """Mode 2: transformers on meshtrain's exported folder against `meshtrain generate`."""
    import shlex
    import subprocess
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    os.makedirs(a.work, exist_ok=True)
    dump = os.path.join(a.work, "meshtrain_generate.safetensors")
    args = shlex.split(a.meshtrain) + [
        "generate", "--generate.model", a.folder, "--generate.prompt", a.prompt,
        "--generate.tokens", str(a.tokens), "--generate.temperature", "0",
        "--generate.dump", dump]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return 1
    print(f"meshtrain generate: {r.stdout.strip()[:200]!r}")
    fx, _ = load_safetensors(dump)
    prompt = [int(t) for t in fx["prompt"]]
    ours_logits = np.array(fx["logits"], np.float64)
    ours_tokens = [int(t) for t in fx["tokens"]]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ok = True
    with open(os.path.join(a.folder, "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2)):
        model = load_pretrained(a.folder, dtype, device)
        name = str(dtype).replace("torch.", "")
        assert type(model).__name__ == arch, f"loaded {type(model).__name__}, config says {arch}"
        ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0].float().cpu().numpy()
        dev = rel_max(logits, ours_logits)
        good = dev <= tol
        ok = ok and good
        print(f"  {arch} {name}: logits of {len(prompt)} positions vs meshtrain (rel. to max) "
              f"{dev:.3e}  (tolerance {tol:.0e})  {'ok' if good else 'FAIL'}")
        n_new = len(ours_tokens) - len(prompt)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                                 num_beams=1, pad_token_id=0)[0].tolist()
        same = next((i for i, (x, y) in enumerate(zip(out, ours_tokens)) if x != y),
                    min(len(out), len(ours_tokens)))
        equal = out == ours_tokens
        if dtype == torch.float32:
            ok = ok and equal
        print(f"  {arch} {name}: greedy continuation of {n_new} tokens "
              f"{'equals' if equal else 'differs from'} meshtrain's "
              f"(first {same - len(prompt)} new tokens agree)"
              f"{'' if equal or dtype != torch.float32 else '  FAIL'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--fixture", default=os.path.join(here, "..", "fixtures", "llama_tiny_v1.safetensors"))
    ap.add_argument("--folder", default="", help="mode 2: meshtrain's exported HuggingFace folder")
    ap.add_argument("--meshtrain", default="", help="mode 2: the command that runs meshtrain")
    ap.add_argument("--prompt", default="And God said")
    ap.add_argument("--tokens", type=int, default=48, help="mode 2: greedy tokens to compare")
    ap.add_argument("--work", default="hf_crosscheck_work")
    a = ap.parse_args()
    if a.folder:
        if not a.meshtrain:
            ap.error("--folder needs --meshtrain")
        return check_exported(a)
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")

    torch.set_num_threads(1)
    fx, meta = load_safetensors(a.fixture)
    assert meta.get("format") == ref.FORMAT, f"{a.fixture} is not a {ref.FORMAT} file"
    cfg = ref.CFG
    params = {k[len("param."):]: np.array(v) for k, v in fx.items() if k.startswith("param.")}
    inputs, targets = np.array(fx["batch.inputs"]), np.array(fx["batch.targets"])
    ok = True

    def check(what, value, tol):
        nonlocal ok
        good = value <= tol
        ok = ok and good
        print(f"  {what:58s} {value:.3e}  (tolerance {tol:.0e})  {'ok' if good else 'FAIL'}")

    for label, scaling, prefix in (("default rope", None, ""), ("llama3 rope", ref.LLAMA3_SCALING, "llama3.")):
        print(f"{label}:")
        # The reference's own float64 forward, recomputed: the exact comparison for the patch.
        P = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in params.items()}
        cos, sin = ref.tables(cfg, torch.float64, scaling)
        r_logits, r_loss, _ = ref.loss_and_grads(P, inputs, targets, cfg, cos, sin)
        grad_names = [k for k in fx if k.startswith(prefix + "grad.")]
        for patch in (False, True):
            model = build_model(cfg, scaling, params, patch)
            inv = model.model.rotary_emb.inv_freq.float().numpy()
            check(f"{'patched' if patch else 'as is'}: inv_freq vs fixture (rel.)",
                  rel_max(inv, fx[prefix + "rope.inv_freq"]), 3e-7)
            logits, loss, grads = run_hf(model, inputs, targets)
            tag = "HF, RMSNorm in float64" if patch else "HF as is"
            check(f"{tag}: logits vs fixture (rel. to max)", rel_max(logits, fx[prefix + "logits"]), 1e-5)
            check(f"{tag}: loss vs fixture (rel.)",
                  abs(float(loss) - float(fx[prefix + "loss"][0])) / float(fx[prefix + "loss"][0]), 1e-5)
            worst = max((rel_max(grads[k[len(prefix + "grad."):]], fx[k]), k) for k in grad_names)
            check(f"{tag}: grads vs fixture (worst: {worst[1][len(prefix + 'grad.'):][:22]})",
                  worst[0], 1e-5)
            if patch:
                check(f"{tag}: logits vs float64 reference (rel. to max)", rel_max(logits, r_logits), 1e-12)
                check(f"{tag}: loss vs float64 reference (rel.)",
                      abs(float(loss) - float(r_loss)) / float(r_loss), 1e-12)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
