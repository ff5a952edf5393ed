#!/usr/bin/env python3
"""perf/tools/cupti_trace_summary.py on a synthetic timeline whose figures are known: three
steps cut at the optimizer kernel, compute kernels, an NCCL kernel that computation overlaps
for part of its time, an idle gap and a host synchronisation.

  tests/scripts/test_cupti_summary.py SOURCE_DIR
"""
import os
import re
import subprocess
import sys
import tempfile

root = sys.argv[1] if len(sys.argv) > 1 else "."
tool = os.path.join(root, "perf", "tools", "cupti_trace_summary.py")
ms = 1_000_000  # ns

rows = ["kind,start_ns,end_ns,stream,extra,name"]
for step in range(3):
    t = step * 10 * ms
    # 10 ms steps: a GEMM 0-4 ms on stream 7; an NCCL all-reduce 3-6 ms on stream 9 (1 ms of it
    # under the GEMM: hidden; 2 ms alone: exposed); a gap 6-7 ms; the optimizer 7-10 ms.
    rows.append(f"K,{t},{t + 4 * ms},7,1,sm90_xmma_gemm_bf16_tn")
    rows.append(f"K,{t + 3 * ms},{t + 6 * ms},9,1,ncclDevKernel_AllReduce_Sum_bf16_RING_LL")
    rows.append(f"K,{t + 7 * ms},{t + 10 * ms},7,1,"
                "void meshtrain::kernels::adamw_update<float>(int)")
    rows.append(f"Y,{t + 6 * ms},{t + 6 * ms + 500_000},0,0,stream synchronize")
# With a ring's send/recv 2-5 ms on stream 11: 2-4 ms under the GEMM (hidden), 4-5 ms beside the
# all-reduce only, which is not computation (exposed): --comm-match SendRecv splits it alone.
ring = list(rows)
for step in range(3):
    t = step * 10 * ms
    ring.append(f"K,{t + 2 * ms},{t + 5 * ms},11,1,ncclDevKernel_SendRecv")


def summary(trace_rows, *args):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.csv")
        with open(path, "w") as f:
            f.write("\n".join(trace_rows) + "\n")
        return subprocess.run([sys.executable, tool, path, "--steps", "2", *args], check=True,
                              capture_output=True, text=True).stdout


out = summary(rows)
print(out)
ring_out = summary(ring, "--comm-match", "SendRecv")
print(ring_out)
if not re.search(r"NCCL kernels matching 'SendRecv'\) 3\.00 ms/step: 2\.00 ms overlapped by "
                 r"computation \(67% hidden\), 1\.00 ms exposed", ring_out):
    sys.exit("test_cupti_summary: the --comm-match line is not the ring's 2 of 3 ms hidden")


def need(pattern):
    if not re.search(pattern, out, re.M):
        sys.exit(f"test_cupti_summary: no line matches {pattern!r}")


need(r"2 steps; step 10\.00 ms .* GPU busy 9\.00 ms, idle 1\.00 ms")
need(r"^  comm +3\.00$")
need(r"^  gemm +4\.00$")
need(r"^  optimizer +3\.00$")
need(r"communication \(NCCL kernels\) 3\.00 ms/step: 1\.00 ms overlapped by computation "
     r"\(33% hidden\), 2\.00 ms exposed")
need(r"1000\.0 us  after ncclDevKernel_AllReduce_Sum_bf16_RING_LL")
print("test_cupti_summary: passed")
