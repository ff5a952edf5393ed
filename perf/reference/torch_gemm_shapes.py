#!/usr/bin/env python3
"""Plain bf16 GEMMs through torch.matmul, the counterpart of `bench_kernels_cuda --shapes`.

Each item of --shapes is OP:MxNxK[:BETA] as bench_kernels_cuda reads it: OP gives op(A) and
op(B) (N or T) of row-major A [M, K] (or [K, M] for T) and B [K, N] (or [N, K]); BETA 1
accumulates into C (C.addmm_), as the weight gradients do. Transposes are views, so cuBLAS gets
the same operation and layouts as meshtrain's call; torch picks its algorithm by cuBLASLt's
heuristic, meshtrain by timing the heuristic's first 8. Median of --iters after --warmup,
CUDA events around each call, the same figures as the C++ side prints.

    python3 perf/reference/torch_gemm_shapes.py --shapes NT:8192x16384x2048,TN:16384x2048x8192:1
"""
import argparse
import statistics

import torch


def parse(item):
    parts = item.split(":")
    op, dims = parts[0], parts[1]
    beta = int(parts[2]) if len(parts) > 2 else 0
    m, n, k = (int(v) for v in dims.split("x"))
    if len(op) != 2 or any(c not in "NT" for c in op) or beta not in (0, 1):
        raise SystemExit(f"torch_gemm_shapes: --shapes item '{item}' is not OP:MxNxK[:BETA]")
    return op, m, n, k, beta


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    print(f"plain bf16 GEMMs (torch.matmul, torch {torch.__version__}), median of {a.iters} "
          f"after {a.warmup}")
    for item in a.shapes.split(","):
        op, m, n, k, beta = parse(item)
        def rnd(r, c):
            return torch.rand(r, c, device=dev, generator=g, dtype=torch.float32).mul_(2).sub_(1).to(torch.bfloat16)
        A = rnd(m, k) if op[0] == "N" else rnd(k, m).t()
        B = rnd(k, n) if op[1] == "N" else rnd(n, k).t()
        C = rnd(m, n)
        if beta:
            fn = lambda: C.addmm_(A, B)
        else:
            fn = lambda: torch.matmul(A, B, out=C)
        for _ in range(a.warmup):
            fn()
        times = []
        for _ in range(a.iters):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        ms = statistics.median(times)
        tf = 2.0 * m * n * k / 1e9
        print(f"torch     gemm {op} {m:6d}x{n:6d}x{k:6d} beta {beta} {ms:9.4f} ms {tf / ms:6.1f} TF/s")


if __name__ == "__main__":
    main()
