#!/usr/bin/env bash
# The unfenced GPU timeline of our step and of torch.compile's, on the same models, in one device
# call: where every millisecond of a step goes (kernel categories, the largest kernels, the idle
# gaps and what sits on both sides of them, the host's waits), through the CUPTI injection
# library perf/bench/cupti_trace.cpp (the bundle must carry bin/libmeshtrain_cupti_trace.so).
#   perf/gpu/step_timeline.sh BUNDLE OUT [ours,torch,clocks]
# clocks: untraced, 30 steps of each side under perf/gpu/with_clocks.sh (the SM clock, power and
# power-cap share while the GPU is busy), ours for each of TRACE_VARIANTS in CLOCK_ROUNDS
# (default "1") rounds; CLOCK_ARGS="ARGS;ARGS..." adds runs of ours with other bench_train_step
# arguments (e.g. "--head-chunk-tokens 8192"); CLOCK_TORCH=0 leaves torch.compile out.
# TRACE_CFGS="preset:mb:seq ..." (default llama3.2-1b:4:2048 gpt2-124m:32:1024); each side runs
# 8 steps after 3 (GPT-2's torch side 5) and the last 5 complete steps are summarized.
# TRACE_VARIANTS="label:bundle[:VAR=v,...] ..." traces other builds (or settings) of ours too.
# CUPTI's tracing costs each kernel launch a little on both sides; the step times printed by
# the programs under trace are for the timeline, not for the comparison tables.
# Run from the repository root. OUT receives the logs, the traces (gzip), summary.txt and
# OUT.logs.tgz.
set -uo pipefail
bundle=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd); what=${3:-ours,torch}
# shellcheck disable=SC1091
source "$bundle/env.sh"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sum=$out/summary.txt status=0
# shellcheck source=perf/gpu/lib.sh
source "$here/lib.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$sum"
inject=$bundle/bin/libmeshtrain_cupti_trace.so
[ -e "$inject" ] || { note "no $inject in the bundle"; exit 2; }
# PyTorch loads its own CUPTI (the nvidia wheel's); the injection library then binds to that
# one rather than bringing a second copy into the process.
torch_cupti=$(python3 - <<'PY' 2>/dev/null
import glob, os, nvidia
for d in nvidia.__path__:
    for f in glob.glob(os.path.join(d, "**", "libcupti.so.*"), recursive=True):
        print(os.path.dirname(f)); raise SystemExit
PY
)
traced() {  # traced NAME SECS CMD...: CMD under the injection library, then the summary
  local name=$1 secs=$2; shift 2
  run "$name" "$secs" env CUDA_INJECTION64_PATH="$inject" MESHTRAIN_CUPTI_OUT="$out/$name.csv" \
    "$@"
  grep -E "^peak|^step_ms|^tokens/s|^pytorch|rror" "$out/$name.log" | sed "s/^/  $name /" |
    tee -a "$sum"
  python3 "$here/../tools/cupti_trace_summary.py" "$out/$name.csv" --steps 5 --label "$name" \
    >> "$sum" 2>&1 || note "  $name: no summary"
  gzip -f "$out/$name.csv"
}

for cfg in ${TRACE_CFGS:-llama3.2-1b:4:2048 gpt2-124m:32:1024}; do
  IFS=: read -r preset mb seq <<< "$cfg"
  case $preset in  # the torch.compile side of this config
    gpt2*) script=torch_gpt2_gpu.py; args=(--warmup 5) ;;
    *) script=torch_llama_gpu.py; args=(--seq "$seq" --warmup 3) ;;
  esac
  if has ours; then
    for v in ${TRACE_VARIANTS:-new:$bundle}; do
      IFS=: read -r label b extra <<< "$v"
      # shellcheck disable=SC2086  # extra: comma-separated VAR=value pairs, one word each
      traced "trace_${preset}_mb${mb}_$label" 200 ${extra//,/ } "$b/bin/bench_train_step" \
        --preset "$preset" --precision bf16 --seq-len "$seq" --micro-batch "$mb" --steps 8 \
        --warmup 3 --profile-steps 0 --attn-impl cudnn
    done
  fi
  if has clocks; then
    IFS=';' read -r -a extras <<< "${CLOCK_ARGS:-}"
    extras=("" "${extras[@]}")
    for round in ${CLOCK_ROUNDS:-1}; do
      for v in ${TRACE_VARIANTS:-new:$bundle}; do
        IFS=: read -r label b env_extra <<< "$v"
        for i in "${!extras[@]}"; do
          name=clocks_${preset}_mb${mb}_${label}_args${i}_$round
          # shellcheck disable=SC2086  # env_extra: VAR=value pairs; extras: bench arguments
          run "$name" 200 env ${env_extra//,/ } "$here/with_clocks.sh" "$name" \
            "$out/$name.smi.csv" "$b/bin/bench_train_step" --preset "$preset" --precision bf16 \
            --seq-len "$seq" --micro-batch "$mb" --steps 30 --warmup 3 --profile-steps 0 \
            --attn-impl cudnn ${extras[$i]}
          grep -E "^peak|^step_ms|^tokens/s|^clocks|rror" "$out/$name.log" |
            sed "s/^/  $name [${extras[$i]}] /" | tee -a "$sum"
        done
      done
    done
    name=clocks_${preset}_mb${mb}_torch
    if [ "${CLOCK_TORCH:-1}" = 1 ]; then
      run "$name" 300 "$here/with_clocks.sh" "$name" "$out/$name.smi.csv" python3 \
        "$here/../reference/$script" --preset "$preset" --micro-batch "$mb" --mode compile --steps 30 "${args[@]}"
      grep -E "^pytorch|^clocks|rror" "$out/$name.log" | sed "s/^/  $name /" | tee -a "$sum"
    fi
  fi
  if has torch; then
    traced "trace_${preset}_mb${mb}_torch" 300 \
      env LD_LIBRARY_PATH="${torch_cupti:+$torch_cupti:}$LD_LIBRARY_PATH" python3 "$here/../reference/$script" \
      --preset "$preset" --micro-batch "$mb" --mode compile --steps 8 "${args[@]}"
  fi
done
tar czf "$out.logs.tgz" -C "$(dirname "$out")" "$(basename "$out")"
exit $status
