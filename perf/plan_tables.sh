#!/usr/bin/env bash
# The planner's choices for GPT-2 1.5B and a 7B-class model on 8-1024 H100/H200-class GPUs (the
# tables of docs/planner.md), from the shipped H200 calibration: 141 GB (H200) and 80 GB (H100
# memory, same speed figures), 8 GPUs per node, default global batch (512 sequences; 1024 on
# 1024 GPUs).
#   perf/plan_tables.sh BUILD_DIR [calibration]
set -euo pipefail
exe=$1/src/meshtrain cal=${2:-inputs/plan/h200.json}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
m15=(--model.preset gpt2-1.5b)
m7=(--model.preset gpt2-1.5b --model.n_layer 32 --model.n_embd 4096 --model.n_head 32
    --model.block_size 2048)
for model in 15 7; do
  for mem in 141 80; do
    for w in 8 16 64 128 256 512 1024; do
      if [ "$model" = 15 ]; then args=("${m15[@]}"); else args=("${m7[@]}"); fi
      out=$("$exe" plan "${args[@]}" --plan.calibration "$cal" --plan.world "$w" \
            --plan.memory_gib "$mem" --plan.top 1)
      rule=$(sed -n "s/^seeds' rule for this case: //p" <<< "$out")
      top=$(grep -E '^  1  ' <<< "$out" | sed 's/^  1  //' || echo "nothing fits")
      printf '%s | %s GB | %4d | %s | %s\n' "$([ "$model" = 15 ] && echo 1.5B || echo 7B)" \
        "$mem" "$w" "$top" "$rule"
    done
  done
done
