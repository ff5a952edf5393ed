#!/usr/bin/env bash
# The chunked LM head (train.head_chunk_tokens) on one H200, everything in one device call:
#   perf/archive/gpu-rounds/gpu_round6.sh BUNDLE OUT [gpt2,train,llama,tests]
# gpt2:  GPT-2 124M bf16 seq 1024, cuDNN attention, mb 16 and 32: bench_train_step with the head
#        in auto chunks and in one chunk (the head before chunking), then torch.compile
#        (perf/reference/torch_gpt2_gpu.py) at the same micro-batches;
# train: the trainer on the shipped byte-level KJV shards (prepared here) at mb 16 and 32, 20
#        steps: its metrics' memory_bytes is the device memory in use (cudaMemGetInfo, CUDA
#        context included), the figure the planner's H200 calibration test compares against;
# llama: perf/gpu/llama_crosscheck.sh bench,torch with BENCH_HEAD_CHUNKS="0 all" and
#        torch.compile only: llama-150m mb 8/16, llama3.2-1b mb 4/8, seq 2048;
# prof:  the per-kernel profile (2 steps, device fenced around every kernel) of GPT-2 124M mb 32
#        and llama3.2-1b mb 8, the two sizes furthest from their targets;
# tests: every test_* in BUNDLE through perf/archive/gpu-rounds/gpu_round3.sh (bundle test_llama_parity and
#        test_gpt_bf16: the chunked head's parity cases).
# Run from the repository root. OUT receives one log per run, summary.txt and OUT.logs.tgz.
set -uo pipefail
bundle=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd); what=${3:-gpt2,train,llama,prof,tests}
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

if has gpt2; then
  for mb in 16 32; do
    for hc in 0 all; do
      rows=$hc; [ "$hc" = all ] && rows=$((mb * 1024))
      name=gpt2_mb${mb}_hc$hc
      run "$name" 120 "$bundle/bin/bench_train_step" --preset gpt2-124m --precision bf16 \
        --seq-len 1024 --micro-batch "$mb" --steps 30 --warmup 5 --profile-steps 0 \
        --attn-impl cudnn --head-chunk-tokens "$rows"
      grep -E "^peak|^step_ms|^tokens/s|^mfu|rror" "$out/$name.log" | sed "s/^/  $name /" |
        tee -a "$sum"
    done
  done
  for mb in 16 32; do
    run "torch_gpt2_mb$mb" 200 python3 "$here/../../reference/torch_gpt2_gpu.py" --preset gpt2-124m \
      --micro-batch "$mb" --mode compile --steps 30 --warmup 5
    grep -E "^pytorch|rror" "$out/torch_gpt2_mb$mb.log" | tee -a "$sum"
  done
fi

if has train; then
  data=$out/data
  run prep 60 "$bundle/bin/meshtrain" prep --prep.input inputs/kjv.txt \
    --prep.output "$data/kjv" --prep.tokenizer byte
  for mb in 16 32; do
    run "train_mb$mb" 150 "$bundle/bin/meshtrain" train --model.preset gpt2-124m \
      --train.micro_batch "$mb" --train.precision bf16 --train.seq_len 1024 --train.steps 20 \
      --train.log_every 1 --train.eval_batches 1 --train.sample_tokens 0 --train.save false \
      --ckpt.final false --train.out_dir "$out/run_mb$mb" \
      --data.train "$data/kjv_train_*.bin" --data.val "$data/kjv_val_*.bin"
    grep -E "step +20/|rror" "$out/train_mb$mb.log" | sed "s/^/  mb$mb: /" | tee -a "$sum"
    # The steady-state steps' memory in use and step time (steps 6-20).
    python3 - "$out/run_mb$mb" <<'EOF' | tee -a "$sum"
import glob, json, statistics, sys
rows = []
for f in glob.glob(sys.argv[1] + "/**/*.jsonl", recursive=True):
    for line in open(f):
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if "memory_bytes" in j and j.get("step", 0) >= 6:
            rows.append(j)
if rows:
    print("  memory in use %.0f MiB, median step %.2f ms, %d tok/s" % (
        max(r["memory_bytes"] for r in rows) / 2**20,
        statistics.median(r["step_ms"] for r in rows),
        statistics.median(r["tokens_per_s"] for r in rows)))
else:
    print("  no metrics found under", sys.argv[1])
EOF
  done
fi

if has llama; then
  BENCH_HEAD_CHUNKS="0 all" LLAMA_TORCH_MODES=compile \
    "$here/../../gpu/llama_crosscheck.sh" "$bundle" "$out/llama" bench,torch || status=1
  cat "$out/llama/summary.txt" >> "$sum"
fi

if has prof; then
  for cfg in gpt2-124m:32:1024 llama3.2-1b:8:2048; do
    IFS=: read -r preset mb seq <<< "$cfg"
    name=profile_${preset}_mb$mb
    run "$name" 200 "$bundle/bin/bench_train_step" --preset "$preset" --precision bf16 \
      --seq-len "$seq" --micro-batch "$mb" --steps 5 --warmup 2 --profile-steps 2 --attn-impl cudnn
    grep -E "^peak|^step_ms|^tokens/s" "$out/$name.log" | sed "s/^/  $name /" | tee -a "$sum"
    grep -A30 -E "^label" "$out/$name.log" | tee -a "$sum"
  done
fi

if has tests; then
  # Every test_* in BUNDLE (gpu_round3.sh's tests part): bundle test_llama_parity and test_gpt_bf16.
  "$here/gpu_round3.sh" "$bundle" "$out/tests" tests || status=1
  cat "$out/tests/summary.txt" >> "$sum"
fi
tar czf "$out.logs.tgz" -C "$(dirname "$out")" "$(basename "$out")"
exit $status
