#!/usr/bin/env bash
# Run the bundled CUDA build on a GPU machine: tests (NCCL backend included), the collective
# benchmark, and short training runs. Made for the device tool's H200 (one rank per GPU).
#   jobs/bundle-gpu.sh gpubundle build/cuda/src/meshtrain build/cuda/perf/* build/cuda/tests/test_*
#   perf/gpu/tests_and_steps.sh gpubundle OUT_DIR [tests|bench|train|all|profile]
set -uo pipefail
bundle=$(cd "$1" && pwd); out=${2:-/tmp/gpu_run}; what=${3:-all}
mkdir -p "$out"
export LD_LIBRARY_PATH=$bundle/lib:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
export MESHTRAIN_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  for t in "$bundle"/bin/test_*; do
    log=$(mktemp)
    if mpirun -np 1 "$t" > "$log" 2>&1; then r=PASS; else r=FAIL; status=1; fi
    { echo "===== $(basename "$t") $r"; cat "$log"; } >> "$out/tests.log"
    echo "$r $(basename "$t"): $(grep -E 'passed|failed' "$log" | tail -1)"
  done
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  mpirun -np 1 "$bundle/bin/bench_collectives" --max-bytes 1073741824 --iters 20 \
    2>&1 | tee "$out/bench_collectives.txt"
  if [ -x "$bundle/bin/bench_attention" ]; then
    mpirun -np 1 "$bundle/bin/bench_attention" 2>&1 | tee "$out/bench_attention.txt" || status=1
  fi
fi
if [ "$what" = train ] || [ "$what" = all ]; then
  # GPT-2 124M, seq 1024, random-free shipped tokens (byte shards fit the GPT-2 vocabulary).
  for prec in ${PRECISIONS:-fp32}; do
    for mb in ${MICRO_BATCHES:-8 16}; do
      log="$out/train_${prec}_mb$mb.log"
      mpirun -np 1 "$bundle/bin/meshtrain" train --model.preset gpt2-124m \
        --train.micro_batch "$mb" --train.precision "$prec" --train.seq_len 1024 \
        --train.steps "${STEPS:-12}" --train.log_every 1 --train.eval_batches 1 \
        --train.sample_tokens 0 --train.save false --ckpt.final false \
        --train.out_dir "$out/run_${prec}_$mb" \
        > "$log" 2>&1 || status=1
      grep -E "step +(1|${STEPS:-12})/|error" "$log" | sed "s/^/$prec mb$mb: /"
    done
  done
fi
if [ "$what" = profile ]; then
  # Where a step's time goes, kernel by kernel: ours (Kokkos Tools callbacks, the device fenced
  # around every kernel) and PyTorch's (torch.profiler), same model and micro-batch.
  for mb in ${MICRO_BATCHES:-16}; do
    mpirun -np 1 "$bundle/bin/bench_train_step" --preset gpt2-124m --precision bf16 \
      --micro-batch "$mb" --seq-len 1024 --steps 10 --warmup 3 --profile-steps 2 \
      > "$out/profile_meshtrain_mb$mb.txt" 2>&1 || status=1
    head -60 "$out/profile_meshtrain_mb$mb.txt"
    tail -3 "$out/profile_meshtrain_mb$mb.txt"
    if [ -n "${TORCH_MODES:-compile}" ]; then
      python3 perf/reference/torch_gpt2_gpu.py --micro-batch "$mb" --mode "${TORCH_MODES:-compile}" \
        --steps 10 --profile 2 > "$out/profile_torch_mb$mb.txt" 2>&1 || status=1
      head -45 "$out/profile_torch_mb$mb.txt"
    fi
  done
fi
exit $status
