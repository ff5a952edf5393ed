#!/usr/bin/env python3
"""PyTorch's NCCL collectives in the columns of bench_collectives (nccl-tests' algbw/busbw).

Launched by mpirun (one process per GPU; rank and size from Open MPI's environment):
    mpirun -np 2 python3 perf/reference/torch_collectives.py [--min-bytes 1024] [--max-bytes 1073741824]
Time = median over --iters of one operation between barriers (max over ranks), float32 buffers;
"size" is the all-reduce buffer, the all-gather output, the reduce-scatter input.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl", rank=rank, world_size=world)
    n = world
    factors = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
               "reduce_scatter": (n - 1) / n}
    if rank == 0:
        print(f"# torch {torch.__version__} NCCL {torch.cuda.nccl.version()} ranks {n}")
        print(f"{'op':>16} {'size(B)':>12} {'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
    size = a.min_bytes
    while size <= a.max_bytes:
        elems = max(size // 4 // n * n, n)
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            if op == "all_reduce":
                buf = torch.ones(elems, device="cuda")
                fn = lambda: dist.all_reduce(buf)
            elif op == "all_gather":
                out = torch.empty(elems, device="cuda")
                inp = torch.ones(elems // n, device="cuda")
                fn = lambda: dist.all_gather_into_tensor(out, inp)
            else:
                inp = torch.ones(elems, device="cuda")
                out = torch.empty(elems // n, device="cuda")
                fn = lambda: dist.reduce_scatter_tensor(out, inp)
            times = []
            for i in range(a.warmup + a.iters):
                dist.barrier()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                t = torch.tensor([time.perf_counter() - t0], device="cuda")
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                if i >= a.warmup:
                    times.append(t.item())
            sec = statistics.median(times)
            bytes_ = elems * 4
            algbw = bytes_ / sec / 1e9
            if rank == 0:
                print(f"{op:>16} {bytes_:>12} {sec * 1e6:>10.1f} {algbw:>12.2f} "
                      f"{algbw * factors[op]:>12.2f}")
        size *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
