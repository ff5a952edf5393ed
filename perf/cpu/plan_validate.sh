#!/usr/bin/env bash
# The planner against real runs of the CPU build: calibrate (meshtrain bench, 8 ranks: the
# slowdown of 1, 2, 4, 8 ranks computing at once), then on
# 1, 2, 4 and 8 ranks run K layouts spread over each ranking (--plan.validate_pick spread) and
# print predicted vs measured step time and memory, and the median absolute percentage error
# over all of them. Ranks beyond the cores share them (the machine's 2 cores: 4 and 8 ranks are
# oversubscribed); the calibration's measured slowdown by busy ranks is what predicts that.
#   perf/cpu/plan_validate.sh BUILD_DIR OUT_DIR [K] [model options...]
# MESHTRAIN_EXE overrides BUILD_DIR/src/meshtrain (e.g. a bundle from jobs/bundle-gpu.sh).
set -euo pipefail
build=$1 out=$2 k=${3:-8}
shift $(( $# < 3 ? $# : 3 ))
model=("$@")
[ ${#model[@]} -gt 0 ] || model=(--model.preset demo)
exe=${MESHTRAIN_EXE:-$build/src/meshtrain}
mkdir -p "$out"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1  # one BLAS thread per rank: what the model assumes
run() { mpirun -np "$1" --oversubscribe -x OPENBLAS_NUM_THREADS -x OMP_NUM_THREADS -x LD_LIBRARY_PATH "$exe" "${@:2}"; }
uptime | tee "$out/load.txt"
run 8 bench "${model[@]}" --bench.micro_batches 1,2,4,8 --bench.tp 1,2,4 \
  --bench.out "$out/calibration.json" | tee "$out/bench.txt"
for n in 1 2 4 8; do
  run "$n" plan "${model[@]}" --plan.calibration "$out/calibration.json" \
    --plan.calibration_out "$out/refit_$n.json" --plan.global_batch 8 --plan.gpus_per_node 8 \
    --plan.micro_batches 1,2,4,8 --plan.validate "$k" --plan.validate_pick spread \
    --plan.validate_steps 4 --plan.top 0 | tee "$out/validate_$n.txt"
  uptime | tee -a "$out/load.txt"
done
# Rows: layout, predicted, measured, error, load-corrected, error, memory ..., error.
cat "$out"/validate_?.txt | awk '
  / ms / || /ms +[0-9.]+ms/ { n = 0; for (i = 1; i <= NF; ++i) if ($i ~ /%$/) e[++n] = $i;
    if (n == 3) { gsub(/[+%-]/, "", e[1]); gsub(/[+%-]/, "", e[2]); gsub(/[+%-]/, "", e[3]);
                  raw[++m] = e[1]; cor[m] = e[2]; if (e[3] > mem) mem = e[3]; } }
  function median(a, k,   i, j, t) { for (i = 1; i <= k; ++i) for (j = i + 1; j <= k; ++j)
      if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t; }
    return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2 }
  END { printf "all %d layouts on 1-8 ranks: step-time MAPE %.1f%% (load-corrected %.1f%%), largest memory error %.2f%%\n",
        m, median(raw, m), median(cor, m), mem }' | tee "$out/summary.txt"
