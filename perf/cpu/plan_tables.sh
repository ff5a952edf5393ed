#!/usr/bin/env bash
# The planner's choices for GPT-2 1.5B and a 7B-class model on 8-1024 H100/H200-class GPUs (the
# tables of docs/planner.md), from the shipped H200 calibration: 141 GB (H200) and 80 GB (H100
# memory, same speed figures), 8 GPUs per node, default global batch (512 sequences; 1024 on
# 1024 GPUs).
#   perf/cpu/plan_tables.sh BUILD_DIR [calibration] [gpt2|llama|all]
# llama: Llama 3.1 8B and 70B (presets llama3.1-8b, llama3.1-70b) at sequence 8192 and global
# batch 512 sequences (NeMo's recipes), 80 GB (H100) and 141 GB, 8-1024 GPUs, each row next to
# the layout Megatron-LM / NeMo publish for that model and GPU count where they publish one
# (sources in docs/planner.md and perf/archive/journal.md). Megatron's context parallelism (CP) has no
# counterpart in meshtrain: a CP 2 layout uses twice the GPUs per model replica that its
# (tp, pp) name.
set -euo pipefail
exe=$1/src/meshtrain cal=${2:-inputs/plan/h200.json} which=${3:-gpt2}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# Megatron-LM / NeMo's published Llama 3 layouts (H100 80 GB, sequence 8192, micro-batch 1):
#   M: Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh; R: NeMo 2 recipes
#   (nemo/collections/llm/recipes/llama3_8b.py, llama3_70b.py); P: NeMo 24.12 performance
#   summary (FP8 runs).
published() {  # MODEL GPUS
  case "$1:$2" in
    8b:8) echo "M: tp1 pp1 cp1, GBS 128, dist. optimizer; R: tp1 pp1 cp2, GBS 512; P: tp1 pp1 cp2, GBS 128, 12273 tok/s/GPU" ;;
    70b:32) echo "R: tp4 pp4 vp5 cp2 sp, GBS 512" ;;
    70b:64) echo "P: tp4 pp4 vp5 cp2, GBS 128, 1524 tok/s/GPU" ;;
    *) echo "-" ;;
  esac
}

llama_tables() {
  printf '%s\n' "model | memory | GPUs | planner's #1 (layout, predicted step, MFU) | Megatron-LM / NeMo"
  for model in 8b 70b; do
    for mem in 80 141; do
      for w in 8 16 32 64 128 256 512 1024; do
        out=$("$exe" plan --model.preset "llama3.1-$model" --plan.seq_len 8192 \
              --plan.global_batch 512 --plan.precision bf16 --plan.calibration "$cal" \
              --plan.world "$w" --plan.memory_gib "$mem" --plan.top 1 2>&1) || true
        top=$(grep -E '^  1  ' <<< "$out" | sed 's/^  1  //' || true)
        [ -n "$top" ] || top="nothing fits ($(grep -m1 -iE 'no layout|fits|error' <<< "$out" || echo '?'))"
        printf '%s | %s GB | %4d | %s | %s\n' "$model" "$mem" "$w" "$top" "$(published "$model" "$w")"
      done
    done
  done
}

if [ "$which" = llama ] || [ "$which" = all ]; then llama_tables; fi
[ "$which" = llama ] && exit 0
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
