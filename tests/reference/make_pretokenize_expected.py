#!/usr/bin/env python3
"""Writes tests/io/data/pretokenize_expected.json: the pieces that Python's `regex` module (the
engine of openai's GPT-2 encoder; Debian's python3-regex) finds for Llama 3's and GPT-2's
pre-tokenizer patterns in tokenizer_crosscheck.py's test text. test_hf_tokenizer.cpp holds
meshtrain's PCRE2 pre-tokenizer to them.

    /usr/bin/python3 tests/reference/make_pretokenize_expected.py
"""
import json
import os
import sys

import regex

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from tokenizer_crosscheck import LLAMA3_PATTERN, TEST_TEXT  # noqa: E402

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

llama3 = regex.findall(LLAMA3_PATTERN, TEST_TEXT)
gpt2 = regex.findall(GPT2_PATTERN, TEST_TEXT)
assert "".join(llama3) == TEST_TEXT and "".join(gpt2) == TEST_TEXT
doc = {"source": f"Python regex {regex.__version__} findall over tests/reference/"
                 "tokenizer_crosscheck.py TEST_TEXT (make_pretokenize_expected.py)",
       "text": TEST_TEXT, "llama3": llama3, "gpt2": gpt2}
out = os.path.join(here, "..", "io", "data", "pretokenize_expected.json")
with open(out, "w") as f:
    f.write(json.dumps(doc, ensure_ascii=True, indent=0) + "\n")
print(f"wrote {out}: {len(llama3)} Llama 3 pieces, {len(gpt2)} GPT-2 pieces")
