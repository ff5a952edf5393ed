#!/usr/bin/env python3
"""Cross-check of meshtrain's Mixtral export and import against HuggingFace transformers (issue 20).

    python3 tests/reference/hf_mixtral_crosscheck.py --meshtrain build/cuda/src/meshtrain

Run from the repository root (it reads inputs/kjv.txt). Steps, each printed with its numbers:

1. Unless --folder is given: `meshtrain prep` of the shipped corpus (byte tokenizer) and
   `meshtrain train` of a tiny Llama with MoE blocks (llama-tiny, 2 layers, 4 SwiGLU experts
   of width 64, top-2, fp32: the MoE path is fp32 only) for --steps steps, ending in
   train.save: the MixtralForCausalLM folder, sharded (1 MB shards, with the index).
2. The folder holds the hub's per-expert form (block_sparse_moe.gate.weight,
   block_sparse_moe.experts.J.w1/w3/w2.weight), nothing else of the MoE blocks.
3. transformers loads it (AutoModelForCausalLM.from_pretrained, float32 and bfloat16, on the GPU
   when there is one); `meshtrain generate --generate.temperature 0 --generate.dump` gives the
   prompt's ids, meshtrain's logits at every prompt position and its greedy continuation
   (hf_llama_crosscheck.py's mode 2): logits within 1e-4 (fp32) / --bf16-tol (bf16) of
   max|logits|, the fp32 greedy continuation token for token (bf16's agreeing prefix reported).
4. transformers' save_pretrained of the fp32 model (what transformers 5 writes for Mixtral:
   the script prints whether it is the per-expert or the fused mlp.experts.gate_up_proj form),
   and `meshtrain generate` on that folder: its logits equal those of step 3's meshtrain run
   to 1e-6 of max|logits| (the same fp32 values: meshtrain reads what transformers writes);
   the same for the model's in-memory state_dict written as model.safetensors (transformers 5
   holds the experts fused: mlp.experts.gate_up_proj [E, 2I, C], down_proj [E, C, I]).

Needs torch and transformers (the GPU machine: transformers 5.x). --dump FILE takes a
`meshtrain generate --generate.dump` file made elsewhere instead of running meshtrain for step 3
(step 4 then only writes transformers' folder, for meshtrain to read elsewhere): a check of the
folder against transformers with no meshtrain on the machine. Exit status 0 on PASS.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_reference import load_safetensors  # noqa: E402
from hf_llama_crosscheck import load_pretrained, rel_max  # noqa: E402


def sh(cmd, log):
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    with open(log, "w") as f:
        f.write(r.stdout + r.stderr)
    if r.returncode != 0:
        print(f"failed ({r.returncode}), see {log}:\n{(r.stdout + r.stderr)[-3000:]}")
        sys.exit(1)
    return r.stdout + r.stderr


def tensor_names(folder):
    idx = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return sorted(json.load(f)["weight_map"])
    import struct
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return sorted(k for k in json.loads(f.read(n)) if k != "__metadata__")


def moe_form(names):
    per_expert = [n for n in names if ".block_sparse_moe." in n]
    fused = [n for n in names if ".mlp.experts." in n or ".mlp.gate." in n]
    return per_expert, fused


def generate(a, folder, dump, extra=()):
    args = shlex.split(a.meshtrain) + [
        "generate", "--generate.model", folder, "--generate.prompt", a.prompt,
        "--generate.tokens", str(a.tokens), "--generate.temperature", "0",
        "--generate.dump", dump, *extra]
    out = sh(args, dump + ".log")
    print(f"  meshtrain generate: {out.strip().splitlines()[-1][:120]!r}")
    fx, _ = load_safetensors(dump)
    return ([int(t) for t in fx["prompt"]], np.array(fx["logits"], np.float64),
            [int(t) for t in fx["tokens"]])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshtrain", default="", help="the command that runs meshtrain")
    ap.add_argument("--folder", default="", help="an exported Mixtral folder (skips step 1)")
    ap.add_argument("--dump", default="", help="a generate --generate.dump file (no meshtrain)")
    ap.add_argument("--work", default="hf_mixtral_crosscheck_work")
    ap.add_argument("--steps", type=int, default=200, help="training steps of step 1")
    ap.add_argument("--prompt", default="And God said")
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens to compare")
    ap.add_argument("--bf16-tol", type=float, default=3e-2)
    a = ap.parse_args()
    if not a.meshtrain and not (a.folder and a.dump):
        ap.error("--meshtrain is needed (or --folder with --dump)")
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    os.makedirs(a.work, exist_ok=True)
    work = os.path.abspath(a.work)
    ok = True

    def check(what, good):
        nonlocal ok
        ok = ok and good
        print(f"  {what}  {'ok' if good else 'FAIL'}")

    folder = a.folder
    if not folder:  # step 1
        mt = shlex.split(a.meshtrain)
        data = os.path.join(work, "data", "kjv")
        sh(mt + ["prep", "--prep.input", "inputs/kjv.txt", "--prep.output", data,
                 "--prep.tokenizer", "byte"], os.path.join(work, "prep.log"))
        out = sh(mt + ["train", "--model.preset", "llama-tiny", "--model.n_layer", "2",
                       "--moe.experts", "4", "--moe.top_k", "2", "--moe.ffn_hidden_size", "64",
                       "--train.steps", str(a.steps), "--train.seq_len", "64",
                       "--train.micro_batch", "8", "--train.warmup", "20",
                       "--train.eval_every", "0", "--train.sample_tokens", "0",
                       "--train.save_max_shard_mb", "1", "--train.out_dir",
                       os.path.join(work, "train"), "--ckpt.dir",
                       os.path.join(work, "train", "checkpoints"),
                       "--data.train", data + "_train_*.bin", "--data.val", ""],
                 os.path.join(work, "train.log"))
        last = [l for l in out.splitlines() if l.startswith("step ")][-1:]
        print("  " + (last[0][:100] if last else "(no step line)"))
        folder = os.path.join(work, "train", "model")

    # Step 2: the hub's per-expert form.
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    arch = cfg["architectures"][0]
    per_expert, fused = moe_form(tensor_names(folder))
    L, E = cfg["num_hidden_layers"], cfg["num_local_experts"]
    print(f"{folder}: {arch}, {L} layers, {E} experts, top-{cfg['num_experts_per_tok']}, "
          f"expert width {cfg['intermediate_size']}")
    check(f"MixtralForCausalLM in the hub's form: {len(per_expert)} block_sparse_moe tensors "
          f"(want {L * (1 + 3 * E)}), {len(fused)} fused", arch == "MixtralForCausalLM" and
          len(per_expert) == L * (1 + 3 * E) and not fused)

    # Step 3: transformers on the folder against meshtrain.
    if a.dump:
        fx, _ = load_safetensors(a.dump)
        prompt, ours_logits = [int(t) for t in fx["prompt"]], np.array(fx["logits"], np.float64)
        ours_tokens = [int(t) for t in fx["tokens"]]
    else:
        prompt, ours_logits, ours_tokens = generate(a, folder, os.path.join(work, "ours.safetensors"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ids = torch.tensor([prompt], device=device)
    n_new = len(ours_tokens) - len(prompt)
    fp32_model = None
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, a.bf16_tol)):
        model = load_pretrained(folder, dtype, device)
        name = str(dtype).replace("torch.", "")
        check(f"loaded as {type(model).__name__} ({name})", type(model).__name__ == arch)
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0].float().cpu().numpy()
        check(f"{name}: logits of {len(prompt)} positions vs meshtrain (rel. to max) "
              f"{rel_max(logits, ours_logits):.3e} (tolerance {tol:.0e})",
              rel_max(logits, ours_logits) <= tol)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                                 num_beams=1, pad_token_id=0)[0].tolist()
        same = next((i for i, (x, y) in enumerate(zip(out, ours_tokens)) if x != y),
                    min(len(out), len(ours_tokens)))
        text = (f"{name}: greedy continuation of {n_new} tokens "
                f"{'equals' if out == ours_tokens else 'differs from'} meshtrain's "
                f"(first {same - len(prompt)} new tokens agree)")
        if dtype == torch.float32:
            check(text, out == ours_tokens)
            fp32_model = model
        else:
            print("  " + text + " (reported)")

    # Step 4: what transformers writes, read back by meshtrain.
    resaved = os.path.join(work, "resaved")
    fp32_model.save_pretrained(resaved)
    per_expert, fused = moe_form(tensor_names(resaved))
    print(f"  transformers {transformers.__version__} save_pretrained wrote "
          f"{len(per_expert)} per-expert (block_sparse_moe) and {len(fused)} fused "
          f"(mlp.experts / mlp.gate) MoE tensors into {resaved}")
    # And the model's own parameters as transformers holds them in memory (transformers 5: the
    # fused mlp.experts.gate_up_proj / down_proj), which meshtrain reads too.
    from safetensors.torch import save_file
    memory = os.path.join(work, "in_memory")
    os.makedirs(memory, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in fp32_model.state_dict().items()}
    save_file(state, os.path.join(memory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(resaved, "config.json")) as f:
        resaved_cfg = f.read()
    with open(os.path.join(memory, "config.json"), "w") as f:
        f.write(resaved_cfg)
    per_expert, fused = moe_form(sorted(state))
    print(f"  in memory: {len(per_expert)} per-expert and {len(fused)} fused MoE tensors "
          f"({', '.join(n for n in sorted(state) if n.startswith('model.layers.0.mlp'))}) "
          f"into {memory}")
    for label, where in (("transformers' save_pretrained folder", resaved),
                         ("transformers' in-memory parameters", memory)):
        if a.dump:
            print(f"  (--dump: run `meshtrain generate --generate.model {where} --generate.tokenizer "
                  f"byte --generate.temperature 0 --generate.dump ...` where meshtrain is)")
            continue
        _, back_logits, back_tokens = generate(
            a, where, os.path.join(work, os.path.basename(where) + ".safetensors"),
            ["--generate.tokenizer", "byte"])
        check(f"meshtrain on {label}: logits vs meshtrain on ours (rel. to max) "
              f"{rel_max(back_logits, ours_logits):.3e} (tolerance 1e-06)",
              rel_max(back_logits, ours_logits) <= 1e-6)
        check(f"meshtrain on {label}: the same greedy continuation", back_tokens == ours_tokens)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
