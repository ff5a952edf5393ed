#!/usr/bin/env bash
# The collective watchdog's cost on the CPU step: `meshtrain train --config inputs/cpu-bench.ini`
# on RANKS ranks (dp; default 2, so that collectives are recorded), comm.timeout 300 (flight
# recording and the watchdog thread) against comm.timeout 0 (neither), in interleaved pairs so
# that both see the same machine load. Prints the median step time of each setting (steps after
# the first) and the relative difference.
#   perf/cpu/watchdog_overhead.sh [exe=build/cpu/src/meshtrain] [pairs=5] [steps=20] [ranks=2]
set -euo pipefail
exe=${1:-build/cpu/src/meshtrain}
pairs=${2:-5}
steps=${3:-20}
ranks=${4:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() {  # TIMEOUT TAG
  mpirun -np "$ranks" --oversubscribe "$exe" train --config inputs/cpu-bench.ini \
    --train.steps "$steps" --train.log_every 1 --ckpt.final false --train.out_dir "$out/$2" \
    --comm.timeout "$1" > /dev/null 2>&1
  python3 - "$out/$2/metrics.jsonl" >> "$out/ms_$1" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "step_ms" in r and r["step"] > 1:
        print(r["step_ms"])
PY
}
for ((p = 0; p < pairs; ++p)); do
  if ((p % 2)); then run 0 off$p; run 300 on$p; else run 300 on$p; run 0 off$p; fi
done
median() { sort -g "$1" | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
on=$(median "$out/ms_300")
off=$(median "$out/ms_0")
echo "ranks $ranks, $pairs interleaved pairs x $((steps - 1)) timed steps"
echo "watchdog on (comm.timeout 300): median step $on ms"
echo "watchdog off (comm.timeout 0):  median step $off ms"
awk -v a="$on" -v b="$off" 'BEGIN { printf "overhead: %+.2f %%\n", 100 * (a - b) / b }'
