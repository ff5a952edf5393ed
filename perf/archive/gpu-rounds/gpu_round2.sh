#!/usr/bin/env bash
# Issue 16's GPU before/after and issue 18's cuDNN library comparison, one device call:
#   perf/archive/gpu-rounds/gpu_round2.sh MAIN_BUNDLE BASE_BUNDLE TESTS_BUNDLE OUT [ab,cudnnlib,tests]
# ab:       perf/gpu/ab_step.sh BASE MAIN, main with --attn-impl meshtrain (the kernels the base
#           build has), GPT-2 124M bf16 mb 16, 5 interleaved rounds;
# cudnnlib: the training step with cuDNN attention through the machine's libcudnn and through
#           the nvidia-cudnn-cu13 wheel's (the one PyTorch runs), mb 16 and 32, and
#           bench_attention --table 1 with each;
# tests:    every test_* of TESTS_BUNDLE and MAIN_BUNDLE (the GPU test set), one log each.
set -uo pipefail
main=$(cd "$1" && pwd); base=$(cd "$2" && pwd); tests=$(cd "$3" && pwd); out=$4
what=${5:-ab,cudnnlib,tests}
mkdir -p "$out"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
export MESHTRAIN_SOURCE_DIR=$PWD
has() { [[ ",$what," == *",$1,"* ]]; }
sum=$out/summary.txt
note() { echo "$*" | tee -a "$sum"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$sum"
wheel=$(python3 -c 'import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
note "cuDNN wheel: ${wheel:-none}; system: $(ldconfig -p | grep -m1 'libcudnn\.so\.9 ' || echo none)"

if has ab; then
  ARGS_B="--attn-impl meshtrain" timeout 300 "$here/../../gpu/ab_step.sh" "$base" "$main" 5 16 30 \
    > "$out/ab.log" 2>&1
  note "== ab: rc $?"; tail -3 "$out/ab.log" | tee -a "$sum"
fi

if has cudnnlib; then
  for lib in system wheel; do
    for mb in 16 32; do
      log=$out/cudnn_${lib}_mb$mb.log
      ( export LD_LIBRARY_PATH=$main/lib:${LD_LIBRARY_PATH:-}
        if [ "$lib" = wheel ]; then export LD_LIBRARY_PATH=$wheel:$LD_LIBRARY_PATH; fi
        timeout 120 "$main/bin/bench_train_step" --preset gpt2-124m --precision bf16 \
          --micro-batch "$mb" --seq-len 1024 --steps 20 --warmup 3 --profile-steps 0 \
          --attn-impl cudnn ) > "$log" 2>&1
      note "== cudnn $lib mb$mb: rc $?"
      grep -E "^attention:|^step_ms|^tokens/s|^peak" "$log" | sed "s/^/  /" | tee -a "$sum"
    done
    ( export LD_LIBRARY_PATH=$main/lib:${LD_LIBRARY_PATH:-}
      if [ "$lib" = wheel ]; then export LD_LIBRARY_PATH=$wheel:$LD_LIBRARY_PATH; fi
      timeout 100 "$main/bin/bench_attention" --table 1 --iters 10 --warmup 2 ) \
      > "$out/attention_table_$lib.log" 2>&1
    note "== attention table, $lib cuDNN: rc $?"
    grep -E "^\|" "$out/attention_table_$lib.log" | tee -a "$sum"
  done
fi

if has tests; then
  # shellcheck disable=SC1091
  source "$main/env.sh"
  export LD_LIBRARY_PATH=$tests/lib:$LD_LIBRARY_PATH
  for t in "$tests"/bin/test_* "$main"/bin/test_*; do
    n=$(basename "$t")
    timeout 200 "$t" > "$out/$n.log" 2>&1
    note "== $n: rc $? $(grep -E 'All tests passed|test cases' "$out/$n.log" | tail -1)"
  done
fi
