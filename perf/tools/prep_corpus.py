#!/usr/bin/env python3
"""A JSON-lines benchmark corpus for `meshtrain prep` (perf/cpu/prep_throughput.sh, prep_vs_tokenizers.py).

Cuts a text file (default inputs/kjv.txt) into documents of 2-4 kB and writes Dolma-like records
({"id", "text", "source", "added", "metadata"}) until --mb MB are written, over --files files,
each as .jsonl, .jsonl.gz (Python's gzip, level 6) and .jsonl.zst (the zstd tool, level 3,
when it is installed):

    python3 perf/tools/prep_corpus.py --out /tmp/corpus --mb 200 --files 4
"""
import argparse
import gzip
import json
import os
import shutil
import subprocess


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--text", default=os.path.join(here, "..", "..", "inputs", "kjv.txt"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--mb", type=float, default=200)
    ap.add_argument("--files", type=int, default=4)
    a = ap.parse_args()
    with open(a.text, encoding="utf-8") as f:
        text = f.read()
    os.makedirs(a.out, exist_ok=True)
    per_file = a.mb * 1e6 / a.files
    at, doc = 0, 0
    zstd = shutil.which("zstd")
    for i in range(a.files):
        path = os.path.join(a.out, f"corpus_{i:02d}.jsonl")
        written = 0
        with open(path, "w", encoding="utf-8") as f:
            while written < per_file:
                n = 2000 + (doc * 7919) % 2000
                if at + n > len(text):
                    at = 0
                rec = {"id": f"doc-{doc}", "text": text[at:at + n], "source": "kjv",
                       "added": "2024-05-20T00:00:00.000Z",
                       "metadata": {"url": f"https://example.org/{doc}", "lang": "en",
                                    "score": round(0.5 + (doc % 50) / 100, 2)}}
                line = json.dumps(rec, ensure_ascii=doc % 2 == 0) + "\n"
                f.write(line)
                written += len(line.encode("utf-8"))
                at += n
                doc += 1
        with open(path, "rb") as src, gzip.open(path + ".gz", "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        if zstd:
            subprocess.run([zstd, "-q", "-f", "-3", path, "-o", path + ".zst"], check=True)
        print(f"{path}: {written / 1e6:.1f} MB (+ .gz{', .zst' if zstd else ''})")
    print(f"{doc} documents")


if __name__ == "__main__":
    main()
