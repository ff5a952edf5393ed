#!/usr/bin/env python3
"""Cross-check of meshtrain's HuggingFace tokenizer.json reader against the `tokenizers` library.

Trains two byte-level BPE tokenizers with `tokenizers` on the shipped corpus (inputs/kjv.txt,
vocab 1000): one in Llama 3's form (Split with Llama 3's regex, Isolated, then ByteLevel without
a regex, ignore_merges) and one in GPT-2's (ByteLevel with GPT-2's regex); saves each as
tokenizer.json; encodes a test text (Unicode letters and digits of several scripts, whitespace
runs, CRLF, U+0085, contractions, special tokens, emoji) and the whole corpus with `tokenizers`
and with `meshtrain prep --prep.tokenizer hf`; and compares the token ids one by one.

    python3 tests/reference/tokenizer_crosscheck.py --meshtrain build/cuda/src/meshtrain \
        [--corpus inputs/kjv.txt] [--work /tmp/tokcheck]

Needs the `tokenizers` library (not needed by CI). Prints PASS or FAIL; exit status 0 on PASS.
"""
import argparse
import os
import shlex
import struct
import subprocess
import sys

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>"]
TEST_TEXT = (
    "And God said, Let there be light: and there was light.\n"
    "I'm sure they'll've done it; we'd say DON'T, You'RE. it's 12345 678 9 0.5 1,000,000\n"
    "  Tabs\tand   spaces  \n\n\n"
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 \u201cquotes\u201d \u2018single\u2019 "
    "\u65e5\u672c\u8a9e \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0661\u0662\u0663\u0664 "
    "\u00bd \u2167\r\n"
    "end\u0085line\u0085\u0085twice\u00a0nbsp\u3000ideographic\u2028sep "
    "<|end_of_text|> special<|begin_of_text|>inline\n"
    "emoji \U0001F600\U0001F44D\U0001F3FD $3.50 x^2+y_1=z (parens) [brackets] {braces}\n"
    "trailing spaces   "
)


def train(corpus, kind, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    if kind == "llama3":
        try:
            model = models.BPE(ignore_merges=True)
        except TypeError:  # tokenizers < 0.19 has no ignore_merges
            model = models.BPE()
        tok = Tokenizer(model)
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([corpus], trainer)
    return tok


def read_shard(path):
    """llm.c token shard: 256 int32 header (magic 20240520, version 1, count), uint16 tokens."""
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        assert header[0] == 20240520, f"{path}: bad magic {header[0]}"
        n = header[2]
        return list(struct.unpack(f"<{n}H", f.read(2 * n)))


def meshtrain_encode(cmd, tokenizer_dir, text_path, out_prefix):
    args = shlex.split(cmd) + ["prep", "--prep.input", text_path, "--prep.output", out_prefix,
                               "--prep.tokenizer", "hf", "--prep.tokenizer_json", tokenizer_dir,
                               "--prep.eos", "false", "--prep.val_fraction", "0"]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    ids, i = [], 0
    while os.path.exists(f"{out_prefix}_train_{i:06d}.bin"):
        ids += read_shard(f"{out_prefix}_train_{i:06d}.bin")
        i += 1
    return ids


def compare(what, want, got, tok):
    if want == got:
        print(f"  {what}: {len(want)} tokens, identical")
        return True
    k = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    ctx = lambda ids: [tok.id_to_token(i) for i in ids[max(0, k - 3):k + 4]]
    print(f"  {what}: DIFFER at token {k} of {len(want)} (meshtrain {len(got)}):\n"
          f"    tokenizers {want[max(0, k - 3):k + 4]} {ctx(want)}\n"
          f"    meshtrain  {got[max(0, k - 3):k + 4]} {ctx(got)}")
    return False


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshtrain", required=True, help="command that runs the meshtrain executable")
    ap.add_argument("--corpus", default=os.path.join(here, "..", "..", "inputs", "kjv.txt"))
    ap.add_argument("--work", default="tokcheck")
    ap.add_argument("--vocab", type=int, default=1000)
    a = ap.parse_args()
    import tokenizers
    print(f"tokenizers {tokenizers.__version__}")
    os.makedirs(a.work, exist_ok=True)
    text_path = os.path.join(a.work, "test_text.txt")
    with open(text_path, "w", encoding="utf-8", newline="") as f:
        f.write(TEST_TEXT)
    ok = True
    for kind in ("llama3", "gpt2"):
        tok = train(a.corpus, kind, a.vocab)
        d = os.path.join(a.work, kind)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        print(f"{kind}: trained vocab {tok.get_vocab_size()}, saved {d}/tokenizer.json")
        for what, path in (("test text", text_path), ("corpus", a.corpus)):
            with open(path, encoding="utf-8", newline="") as f:
                want = tok.encode(f.read(), add_special_tokens=False).ids
            got = meshtrain_encode(a.meshtrain, d, path, os.path.join(a.work, f"{kind}_{what[0]}"))
            ok = compare(what, want, got, tok) and ok
        with open(text_path, encoding="utf-8", newline="") as f:
            round_trip = tok.decode(tok.encode(f.read(), add_special_tokens=False).ids,
                                    skip_special_tokens=False)
        print(f"  (tokenizers' own decode round trip of the test text: "
              f"{'exact' if round_trip == TEST_TEXT else 'differs'})")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
