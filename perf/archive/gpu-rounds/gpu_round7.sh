#!/usr/bin/env bash
# GPU round 7 on one H200, in one device call: the cross-entropy row copied by cp.async, the
# column sums' second stage, the norms' backward loads, Llama's merged q/k/v and gate/up GEMMs.
#   perf/archive/gpu-rounds/gpu_round7.sh BUNDLE OUT [ce,step,torch,llama,torchllama,prof,tests]
# ce:    bench_kernels_cuda's cross-entropy rows (GPT-2 vocabulary, bf16 and fp32) with each form:
#        MESHTRAIN_CE_KERNEL=regs (registers) and the default (shared memory, cp.async), at 16384
#        rows (mb 16 in one chunk) and 2560 rows (one head chunk at mb 32); CE_FORMS overrides
#        the list (the first call of this round also ran smem_sync, the shared-memory form with
#        plain loads, which its commit then removed);
# step:  GPT-2 124M bf16 seq 1024, cuDNN attention, mb 16 and 32, chunked head (auto): the step
#        with STEP_ROUNDS (default "1 2") alternating rounds
#        (STEP_VARIANTS="label:bundle:form[:VAR=v,VAR2=w] ..." runs other bundles' binaries, or
#        the same with other environment settings, in the same rounds);
# torch: torch.compile (perf/reference/torch_gpt2_gpu.py) at mb 16 and 32, 30 steps after 5;
# llama: bench_train_step of llama-150m (mb 8, 16) and llama3.2-1b (mb 4, 8), bf16 seq 2048,
#        LLAMA_VARIANTS="label:bundle[:VAR=v,...] ..." (default this bundle) in STEP_ROUNDS rounds,
#        LLAMA_CFGS="preset:mb ..." overrides the four;
# torchllama: perf/gpu/llama_crosscheck.sh's torch part, torch.compile only (the same models);
# prof:  the per-kernel profile (device fenced around every kernel) of GPT-2 124M mb 32 and
#        llama3.2-1b mb 8 (PROF_CFGS="preset:mb:seq ...");
# tests: every test_* in BUNDLE through perf/archive/gpu-rounds/gpu_round3.sh (test_kernels_cross_entropy: each
#        form against the portable kernels).
# Run from the repository root. OUT receives one log per run, summary.txt and OUT.logs.tgz.
set -uo pipefail
bundle=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd); what=${3:-ce,step,torch,llama,torchllama,prof,tests}
# shellcheck disable=SC1091
source "$bundle/env.sh"
# After env.sh, which sets its own $here.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
export MESHTRAIN_SOURCE_DIR=$PWD
sum=$out/summary.txt
status=0
# shellcheck source=perf/gpu/lib.sh
source "$here/../../gpu/lib.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$sum"

if has ce; then
  for rows in 16384 2560; do
    for f in ${CE_FORMS:-regs default}; do
      name=ce_bench_${f}_rows$rows
      run "$name" 90 env MESHTRAIN_CE_KERNEL=$f "$bundle/bin/bench_kernels_cuda" --iters 30 \
        --rows "$rows"
      grep -E "cross_entropy" "$out/$name.log" | sed "s/^/  $f rows $rows /" | tee -a "$sum"
    done
  done
  for f in regs; do
    run "test_kernels_cross_entropy_$f" 120 env MESHTRAIN_CE_KERNEL=$f \
      "$bundle/bin/test_kernels_cross_entropy"
    grep -E "All tests passed|test cases" "$out/test_kernels_cross_entropy_$f.log" | tail -1 |
      sed "s/^/  /" | tee -a "$sum"
  done
fi

if has step; then
  # STEP_VARIANTS: "label:bundle:form ..." (default: this bundle, its default cross-entropy form),
  # so that a bundle built before a change can run next to one built after it.
  for mb in 16 32; do
    for round in ${STEP_ROUNDS:-1 2}; do
      for v in ${STEP_VARIANTS:-new:$bundle:default}; do
        IFS=: read -r label b f extra <<< "$v"
        name=step_mb${mb}_${label}_$round
        # shellcheck disable=SC2086  # extra: comma-separated VAR=value pairs, one word each
        run "$name" 120 env MESHTRAIN_CE_KERNEL="$f" ${extra//,/ } "$b/bin/bench_train_step" \
          --preset gpt2-124m --precision bf16 --seq-len 1024 --micro-batch "$mb" --steps 30 \
          --warmup 5 --profile-steps 0 --attn-impl cudnn
        grep -E "^peak|^step_ms|^tokens/s|^mfu|rror" "$out/$name.log" | sed "s/^/  $name /" |
          tee -a "$sum"
      done
    done
  done
fi

if has torch; then
  for mb in 16 32; do
    run "torch_gpt2_mb$mb" 200 python3 "$here/../../reference/torch_gpt2_gpu.py" --preset gpt2-124m \
      --micro-batch "$mb" --mode compile --steps 30 --warmup 5
    grep -E "^pytorch|rror" "$out/torch_gpt2_mb$mb.log" | tee -a "$sum"
  done
fi

if has llama; then
  for cfg in ${LLAMA_CFGS:-llama-150m:8 llama-150m:16 llama3.2-1b:4 llama3.2-1b:8}; do
    IFS=: read -r preset mb <<< "$cfg"
    for round in ${STEP_ROUNDS:-1 2}; do
      for v in ${LLAMA_VARIANTS:-new:$bundle}; do
        IFS=: read -r label b extra <<< "$v"
        name=bench_${preset}_mb${mb}_${label}_$round
        # shellcheck disable=SC2086  # extra: comma-separated VAR=value pairs, one word each
        run "$name" 150 env ${extra//,/ } "$b/bin/bench_train_step" --preset "$preset" --precision bf16 \
          --micro-batch "$mb" --seq-len 2048 --steps 10 --warmup 3 --profile-steps 0
        grep -E "^peak|^step_ms|^tokens/s|^mfu|rror" "$out/$name.log" | sed "s/^/  $name /" |
          tee -a "$sum"
      done
    done
  done
fi

if has torchllama; then
  LLAMA_TORCH_MODES=compile "$here/../../gpu/llama_crosscheck.sh" "$bundle" "$out/llama" torch ||
    status=1
  cat "$out/llama/summary.txt" >> "$sum"
fi

if has prof; then
  for cfg in ${PROF_CFGS:-gpt2-124m:32:1024 llama3.2-1b:8:2048}; do
    IFS=: read -r preset mb seq <<< "$cfg"
    name=profile_${preset}_mb$mb
    run "$name" 200 "$bundle/bin/bench_train_step" --preset "$preset" --precision bf16 \
      --seq-len "$seq" --micro-batch "$mb" --steps 5 --warmup 2 --profile-steps 2 --attn-impl cudnn
    grep -E "^peak|^step_ms|^tokens/s" "$out/$name.log" | sed "s/^/  $name /" | tee -a "$sum"
    grep -A40 -E "^label" "$out/$name.log" | tee -a "$sum"
  done
fi

if has tests; then
  "$here/gpu_round3.sh" "$bundle" "$out/tests" tests || status=1
  cat "$out/tests/summary.txt" >> "$sum"
fi
tar czf "$out.logs.tgz" -C "$(dirname "$out")" "$(basename "$out")"
exit $status
