#!/usr/bin/env python3
"""`meshtrain prep` against HuggingFace `tokenizers` on the same JSON lines, same tokenizer.

For the GPU machine, where `tokenizers` is installed (the CI machine has no `tokenizers`):

    python3 perf/reference/prep_vs_tokenizers.py --meshtrain BUNDLE/bin/meshtrain --ranks "1 4 16" \\
        --threads "1 4 16" --work /tmp/prepcmp [--corpus DIR] [--mb 400] [--tokenizer tok.json]

1. The corpus: JSON lines from perf/tools/prep_corpus.py (made here from inputs/kjv.txt unless
   --corpus names a folder of corpus_*.jsonl files).
2. The tokenizer: --tokenizer, or a Llama-3-form byte-level BPE trained with `tokenizers` on
   inputs/kjv.txt (tests/reference/tokenizer_crosscheck.py's recipe, --vocab ids).
3. meshtrain: `mpirun -np R meshtrain prep --prep.tokenizer hf` (EOS after each document, no
   validation split) at each rank count; the seconds prep reports for reading, parsing and
   tokenising, and the command's wall time.
4. tokenizers: each line through json.loads (one Python thread), then encode_batch over all
   documents (Rust threads: RAYON_NUM_THREADS) with the EOS id appended, at each thread count,
   in a fresh process each; the JSON and the encode seconds separately.
5. The token ids of both, compared one by one (meshtrain's shards against tokenizers' ids).
Prints one table (MB/s of JSON lines, uncompressed) and PASS when the ids are identical.
"""
import argparse
import array
import glob
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def read_shards(prefix):
    """llm.c token shards: 256 int32 header (magic 20240520, version, count), uint16 ids."""
    ids, i = array.array("H"), 0
    while os.path.exists(f"{prefix}_train_{i:06d}.bin"):
        with open(f"{prefix}_train_{i:06d}.bin", "rb") as f:
            header = struct.unpack("<256i", f.read(1024))
            assert header[0] == 20240520, f"{prefix}: bad magic"
            ids.frombytes(f.read(2 * header[2]))
        i += 1
    return ids


def hf_worker(tokenizer, files, out):
    """Runs in a process of its own: RAYON_NUM_THREADS is read when tokenizers starts."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer)
    eos = tok.token_to_id("<|end_of_text|>")
    if eos is None:
        eos = tok.token_to_id("<|endoftext|>")
    t0 = time.perf_counter()
    texts = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    t1 = time.perf_counter()
    enc = tok.encode_batch(texts, add_special_tokens=False)
    t2 = time.perf_counter()
    ids = array.array("H")
    for e in enc:
        ids.extend(e.ids)
        ids.append(eos)
    with open(out, "w") as f:
        json.dump({"json_s": t1 - t0, "encode_s": t2 - t1, "documents": len(texts)}, f)
    with open(out + ".ids", "wb") as f:
        ids.tofile(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshtrain", required=True, help="the meshtrain executable")
    ap.add_argument("--mpirun", default="mpirun --oversubscribe", help="launcher, before -np")
    ap.add_argument("--ranks", default="1 16")
    ap.add_argument("--threads", default="1 16")
    ap.add_argument("--work", default="prepcmp")
    ap.add_argument("--corpus", help="folder of corpus_*.jsonl (default: made from kjv.txt)")
    ap.add_argument("--mb", type=float, default=400)
    ap.add_argument("--tokenizer", help="tokenizer.json (default: trained on inputs/kjv.txt)")
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--hf-worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hf_worker:
        hf_worker(a.hf_worker[0], a.hf_worker[1].split(","), a.hf_worker[2])
        return 0
    import tokenizers
    os.makedirs(a.work, exist_ok=True)
    corpus = a.corpus
    if not corpus:
        corpus = os.path.join(a.work, "corpus")
        if not glob.glob(os.path.join(corpus, "corpus_*.jsonl")):
            subprocess.run([sys.executable, os.path.join(HERE, "..", "tools", "prep_corpus.py"), "--out", corpus,
                            "--mb", str(a.mb), "--files", "8"], check=True)
    files = sorted(glob.glob(os.path.join(corpus, "corpus_*.jsonl")))
    mb = sum(os.path.getsize(f) for f in files) / 1e6
    tok_path = a.tokenizer
    if not tok_path:
        sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
        from tokenizer_crosscheck import train
        tok_path = os.path.join(a.work, "tokenizer", "tokenizer.json")
        os.makedirs(os.path.dirname(tok_path), exist_ok=True)
        train(os.path.join(ROOT, "inputs", "kjv.txt"), "llama3", a.vocab).save(tok_path)
    print(f"tokenizers {tokenizers.__version__}; {len(files)} files, {mb:.1f} MB of JSON lines; "
          f"tokenizer {tok_path}; {os.cpu_count()} CPUs")
    rows, streams = [], {}
    for r in a.ranks.split():
        prefix = os.path.join(a.work, f"mt{r}", "c")
        cmd = shlex.split(a.mpirun) + ["-np", r, a.meshtrain, "prep", "--prep.input",
                                       ",".join(files), "--prep.output", prefix,
                                       "--prep.tokenizer", "hf", "--prep.tokenizer_json", tok_path,
                                       "--prep.val_fraction", "0", "--prep.progress_every", "0"]
        # Open MPI refuses root (the GPU machine's sandbox) unless told twice.
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            print(p.stdout, p.stderr)
            return 1
        m = re.search(r"tokenised in ([0-9.e-]+) s", p.stdout + p.stderr)
        rows.append(("meshtrain prep", f"{r} ranks", float(m.group(1)), wall, None))
        streams[f"meshtrain {r}"] = read_shards(prefix)
    for n in a.threads.split():
        out = os.path.join(a.work, f"hf{n}.json")
        env = dict(os.environ, RAYON_NUM_THREADS=n, TOKENIZERS_PARALLELISM="true")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--meshtrain", a.meshtrain, "--hf-worker",
                        tok_path, ",".join(files), out], check=True, env=env)
        wall = time.perf_counter() - t0
        with open(out) as f:
            r = json.load(f)
        rows.append(("tokenizers", f"{n} threads", r["json_s"] + r["encode_s"], wall, r))
        ids = array.array("H")
        with open(out + ".ids", "rb") as f:
            ids.frombytes(f.read())
        streams[f"tokenizers {n}"] = ids
    print(f"{'tool':16} {'workers':11} {'seconds':>8} {'MB/s':>8} {'wall s':>8} {'MB/s':>8}  detail")
    for tool, workers, secs, wall, extra in rows:
        detail = (f"json.loads {extra['json_s']:.2f} s (1 thread) + encode_batch "
                  f"{extra['encode_s']:.2f} s ({mb / extra['encode_s']:.1f} MB/s)" if extra else
                  "read + parse + tokenise")
        print(f"{tool:16} {workers:11} {secs:8.2f} {mb / secs:8.1f} {wall:8.2f} {mb / wall:8.1f}  {detail}")
    names = list(streams)
    ok = all(streams[n] == streams[names[0]] for n in names)
    for n in names:
        print(f"  {n}: {len(streams[n])} tokens{'' if streams[n] == streams[names[0]] else ' DIFFER'}")
    print("PASS: identical token ids" if ok else "FAIL: token ids differ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
