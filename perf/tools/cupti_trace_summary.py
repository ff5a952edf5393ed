#!/usr/bin/env python3
"""Summarize a GPU timeline written by perf/bench/cupti_trace.cpp (libmeshtrain_cupti_trace.so).

Steps are cut at the optimizer: a step ends where a run of kernels matching --step-end ends
(our AdamW is one launch, PyTorch's fused AdamW several in a row per parameter group;
runs closer than --merge-ms end the same step). Of the last --steps complete
steps this prints, per step (median over them): the wall time between step ends, the time the
GPU was busy (the union of kernels, copies and memsets) and idle, the time per category of
kernel, the communication (NCCL's kernels) and how much of it ran while other kernels did
(hidden) or alone (exposed), the kernels that take the most, the largest idle gaps with the
kernels on both sides, and the host's synchronizations. Nothing here was fenced; the
categories of PyTorch's fused Triton kernels are read from their names (a fused norm+residual
kernel counts as norm). An NCCL kernel runs from its launch until its peers' data has come, so
its "exposed" time is what the step waits on communication on this GPU; on ranks that share one
GPU (emulated hosts) it also holds the time the peers' processes had the GPU.

  perf/tools/cupti_trace_summary.py trace.csv [--step-end REGEX] [--steps 5] [--top 25]
"""
import argparse
import csv
import re
import statistics
import sys
from collections import defaultdict

CATEGORIES = [
    # NCCL's kernels first: their names ("AllReduce_Sum", "SendRecv") would match others.
    ("comm", r"nccl"),
    ("attention", r"cudnn|fmha|flash|sdpa|attention|attn"),
    ("optimizer", r"adam|sum_squares|clip_scale|multi_tensor|_foreach|grad_norm|optim"),
    # Our FP8 casts, amaxes and operand packing (Kokkos lambdas of kernels/fp8_cast.cpp and
    # linear_fp8.cpp); cuBLASLt's FP8 GEMMs name their types e4m3/e5m2, not fp8_.
    ("fp8_cast", r"fp8_|amax"),
    ("gemm", r"nvjet|gemm|xmma|cutlass|cublas|sm90_|gemv|splitk|reduce_kernel.*lt"),
    ("cross_entropy", r"cross_entropy|log_softmax|softmax|nll|logsumexp"),
    ("norm", r"rmsnorm|layernorm|layer_norm|rms_norm|rsqrt"),
    ("rotary", r"rotary|rope"),
    ("mlp_act", r"swiglu|silu|gelu|sigmoid"),
    ("embedding", r"embedding|embed|wte|index_|scatter|gather"),
]


def short_name(name):
    """A readable name: the function a Kokkos lambda sits in, else the name without templates."""
    i = name.find("::{lambda")
    if i > 0:
        s = name[:i]
        # Drop the enclosing function's trailing (args) and <template args>, innermost last.
        while s and s[-1] in ")>":
            close, open_ = s[-1], "(" if s[-1] == ")" else "<"
            depth = 0
            for j in range(len(s) - 1, -1, -1):
                if s[j] == close:
                    depth += 1
                elif s[j] == open_:
                    depth -= 1
                    if depth == 0:
                        s = s[:j]
                        break
            else:
                break
        m = re.search(r"([\w:~]+)$", s)
        if m:
            return m.group(1)
    name = name.replace("(anonymous namespace)", "anon")
    m = re.search(r"Parallel(?:For|Reduce|Scan)<\s*(meshtrain::[\w:]+)", name)
    if m:
        return m.group(1)
    s = re.sub(r"^void ", "", name)
    # PyTorch's multi-tensor kernels differ only in their functor: keep it.
    m = re.match(r"([\w:]*multi_tensor_apply_kernel)<.*?([\w]+Functor)", s)
    if m:
        return f"{m.group(1)}<{m.group(2)}>"
    for c in "<(":
        k = s.find(c)
        if k > 0:
            s = s[:k]
    return s[:120]


def category(kind, name):
    if kind == "C":
        return "copy"
    if kind == "M":
        return "memset"
    low = name.lower()
    for cat, rx in CATEGORIES:
        if re.search(rx, low):
            return cat
    return "other"


