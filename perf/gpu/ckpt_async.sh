#!/usr/bin/env bash
# Asynchronous checkpoints on one H200, in one device call (issue 36): GPT-2 1.5B and Llama 3.2
# 1B in bf16 train with --ckpt.async true and false; perf/tools/ckpt_async_summary.py reports the
# training thread's time per save (async: the copy into pinned staging buffers; sync: the whole
# save) and the step time of the steps that overlap a background write against the others.
#   jobs/bundle-gpu.sh gpubundle build/cuda/src/meshtrain
#   perf/gpu/ckpt_async.sh gpubundle OUT [gpt2,llama]
# Environment: STEPS (260), EVERY (120: saves after steps 120 and 240, ~11-15 s apart at these
# step times; a write that takes longer makes the next save wait, which the blocking time then
# shows), ROUNDS (1), CKPT_DIR (/tmp/ckpt_async_gpu: checkpoints are 12 bytes per parameter,
# ~19 GB for GPT-2 1.5B, ckpt.keep 1; never under OUT, whose files travel back), GPT2_MB (4,
# seq 1024), LLAMA_MB (4, seq 2048). About 6 minutes for both models; `gpt2` or `llama` alone
# halves it. Run from the repository root. OUT receives one log and one metrics file per run and
# summary.txt.
set -uo pipefail
bundle=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd); what=${3:-gpt2,llama}
# shellcheck disable=SC1091
source "$bundle/env.sh"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
sum=$out/summary.txt
status=0
# shellcheck source=perf/gpu/lib.sh
source "$here/lib.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$sum"
steps=${STEPS:-260} every=${EVERY:-120} rounds=${ROUNDS:-1}
ckpt=${CKPT_DIR:-/tmp/ckpt_async_gpu}
data=$ckpt/data
mkdir -p "$data"
df -h "$ckpt" | tail -1 | sed 's/^/scratch: /' | tee -a "$sum"
"$bundle/bin/meshtrain" prep --prep.input inputs/kjv.txt --prep.output "$data/kjv" > /dev/null

train() {  # TAG MODE ROUND ARGS...
  local tag=$1 mode=$2 round=$3
  shift 3
  local dir=$ckpt/run_${tag}_${mode}_$round
  rm -rf "$dir"
  run "${tag}_${mode}_$round" 240 mpirun -np 1 "$bundle/bin/meshtrain" train "$@" \
    --train.precision bf16 --train.steps "$steps" --train.warmup 5 --train.eval_every 0 \
    --train.log_every 1 --train.sample_tokens 0 --train.save false \
    --data.train "$data/kjv_train_*.bin" --data.val "" --ckpt.every "$every" \
    --ckpt.final false --ckpt.keep 1 --ckpt.async "$mode" --train.out_dir "$dir"
  grep -E "memory:|staged in|saved checkpoint|error" "$out/${tag}_${mode}_$round.log" |
    sed "s/^/  /" | tee -a "$sum"
  cp "$dir/metrics.jsonl" "$out/metrics_${tag}_${mode}_$round.jsonl" 2> /dev/null
  rm -rf "$dir"
}

for cfg in gpt2:gpt2-1.5b:${GPT2_MB:-4}:1024 llama:llama3.2-1b:${LLAMA_MB:-4}:2048; do
  IFS=: read -r tag preset mb seq <<< "$cfg"
  has "$tag" || continue
  for r in $(seq "$rounds"); do
    for mode in true false; do
      train "$tag" "$mode" "$r" --model.preset "$preset" --train.micro_batch "$mb" \
        --train.seq_len "$seq"
    done
  done
  note "== $preset bf16, micro-batch $mb x seq $seq, saves every $every steps:"
  python3 "$here/../tools/ckpt_async_summary.py" "$out" "$rounds" "$tag" 2>&1 | sed 's/^/  /' |
    tee -a "$sum"
done
rm -rf "$ckpt"
exit $status
