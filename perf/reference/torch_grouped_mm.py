#!/usr/bin/env python3
"""The expert GEMMs of an MoE layer through torch._grouped_mm: the PyTorch side of
perf/bench/bench_expert_gemm_cublas.cu, at the same shapes and with the same work.

8 experts (hidden 768, expert FFN 3072), 16384 routed rows per layer, 12 layers, bf16. Each layer
runs the forward as two grouped GEMMs (fc, then proj, no activation between them) and its
backward (dx and dW of both), with new row counts every layer: log-normal expert loads (log
standard deviation 0.5) splitting the rows in proportion. The data are zeros: only time matters.

    python3 perf/reference/torch_grouped_mm.py

Prints one line: the median and minimum wall time of 25 iterations of all 12 layers after 5
warm-up, and TFLOP/s at the median (6 GEMMs of 2 x rows x hidden x ffn FLOPs per layer), to set
beside the C++ benchmark's lines. Needs PyTorch >= 2.8 on a CUDA sm90 GPU (torch._grouped_mm).
"""
import time

import torch

EXPERTS = 8
HIDDEN = 768
FFN = 3072
ROWS_PER_LAYER = 16384
LAYERS = 12
SPREAD = 0.5
WARMUP_ITERS = 5
TIMED_ITERS = 25
SEED = 1234

generator = torch.Generator().manual_seed(SEED)


def expert_counts():
    """Rows per expert for one layer; the rounding remainder goes to expert 0."""
    loads = torch.exp(torch.randn(EXPERTS, generator=generator) * SPREAD)
    counts = (ROWS_PER_LAYER * loads / loads.sum()).int()
    counts[0] += ROWS_PER_LAYER - counts.sum()
    return counts


def main():
    def zeros(*shape, requires_grad=False):
        return torch.zeros(*shape, device="cuda", dtype=torch.bfloat16,
                           requires_grad=requires_grad)

    # Rows sorted by expert, weights stacked per expert.
    x = zeros(ROWS_PER_LAYER, HIDDEN, requires_grad=True)
    w_fc = zeros(EXPERTS, HIDDEN, FFN, requires_grad=True)
    w_proj = zeros(EXPERTS, FFN, HIDDEN, requires_grad=True)
    dy = zeros(ROWS_PER_LAYER, HIDDEN)

    times_ms = []
    for _ in range(WARMUP_ITERS + TIMED_ITERS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(LAYERS):
            # _grouped_mm takes each expert's end row, on the device.
            offsets = torch.cumsum(expert_counts(), 0).to(torch.int32).cuda()
            hidden = torch._grouped_mm(x, w_fc, offs=offsets)
            y = torch._grouped_mm(hidden, w_proj, offs=offsets)
            y.backward(dy)
        torch.cuda.synchronize()
        times_ms.append((time.perf_counter() - start) * 1e3)

    times_ms = sorted(times_ms[WARMUP_ITERS:])
    median_ms = times_ms[len(times_ms) // 2]
    flops = 6.0 * 2 * ROWS_PER_LAYER * HIDDEN * FFN * LAYERS
    print(f"torch._grouped_mm eager fwd+bwd    wall median {median_ms:8.2f} ms  "
          f"min {times_ms[0]:8.2f}  {flops / (median_ms * 1e-3) / 1e12:6.0f} TFLOP/s")


if __name__ == "__main__":
    main()