def union_length(intervals):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def intersection_length(a, b):
    """Length of the intersection of two unions of intervals."""
    def merged(iv):
        out = []
        for s, e in sorted(iv):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out
    a, b = merged(a), merged(b)
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--step-end", default=r"adamw_update|FusedAdam|fused_adam|adam",
                    help="regex of the optimizer kernel(s) that end a step")
    ap.add_argument("--merge-ms", type=float, default=2.0,
                    help="optimizer runs closer than this to the previous one end the same step "
                    "(PyTorch's two parameter groups)")
    ap.add_argument("--steps", type=int, default=5, help="summarize the last N complete steps")
    ap.add_argument("--top", type=int, default=25, help="kernels to list")
    ap.add_argument("--label", default="", help="a prefix for every line (for summaries)")
    ap.add_argument("--comm-match", default="",
                    help="also give the hidden / exposed split for the NCCL kernels whose name "
                         "matches this regex alone (e.g. SendRecv: context parallelism's ring), "
                         "against the computation, the other NCCL kernels left out")
    a = ap.parse_args()

    dev, host = [], []
    with open(a.trace, newline="") as f:
        for row in csv.DictReader(f):
            item = (int(row["start_ns"]), int(row["end_ns"]), row["kind"], row["name"],
                    int(row["stream"]), int(row["extra"]))
            (dev if row["kind"] in "KCM" else host).append(item)
    dev.sort()
    end_rx = re.compile(a.step_end, re.I)
    # Step ends: the end of each run of consecutive optimizer kernels.
    ends, in_run = [], False
    for s, e, kind, name, _, _ in dev:
        hit = kind == "K" and bool(end_rx.search(name))
        if hit:
            if in_run or (ends and s - ends[-1] < a.merge_ms * 1e6):
                ends[-1] = max(ends[-1], e)
            else:
                ends.append(e)
        in_run = hit or (in_run and kind != "K")
    p = a.label + " " if a.label else ""
    if len(ends) < 2:
        sys.exit(f"{a.trace}: fewer than two step ends match --step-end {a.step_end!r}")
    ends = ends[-(a.steps + 1):]
    n = len(ends) - 1
    walls, busys = [], []
    per_cat = defaultdict(list)
    per_kernel = defaultdict(lambda: [0.0, 0])
    gaps_last, syncs = [], defaultdict(lambda: [0, 0.0])
    comm_union, comm_hidden = [], []  # NCCL kernels per step, and the part compute overlaps
    sel_rx = re.compile(a.comm_match) if a.comm_match else None
    sel_union, sel_hidden = [], []  # the same for the NCCL kernels --comm-match selects
    for i in range(n):
        t0, t1 = ends[i], ends[i + 1]
        items = [d for d in dev if t0 <= d[0] < t1]
        walls.append((t1 - t0) / 1e6)
        busys.append(union_length([(max(s, t0), min(e, t1)) for s, e, *_ in items]) / 1e6)
        cats = defaultdict(float)
        for s, e, kind, name, _, _ in items:
            ms = (e - s) / 1e6
            cats[category(kind, short_name(name))] += ms
            key = short_name(name) if kind == "K" else f"[{kind}] {name}"
            per_kernel[key][0] += ms / n
            per_kernel[key][1] += 1
        for c, v in cats.items():
            per_cat[c].append(v)
        # Communication hidden behind computation, on the GPU's own clock: the time NCCL's
        # kernels run while a kernel of another kind runs too (on another stream).
        comm = [(max(s, t0), min(e, t1)) for s, e, kind, name, *_ in items
                if kind == "K" and category(kind, short_name(name)) == "comm"]
        work = [(max(s, t0), min(e, t1)) for s, e, kind, name, *_ in items
                if kind == "K" and category(kind, short_name(name)) != "comm"]
        comm_union.append(union_length(comm) / 1e6)
        comm_hidden.append(intersection_length(comm, work) / 1e6)
        if sel_rx:
            sel = [(max(s, t0), min(e, t1)) for s, e, kind, name, *_ in items
                   if kind == "K" and category(kind, short_name(name)) == "comm"
                   and sel_rx.search(name)]
            sel_union.append(union_length(sel) / 1e6)
            sel_hidden.append(intersection_length(sel, work) / 1e6)
        if i == n - 1:
            prev_end, prev_name = t0, "(step start)"
            for s, e, kind, name, _, _ in items:
                if s - prev_end > 10000:
                    gaps_last.append(((s - prev_end) / 1e3, prev_name, short_name(name)))
                if e > prev_end:
                    prev_end, prev_name = e, short_name(name) if kind == "K" else name
        for s, e, kind, name, _, _ in host:
            if t0 <= s < t1:
                syncs[f"{kind} {name}"][0] += 1
                syncs[f"{kind} {name}"][1] += (e - s) / 1e6 / n
    wall, busy = statistics.median(walls), statistics.median(busys)
    print(f"{p}trace {a.trace}: {n} steps; step {wall:.2f} ms (min {min(walls):.2f}, max "
          f"{max(walls):.2f}); GPU busy {busy:.2f} ms, idle {wall - busy:.2f} ms")
    print(f"{p}category ms/step (median; sums of kernel times, overlap counted twice)")
    for c, v in sorted(per_cat.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"{p}  {c:<14} {statistics.median(v):8.2f}")
    cu, ch = statistics.median(comm_union), statistics.median(comm_hidden)
    if cu > 0:
        print(f"{p}communication (NCCL kernels) {cu:.2f} ms/step: {ch:.2f} ms overlapped by "
              f"computation ({100 * ch / cu:.0f}% hidden), {cu - ch:.2f} ms exposed")
    if sel_rx:
        su, sh = statistics.median(sel_union), statistics.median(sel_hidden)
        share = f"{100 * sh / su:.0f}% hidden" if su > 0 else "none ran"
        print(f"{p}communication (NCCL kernels matching {a.comm_match!r}) {su:.2f} ms/step: "
              f"{sh:.2f} ms overlapped by computation ({share}), {su - sh:.2f} ms exposed")
    print(f"{p}top kernels: ms/step calls/step name")
    for k, (ms, calls) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print(f"{p}  {ms:8.3f} {calls / n:6.1f}  {k}")
    print(f"{p}idle gaps over 10 us in the last step: {len(gaps_last)}, "
          f"{sum(g for g, *_ in gaps_last) / 1e3:.2f} ms; the largest:")
    for g, before, after in sorted(gaps_last, reverse=True)[:12]:
        print(f"{p}  {g:9.1f} us  after {before[:70]}  before {after[:70]}")
    print(f"{p}host waits and slow runtime calls per step: count ms name")
    for k, (c, ms) in sorted(syncs.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"{p}  {c / n:6.1f} {ms:8.3f}  {k}")


if __name__ == "__main__":
    main()
