#!/usr/bin/env bash
# Two builds' GPU training step in one run, interleaved (A, B, A, B, ...) so that both see the
# same GPU clocks and temperature: GPT-2 124M, seq 1024, bf16, one rank. Prints each round's
# median step of each build, the median over rounds and the ratio B / A.
#   perf/gpu/ab_step.sh BUNDLE_A BUNDLE_B [rounds=5] [micro-batch=16] [steps=30]
# BUNDLE_*: folders made by jobs/bundle-gpu.sh holding bin/bench_train_step (and its lib/).
# ARGS_A / ARGS_B: extra options for one build only, e.g. ARGS_B="--attn-impl meshtrain" so that
# a build with cuDNN attention runs the same kernels as one from before it.
set -uo pipefail
a=$1 b=$2 rounds=${3:-5} mb=${4:-16} steps=${5:-30}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
one() {  # BUNDLE EXTRA_ARGS: median step in ms
  # shellcheck disable=SC2086
  LD_LIBRARY_PATH=$1/lib:${LD_LIBRARY_PATH:-} timeout 300 "$1/bin/bench_train_step" \
    --preset gpt2-124m --precision bf16 --micro-batch "$mb" --seq-len 1024 --steps "$steps" \
    --warmup 5 --profile-steps 0 $2 | sed -n 's/^RESULT meshtrain median_ms=\([0-9.]*\).*/\1/p'
}
ta=(); tb=()
for ((r = 1; r <= rounds; ++r)); do
  ta+=("$(one "$a" "${ARGS_A:-}")"); tb+=("$(one "$b" "${ARGS_B:-}")")
  echo "round $r: A ${ta[-1]} ms, B ${tb[-1]} ms"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
ma=$(median "${ta[@]}"); mbv=$(median "${tb[@]}")
ratios=(); for ((i = 0; i < rounds; ++i)); do ratios+=("$(awk -v x="${tb[i]}" -v y="${ta[i]}" 'BEGIN{print x/y}')"); done
echo "A $a: median step ${ma} ms ($(awk -v t="$ma" -v m="$mb" 'BEGIN{printf "%.0f", m*1024/(t/1000)}') tok/s)"
echo "B $b: median step ${mbv} ms ($(awk -v t="$mbv" -v m="$mb" 'BEGIN{printf "%.0f", m*1024/(t/1000)}') tok/s)"
echo "B/A per round: ${ratios[*]}; median $(median "${ratios[@]}")"
