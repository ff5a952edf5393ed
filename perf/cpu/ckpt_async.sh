#!/usr/bin/env bash
# What an asynchronous checkpoint costs training on the CPU build (issue 36): the same run with
# --ckpt.async true and false, and from each run's metrics
#   - the training thread's time per save (`ckpt_ms` of the save steps: with ckpt.async the copy
#     into the staging buffers, plus any wait for the previous write; without, the whole save),
#   - the step time of the steps that ran while a background write was in flight
#     (`ckpt_writing`) against the steps that did not (first step and save steps left out).
#   perf/cpu/ckpt_async.sh BUILD_DIR [OUT_DIR]
# Environment: PRESET (gpt2-124m), SEQ (128), MB (1), STEPS (25), EVERY (8), ROUNDS (2: the two
# runs alternate), RANKS (1). One training thread (OPENBLAS_NUM_THREADS=1): on a 2-core machine
# the writer has the other core. Checkpoints go to OUT_DIR (default /tmp/ckpt_async_cpu), with
# ckpt.keep 1; training data is the shipped corpus as byte tokens (meshtrain prep).
set -euo pipefail
build=$(cd "$1" && pwd)
out=${2:-/tmp/ckpt_async_cpu}
exe=$build/src/meshtrain
preset=${PRESET:-gpt2-124m} seq=${SEQ:-128} mb=${MB:-1} steps=${STEPS:-25} every=${EVERY:-8}
rounds=${ROUNDS:-2} ranks=${RANKS:-1}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ -f "$out/data/kjv_train_000000.bin" ] ||
  "$exe" prep --prep.input "$here/inputs/kjv.txt" --prep.output "$out/data/kjv" > /dev/null

run() {  # MODE ROUND
  local dir=$out/run_$1_$2
  rm -rf "$dir"
  mpiexec -n "$ranks" "$exe" train --model.preset "$preset" --train.seq_len "$seq" \
    --train.micro_batch "$mb" --train.steps "$steps" --train.warmup 1 --train.eval_every 0 \
    --train.log_every 1 --train.sample_tokens 0 --train.save false \
    --data.train "$out/data/kjv_train_*.bin" --data.val "" --ckpt.every "$every" \
    --ckpt.final false --ckpt.keep 1 --ckpt.async "$1" --train.out_dir "$dir" \
    > "$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  grep -E "written in the background in" "$dir.log" | sed "s/^/  [$1 round $2] /" || true
  cp "$dir/metrics.jsonl" "$out/metrics_$1_$2.jsonl"
  rm -rf "$dir"
}
for r in $(seq "$rounds"); do
  run true "$r"
  run false "$r"
done

python3 "$here/perf/tools/ckpt_async_summary.py" "$out" "$rounds"
