#!/usr/bin/env bash
# Issue 18's attention figures in one device call: the attention tests of the GPU set (ours,
# grouped-query, cuDNN against ours and fp32), bench_attention (ours vs cuDNN per shape), GPT-2
# 124M bf16 training steps at micro-batch 16 and 32 with --attn.impl meshtrain and cudnn, and
# PyTorch (perf/reference/torch_gpt2_gpu.py) compile and eager at the same sizes. Each part has its own
# timeout, so one that hangs or runs long costs only its share of the call.
#   jobs/bundle-gpu.sh BUNDLE build/cuda/perf/bench/bench_{attention,train_step} \
#     build/cuda/tests/test_kernels_attention{,_gqa,_cudnn}
#   perf/gpu/attention.sh BUNDLE OUT [tests,bench,train,torch,large,curve,profile]
# large: GPT-2 774M (mb 8) and 1.5B (mb 4) steps, ours (both attention paths) and torch.compile;
# curve: the bf16 200-step loss curve on the shipped shards with cuDNN attention (needs
# inputs/data); profile: the per-kernel profile of our step with cuDNN next to PyTorch's.
# BUNDLE holds bin/, lib/ and env.sh (which finds cuDNN: the machine's or the nvidia-cudnn-cu13
# wheel's); OUT receives one log per part and summary.txt.
set -uo pipefail
bundle=$(cd "$1" && pwd); out=$2; what=${3:-tests,bench,train,torch}
export MESHTRAIN_SOURCE_DIR=$PWD
mkdir -p "$out"
# shellcheck disable=SC1091
source "$bundle/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sum=$out/summary.txt
status=0
# shellcheck source=perf/gpu/lib.sh
source "$here/lib.sh"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$sum"
python3 -c 'import torch; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version())' \
  2>/dev/null | tee -a "$sum"

if has tests; then
  for t in test_kernels_attention test_kernels_attention_gqa test_kernels_attention_cudnn; do
    [ -x "$bundle/bin/$t" ] || { note "== $t: missing from the bundle"; status=1; continue; }
    # cuDNN's own error log (CUDNN_LOGERR_DBG) says why a graph or engine was refused.
    run "$t" 240 env CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr "$bundle/bin/$t"
    grep -E "test cases|passed|failed|REQUIRE|CHECK|with expansion|FAILED" "$out/$t.log" | tail -8 | tee -a "$sum"
  done
fi

if has bench; then
  run bench_attention 120 "$bundle/bin/bench_attention" --iters 20 --warmup 3 --flash-iters 1
  grep -E "^(bf16|fp32)" "$out/bench_attention.log" | tee -a "$sum"
  run bench_attention_table 200 "$bundle/bin/bench_attention" --table 1 --iters 10 --warmup 2
  grep -E "^\||cuDNN" "$out/bench_attention_table.log" | tee -a "$sum"
fi

if has train; then
  for mb in 16 32; do
    for impl in meshtrain cudnn; do
      run "train_${impl}_mb$mb" 150 "$bundle/bin/bench_train_step" --preset gpt2-124m \
        --precision bf16 --micro-batch "$mb" --seq-len 1024 --steps 20 --warmup 3 \
        --profile-steps 0 --attn-impl "$impl"
      grep -E "^peak|^step_ms|^tokens/s|attention:|rror" "$out/train_${impl}_mb$mb.log" |
        sed "s/^/$impl mb$mb: /" | tee -a "$sum"
    done
  done
fi

if has torch; then
  for mode in compile eager; do
    run "torch_$mode" 300 python3 "$here/../reference/torch_gpt2_gpu.py" --micro-batch 16,32 --mode "$mode" \
      --steps 20 --warmup 5
    grep -E "^pytorch" "$out/torch_$mode.log" | tee -a "$sum"
  done
fi
if has large; then
  for pm in gpt2-774m:8 gpt2-1.5b:4; do
    preset=${pm%%:*} mb=${pm##*:}
    for impl in cudnn meshtrain; do
      run "large_${impl}_${preset}_mb$mb" 200 "$bundle/bin/bench_train_step" --preset "$preset" \
        --precision bf16 --micro-batch "$mb" --seq-len 1024 --steps 12 --warmup 3 \
        --profile-steps 0 --attn-impl "$impl"
      grep -E "^peak|^step_ms|^tokens/s|^RESULT|attention:|rror" "$out/large_${impl}_${preset}_mb$mb.log" |
        sed "s/^/$impl $preset mb$mb: /" | tee -a "$sum"
    done
    run "large_torch_${preset}_mb$mb" 280 python3 "$here/../reference/torch_gpt2_gpu.py" --preset "$preset" \
      --micro-batch "$mb" --mode compile --steps 12 --warmup 4
    grep -E "^pytorch|rror" "$out/large_torch_${preset}_mb$mb.log" | tee -a "$sum"
  done
fi

if has curve; then
  # Same run as perf/archive/journal.md's 200-step curves (seed 1337, byte-level KJV shards, mb 16), with
  # cuDNN attention: its end losses go next to the curves of our kernels.
  run curve_cudnn 200 "$bundle/bin/meshtrain" train --model.preset gpt2-124m \
    --train.micro_batch 16 --train.precision bf16 --train.seq_len 1024 --train.steps 200 \
    --train.log_every 1 --train.sample_tokens 0 \
    --train.save false --ckpt.final false --train.seed 1337 --attn.impl cudnn \
    --train.metrics "$out/curve_cudnn.jsonl" --train.out_dir "$out/curve_run"
  grep -E "step +(10|100|200)/|val|rror" "$out/curve_cudnn.log" | tail -8 | tee -a "$sum"
fi

if has profile; then
  for impl in cudnn meshtrain; do
    run "profile_$impl" 150 "$bundle/bin/bench_train_step" --preset gpt2-124m --precision bf16 \
      --micro-batch 16 --seq-len 1024 --steps 8 --warmup 3 --profile-steps 2 --attn-impl "$impl"
    grep -E "^#|total|gemm|attention" "$out/profile_$impl.log" | head -12 | sed "s/^/$impl: /" | tee -a "$sum"
  done
  run profile_torch 240 python3 "$here/../reference/torch_gpt2_gpu.py" --micro-batch 16 --mode compile \
    --steps 8 --profile 2
  grep -E "^# kernel" "$out/profile_torch.log" | tee -a "$sum"
fi
exit $status
