#!/usr/bin/env bash
# This round's GPU figures (issues 18 and 20), each part with its own timeout, one log per run
# and summary.txt in OUT:
#   perf/archive/gpu-rounds/gpu_round3.sh BUNDLE OUT [ce,step,large,torchlarge,moe,moeprof,llamaprof,mixtral,tests]
# ce:         bench_kernels_cuda's cross-entropy rows with the register form (default) and the
#             shared-memory form (MESHTRAIN_CE_KERNEL=smem), and test_kernels_cross_entropy with
#             the latter;
# step:       GPT-2 124M bf16 seq 1024, cuDNN attention, mb 16 and 32: the step with each
#             cross-entropy form, two alternating rounds each;
# large:      GPT-2 774M mb 8, 1.5B mb 4 with and without --recompute-mlp-act, 1.5B mb 16 with
#             (LARGE_RUNS="preset:mb:0|1 ..." overrides);
# torchlarge: torch.compile (perf/reference/torch_gpt2_gpu.py) at the same sizes;
# moe:        GPT-2-124M-sized MoE (8 GELU experts of 4C, top-2, every block) bf16 seq 1024 mb 8:
#             ours against perf/reference/torch_moe_gpu.py (compile with torch._grouped_mm, and eager);
# moeprof:    the MoE step's per-kernel profile;
# llamaprof:  the Llama step's per-kernel profile (LLAMA_PROF="preset:mb ...");
# mixtral:    tests/reference/hf_mixtral_crosscheck.py with BUNDLE's meshtrain;
# tests:      every test_* in BUNDLE/bin.
# CE_FORM=regs runs the large / moe parts with the register cross-entropy (default smem);
# STEP_ROUNDS (default "1 2") and STEP_FORMS (default "regs smem") narrow the step part.
set -uo pipefail
bundle=$(cd "$1" && pwd); out=$2; what=${3:-ce,step,tests}
export MESHTRAIN_SOURCE_DIR=$PWD
mkdir -p "$out"
# shellcheck disable=SC1091
source "$bundle/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sum=$out/summary.txt
status=0
# shellcheck source=perf/gpu/lib.sh
source "$here/../../gpu/lib.sh"
step() {  # step NAME SECONDS CE_FORM ARGS...: bench_train_step, its figures into the summary
  local name=$1 secs=$2 f=$3; shift 3
  run "$name" "$secs" env MESHTRAIN_CE_KERNEL="$f" "$bundle/bin/bench_train_step" \
    --precision bf16 --seq-len 1024 --profile-steps 0 "$@"
  grep -E "^peak|^step_ms|^tokens/s|^mfu|^RESULT|rror" "$out/$name.log" | sed "s/^/  /" | tee -a "$sum"
}
form=${CE_FORM:-}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$sum"
python3 -c 'import torch; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version())' \
  2>/dev/null | tee -a "$sum"

if has ce; then
  for f in regs smem; do
    run "ce_bench_$f" 60 env MESHTRAIN_CE_KERNEL=$f "$bundle/bin/bench_kernels_cuda" --iters 20
    grep -E "cross_entropy" "$out/ce_bench_$f.log" | sed "s/^/  $f /" | tee -a "$sum"
  done
  run test_kernels_cross_entropy_smem 120 env MESHTRAIN_CE_KERNEL=smem \
    "$bundle/bin/test_kernels_cross_entropy"
  grep -E "test cases|passed|failed" "$out/test_kernels_cross_entropy_smem.log" | tail -2 | tee -a "$sum"
fi

if has step; then
  for mb in 16 32; do
    for round in ${STEP_ROUNDS:-1 2}; do
      for f in ${STEP_FORMS:-regs smem}; do
        step "step_mb${mb}_${f}_$round" 120 "$f" --preset gpt2-124m \
          --micro-batch "$mb" --steps 30 --warmup 5 --attn-impl cudnn
      done
    done
  done
fi

