#!/usr/bin/env bash
# GPT-2 124M on one GPU against PyTorch, in one device call (first written for issue 4): the
# kernel/parity/trainer tests of the bundle, the row-wise kernel benchmark, our per-kernel profile,
# then the trainer (bf16, micro-batch 16 and 32) next to PyTorch eager and torch.compile.
#   jobs/bundle-gpu.sh gpubundle build/cuda/src/meshtrain build/cuda/perf/bench/bench_{train_step,kernels_cuda} build/cuda/tests/test_...
#   perf/gpu/gpt2_step_vs_torch.sh gpubundle OUT_DIR
set -uo pipefail
bundle=$1; keep=$2
work=$(mktemp -d)
status=0
bash perf/gpu/tests_and_steps.sh "$bundle" "$work" tests || status=1
if [ -x "$bundle/bin/bench_kernels_cuda" ]; then
  LD_LIBRARY_PATH=$bundle/lib:${LD_LIBRARY_PATH:-} OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 1 "$bundle/bin/bench_kernels_cuda" \
    > "$work/bench_kernels_cuda.txt" 2>&1 || status=1
  tail -12 "$work/bench_kernels_cuda.txt"
fi
MICRO_BATCHES=16 TORCH_MODES="" bash perf/gpu/tests_and_steps.sh "$bundle" "$work" profile > /dev/null || status=1
grep -E "^step_ms|^peak|^meshtrain::|^Kokkos|^# gemm|host code" "$work/profile_meshtrain_mb16.txt" | head -30
PRECISIONS=bf16 MICRO_BATCHES="16 32" STEPS=20 bash perf/gpu/tests_and_steps.sh "$bundle" "$work" train || status=1
python3 perf/reference/torch_gpt2_gpu.py --micro-batch 16,32 --mode eager,compile --steps 20 \
  2>&1 | grep -v Warning | tee "$work/torch.txt"
cp "$work"/tests.log "$work"/bench_kernels_cuda.txt "$work"/profile_meshtrain_mb16.txt \
  "$work"/train_bf16_mb16.log "$work"/train_bf16_mb32.log "$work"/torch.txt "$keep"/ 2>/dev/null
exit $status
