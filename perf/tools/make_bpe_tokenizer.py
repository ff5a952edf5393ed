#!/usr/bin/env python3
"""A GPT-2-style byte-level BPE tokenizer.json trained on a text file, without `tokenizers`.

For measuring `meshtrain prep` with a tokenizer of realistic shape where the `tokenizers`
library is not installed (the CI machine): GPT-2's pre-tokenizer regex (Python's `regex`
module, Debian's python3-regex), word counts, then the most frequent adjacent pair merged
`--merges` times (ties: the pair first seen). Added token <|endoftext|> after the vocabulary.

    python3 perf/tools/make_bpe_tokenizer.py inputs/kjv.txt /tmp/bpe/tokenizer.json --merges 4000
"""
import argparse
import collections
import json
import os

import regex

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode():
    """GPT-2's map of the 256 bytes to printable characters (openai/gpt-2 encoder.py)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) +
          list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def train(text, merges):
    b2u = bytes_to_unicode()
    words = collections.Counter(regex.findall(GPT2_PATTERN, text))
    seqs = [[b2u[b] for b in w.encode("utf-8")] for w in words]
    freq = list(words.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)  # pair -> indices of the words holding it
    for i, s in enumerate(seqs):
        for a, b in zip(s, s[1:]):
            pairs[(a, b)] += freq[i]
            where[(a, b)].add(i)
    vocab = [b2u[b] for b in range(256)]
    out = []
    for _ in range(merges):
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: kv[1])[0]
        if pairs[best] < 2:
            break
        a, b = best
        new = a + b
        out.append(f"{a} {b}")
        vocab.append(new)
        for i in list(where[best]):
            s = seqs[i]
            for x, y in zip(s, s[1:]):  # remove this word's pairs, re-add after the merge
                pairs[(x, y)] -= freq[i]
                if pairs[(x, y)] <= 0:
                    del pairs[(x, y)]
                where[(x, y)].discard(i)
            j, merged = 0, []
            while j < len(s):
                if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                    merged.append(new)
                    j += 2
                else:
                    merged.append(s[j])
                    j += 1
            seqs[i] = merged
            for x, y in zip(merged, merged[1:]):
                pairs[(x, y)] += freq[i]
                where[(x, y)].add(i)
    return vocab, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("out", help="tokenizer.json to write")
    ap.add_argument("--merges", type=int, default=4000)
    a = ap.parse_args()
    with open(a.corpus, encoding="utf-8", errors="replace") as f:
        text = f.read()
    vocab, merges = train(text, a.merges)
    eot = len(vocab)
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": eot, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": True,
                          "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "vocab": {t: i for i, t in enumerate(vocab)},
                  "merges": merges},
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    print(f"{a.out}: {len(vocab)} symbols ({len(merges)} merges) + <|endoftext|> = id {eot}")


if __name__ == "__main__":
    main()