if has large; then
  # preset:micro-batch:recompute_mlp_act
  for run in ${LARGE_RUNS:-gpt2-774m:8:0 gpt2-774m:8:1 gpt2-1.5b:4:0 gpt2-1.5b:4:1 gpt2-1.5b:16:1}; do
    IFS=: read -r preset mb rc <<< "$run"
    step "large_${preset}_mb${mb}_rca$rc" 150 "${form:-smem}" \
      --preset "$preset" --micro-batch "$mb" --steps 10 --warmup 3 --attn-impl cudnn \
      --recompute-mlp-act "$rc"
  done
fi

if has torchlarge; then
  for pm in ${TORCH_RUNS:-gpt2-774m:8 gpt2-1.5b:4 gpt2-1.5b:16}; do
    preset=${pm%%:*} mb=${pm##*:}
    run "torch_${preset}_mb$mb" 200 python3 "$here/../../reference/torch_gpt2_gpu.py" --preset "$preset" \
      --micro-batch "$mb" --mode compile --steps 10 --warmup 4
    grep -E "^pytorch|rror" "$out/torch_${preset}_mb$mb.log" | tee -a "$sum"
  done
fi

if has moe; then
  for mb in 8; do
    step "moe_ours_mb$mb" 200 "${form:-smem}" --preset gpt2-124m \
      --micro-batch "$mb" --steps 20 --warmup 5 --attn-impl cudnn --moe-experts 8 --moe-top-k 2
    run "moe_torch_mb$mb" 300 python3 "$here/../../reference/torch_moe_gpu.py" --micro-batch "$mb" \
      --mode ${MOE_TORCH_MODES:-compile,eager} --steps 20 --warmup 5
    grep -E "^pytorch|rror" "$out/moe_torch_mb$mb.log" | tee -a "$sum"
  done
fi

if has moeprof; then
  # Where the MoE step's time goes: bench_train_step's per-kernel table (2 profiled steps).
  run moe_profile 200 "$bundle/bin/bench_train_step" --precision bf16 --seq-len 1024 \
    --preset gpt2-124m --micro-batch 8 --steps 5 --warmup 2 --profile-steps 2 --attn-impl cudnn \
    --moe-experts 8 --moe-top-k 2
  grep -A30 -E "^label" "$out/moe_profile.log" | tee -a "$sum"
fi

if has llamaprof; then
  # Where the Llama step's time goes (issue 19): llama-150m mb 16 and llama3.2-1b mb 4, seq 2048.
  for cfg in ${LLAMA_PROF:-llama-150m:16 llama3.2-1b:4}; do
    preset=${cfg%%:*} mb=${cfg##*:}
    run "llama_profile_${preset}_mb$mb" 200 "$bundle/bin/bench_train_step" --precision bf16 \
      --seq-len 2048 --preset "$preset" --micro-batch "$mb" --steps 5 --warmup 2 --profile-steps 2 \
      --attn-impl cudnn
    grep -E "^peak|^step_ms|^tokens/s|^mfu" "$out/llama_profile_${preset}_mb$mb.log" | tee -a "$sum"
    grep -A30 -E "^label" "$out/llama_profile_${preset}_mb$mb.log" | tee -a "$sum"
  done
fi

if has mixtral; then
  # transformers loads our exported Mixtral folder and we load what it writes (issue 20).
  run hf_mixtral_crosscheck 300 python3 tests/reference/hf_mixtral_crosscheck.py \
    --meshtrain "$bundle/bin/meshtrain"
  grep -E "PASS|FAIL|max|form|rror" "$out/hf_mixtral_crosscheck.log" | tail -20 | tee -a "$sum"
fi

if has tests; then
  for t in "$bundle"/bin/test_*; do
    n=$(basename "$t")
    run "$n" 200 "$t"
    grep -E "All tests passed|test cases" "$out/$n.log" | tail -1 | sed "s/^/  /" | tee -a "$sum"
    grep -A6 -E "FAILED:|error:|what\(\)" "$out/$n.log" | head -40 | sed "s/^/    /" | tee -a "$sum"
  done
fi
# Every log in one archive (the device tool returns a limited number of files).
tar czf "$out.logs.tgz" -C "$(dirname "$out")" "$(basename "$out")"
exit $status
