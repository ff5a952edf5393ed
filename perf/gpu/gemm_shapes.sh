#!/usr/bin/env bash
# The same plain bf16 GEMMs through meshtrain (bench_kernels_cuda --shapes) and torch.matmul
# (perf/reference/torch_gemm_shapes.py), alternating, in one device call: is a GEMM gap ours or the
# library's?
#   perf/gpu/gemm_shapes.sh BUNDLE OUT [SHAPES]
# SHAPES (OP:MxNxK[:BETA],...) defaults to every GEMM of the llama3.2-1b step at micro-batch 4,
# seq 2048 (8192 rows) as meshtrain calls them (q/k/v and gate/up merged, head in chunks of
# 1024 rows; the weight gradients accumulate, beta 1), then the ones torch.compile's model calls
# instead (q, k, v and gate, up separate). ROUNDS (default 2) alternates the two sides.
# SHAPES=llama8b-fp8 takes the Llama-3.1-8B step's GEMMs at 8192 rows in the one form FP8 runs
# them (linear_fp8: forward, input gradient and weight gradient all NT on K-contiguous casts),
# and FP8=1 passes --fp8 1: each NT shape also through gemm_fp8 (E4M3, tensorwise and rowwise,
# bf16 out) beside its bf16 row in the same run:
#   FP8=1 perf/gpu/gemm_shapes.sh BUNDLE OUT llama8b-fp8
# Run from the repository root. OUT receives each side's log per round, summary.txt, OUT.logs.tgz.
set -uo pipefail
bundle=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
ours="NT:8192x16384x2048,NN:8192x2048x16384,TN:16384x2048x8192:1"        # gate/up merged
ours+=",NT:8192x2048x8192,NN:8192x8192x2048,TN:2048x8192x8192:1"         # down
ours+=",NT:8192x3072x2048,NN:8192x2048x3072,TN:3072x2048x8192:1"         # q/k/v merged
ours+=",NT:8192x2048x2048,NN:8192x2048x2048,TN:2048x2048x8192:1"         # o
ours+=",NT:1024x128256x2048,NN:1024x2048x128256,TN:128256x2048x1024:1"   # head, one chunk
theirs="NT:8192x8192x2048,NN:8192x2048x8192,TN:8192x2048x8192:1"         # gate or up alone
theirs+=",NT:8192x512x2048,TN:512x2048x8192:1"                           # k or v alone
theirs+=",NT:8192x128256x2048,NN:8192x2048x128256,TN:128256x2048x8192:1" # head, all rows
shapes=${3:-$ours,$theirs}
# Llama-3.1-8B (hidden 4096, q/k/v merged 6144, gate/up merged 28672, down 14336 -> 4096):
# forward N x OC x IC, input gradient N x IC x OC, weight gradient IC x OC x N (accumulating).
llama8b_fp8="NT:8192x6144x4096,NT:8192x4096x6144,NT:4096x6144x8192:1"             # q/k/v
llama8b_fp8+=",NT:8192x4096x4096,NT:4096x4096x8192:1"                               # o
llama8b_fp8+=",NT:8192x28672x4096,NT:8192x4096x28672,NT:4096x28672x8192:1"        # gate/up
llama8b_fp8+=",NT:8192x4096x14336,NT:8192x14336x4096,NT:14336x4096x8192:1"        # down
[ "$shapes" = llama8b-fp8 ] && shapes=$llama8b_fp8
fp8_args=()
[ "${FP8:-0}" = 1 ] && fp8_args=(--fp8 1)
# shellcheck disable=SC1091
source "$bundle/env.sh"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sum=$out/summary.txt what=all status=0
# shellcheck source=perf/gpu/lib.sh
source "$here/lib.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$sum"
for round in $(seq 1 "${ROUNDS:-2}"); do
  run "meshtrain_$round" 200 "$bundle/bin/bench_kernels_cuda" --shapes "$shapes" --iters 20 \
    --warmup 3 ${fp8_args[@]+"${fp8_args[@]}"}
  grep -E "gemm|rror" "$out/meshtrain_$round.log" | sed "s/^/r$round /" | tee -a "$sum"
  run "torch_$round" 200 python3 "$here/../reference/torch_gemm_shapes.py" --shapes "$shapes" --iters 20 \
    --warmup 3
  grep -E "gemm|rror" "$out/torch_$round.log" | sed "s/^/r$round /" | tee -a "$sum"
done
tar czf "$out.logs.tgz" -C "$(dirname "$out")" "$(basename "$out")"
exit $status
