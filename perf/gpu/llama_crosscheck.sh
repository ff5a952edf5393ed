#!/usr/bin/env bash
# Issue 19's GPU checks and figures in one device call:
#   hf      a tiny Llama (inputs/llama-demo.ini, byte tokenizer) trained on the shipped corpus
#           in bf16 exports itself (train.save, sharded) and is converted from its checkpoint;
#           transformers loads both folders: logits against meshtrain's (fp32 1e-4, bf16 3e-2 of
#           max|logits|), greedy continuation against `meshtrain generate --generate.temperature
#           0` (tests/reference/hf_llama_crosscheck.py --folder); the fp64 fixture against
#           transformers (the same script's fixture mode); check_hf_folder.py on both folders.
#   tok     a tokenizer trained with `tokenizers` on inputs/kjv.txt encodes a test text and the
#           corpus identically in meshtrain prep (tests/reference/tokenizer_crosscheck.py).
#   bench   meshtrain's bf16 training step (bench_train_step) of llama-150m and llama3.2-1b at
#           sequence 2048: tokens/s, MFU, peak memory.
#   torch   the same models in PyTorch (perf/reference/torch_llama_gpu.py), torch.compile and eager
#         (LLAMA_TORCH_MODES="compile" for one).
# Each part has its own timeout, so one that hangs or runs long costs only its share of the call.
# The timeouts of all parts add up to more than one 10-minute device call: run "hf,tok" in one
# call and "bench" and "torch" in one each (expected: about 3, 4 and 6 minutes).
#   jobs/bundle-gpu.sh BUNDLE build/cuda/src/meshtrain build/cuda/perf/bench/bench_train_step
#   perf/gpu/llama_crosscheck.sh BUNDLE OUT [hf,tok,bench,torch]
# Run from the repository root (inputs/ and tests/reference/ are read from it). BUNDLE holds
# bin/, lib/ and env.sh; OUT receives one log per part and summary.txt.
set -uo pipefail
bundle=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd); what=${3:-hf,tok,bench,torch}
# shellcheck disable=SC1091
source "$bundle/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
mt=$bundle/bin/meshtrain
sum=$out/summary.txt
status=0
# shellcheck source=perf/gpu/lib.sh
source "$here/lib.sh"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$sum"
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__,
  "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)' 2>&1 |
  tail -1 | tee -a "$sum"
cd "$root" || exit 1

if has hf; then
  d=$out/llama
  run prep 60 "$mt" prep --prep.input inputs/kjv.txt --prep.output "$d/data/kjv" \
    --prep.tokenizer byte
  # 300 steps of the demo: a model whose greedy text is not noise, in about a minute.
  if run train 180 "$mt" train --config inputs/llama-demo.ini --train.precision bf16 \
      --train.steps 300 --train.eval_every 0 --train.sample_tokens 0 --train.out_dir "$d" \
      --ckpt.dir "$d/checkpoints" --ckpt.every 300 --train.save_max_shard_mb 1 \
      --data.train "$d/data/kjv_train_*.bin" --data.val "$d/data/kjv_val_*.bin"; then
    grep -E "step +300/300|saved " "$out/train.log" | tail -3 | tee -a "$sum"
    run convert 60 "$mt" convert --convert.dir "$d/checkpoints" --convert.out "$d/converted"
    for f in model converted; do
      run "check_$f" 60 python3 tests/reference/check_hf_folder.py "$d/$f"
      tail -1 "$out/check_$f.log" | tee -a "$sum"
      run "crosscheck_$f" 150 python3 tests/reference/hf_llama_crosscheck.py --folder "$d/$f" \
        --meshtrain "$mt" --tokens 64 --work "$d/work_$f"
      grep -E "logits|greedy|PASS|FAIL|rror" "$out/crosscheck_$f.log" | tee -a "$sum"
    done
  fi
  run crosscheck_fixture 120 python3 tests/reference/hf_llama_crosscheck.py
  grep -E "FAIL|PASS|rror" "$out/crosscheck_fixture.log" | tail -3 | tee -a "$sum"
fi

if has tok; then
  run tokenizer 240 python3 tests/reference/tokenizer_crosscheck.py --meshtrain "$mt" \
    --work "$out/tokcheck"
  grep -E "identical|DIFFER|PASS|FAIL|rror" "$out/tokenizer.log" | tee -a "$sum"
fi

# BENCH_HEAD_CHUNKS: values of --head-chunk-tokens to run each model at (0: auto, the default;
# "all": the whole micro-batch in one chunk, the head before chunking).
if has bench; then
  for cfg in "llama-150m 8" "llama-150m 16" "llama3.2-1b 4" "llama3.2-1b 8"; do
    set -- $cfg
    for hc in ${BENCH_HEAD_CHUNKS:-0}; do
      rows=$hc; [ "$hc" = all ] && rows=$(($2 * 2048))
      tag=$1_mb$2; [ "$hc" = 0 ] || tag=${tag}_hc$hc
      run "bench_$tag" 150 "$bundle/bin/bench_train_step" --preset "$1" --precision bf16 \
        --micro-batch "$2" --seq-len 2048 --steps 10 --warmup 3 --profile-steps 0 \
        --head-chunk-tokens "$rows"
      grep -E "^peak|^step_ms|^tokens/s|^mfu|rror" "$out/bench_$tag.log" |
        sed "s/^/meshtrain $tag: /" | tee -a "$sum"
    done
  done
fi

if has torch; then
  for mode in ${LLAMA_TORCH_MODES:-compile eager}; do
    run "torch_150m_$mode" 170 python3 "$here/../reference/torch_llama_gpu.py" --preset llama-150m \
      --micro-batch 8,16 --seq 2048 --mode "$mode" --steps 10 --warmup 3
    grep -E "^pytorch" "$out/torch_150m_$mode.log" | tee -a "$sum"
    run "torch_1b_$mode" 170 python3 "$here/../reference/torch_llama_gpu.py" --preset llama3.2-1b \
      --micro-batch 4,8 --seq 2048 --mode "$mode" --steps 10 --warmup 3
    grep -E "^pytorch" "$out/torch_1b_$mode.log" | tee -a "$sum"
  done
fi
exit $status
