#!/usr/bin/env bash
# Two builds' training step on one CPU core, interleaved in one run (A, B, A, B, ...) so that
# both see the same machine load: the median over rounds of each round's median step time
# (bench_train_step, one BLAS/OpenMP thread), and the ratio B / A.
#
#   perf/cpu/ab_step.sh OLD_BENCH NEW_BENCH [rounds=7] [steps=10] [preset=cpu-bench] [micro-batch=8]
#
# OLD_BENCH / NEW_BENCH: bench_train_step executables of the two builds (copy the old one
# aside before rebuilding).
set -euo pipefail
a="$1"; b="$2"; rounds="${3:-7}"; steps="${4:-10}"; preset="${5:-cpu-bench}"; mb="${6:-8}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
args=(--preset "$preset" --micro-batch "$mb" --steps "$steps" --warmup 2 --profile-steps 0)
med() { sed -n 's/^RESULT meshtrain median_ms=\([0-9.]*\).*/\1/p'; }
ta=(); tb=()
for ((r = 1; r <= rounds; ++r)); do
  ta+=("$("$a" "${args[@]}" | med)")
  tb+=("$("$b" "${args[@]}" | med)")
  echo "round $r: A ${ta[-1]} ms, B ${tb[-1]} ms" >&2
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
ma=$(median "${ta[@]}"); mbv=$(median "${tb[@]}")
ratios=(); for ((i = 0; i < rounds; ++i)); do ratios+=("$(awk -v x="${tb[i]}" -v y="${ta[i]}" 'BEGIN{print x/y}')"); done
echo "A $a: median step ${ma} ms"
echo "B $b: median step ${mbv} ms"
echo "B/A per round: ${ratios[*]}; median $(median "${ratios[@]}")"
