#!/usr/bin/env bash
# Nsight Systems on every rank of a meshtrain job: set as the executable of the job scripts,
#   MESHTRAIN_EXE=jobs/nsys-rank.sh sbatch jobs/slurm-gpu.sh --tp 4 \
#     --config inputs/gpt2-124m.ini --profile.nvtx --profile.steps 20:22
# Each rank writes <MESHTRAIN_NSYS_DIR>/rank_<world rank>.nsys-rep (default folder nsys/),
# capturing only between meshtrain's cudaProfilerStart and cudaProfilerStop (--profile.steps)
# with the CUDA, NVTX (--profile.nvtx: steps, blocks, collectives, pipeline messages,
# checkpoints) and OS runtime traces. Open the reports together in the Nsight Systems GUI
# (File > Open, several files) to see the ranks' timelines side by side.
#   MESHTRAIN_NSYS_EXE   the meshtrain executable (default: build/cuda/src/meshtrain of the
#                        checkout, else meshtrain on PATH)
#   MESHTRAIN_NSYS       the nsys executable (default: nsys on PATH)
#   MESHTRAIN_NSYS_ARGS  more nsys profile options (e.g. "--trace=cuda,nvtx,osrt,mpi")
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exe=${MESHTRAIN_NSYS_EXE:-}
if [ -z "$exe" ]; then
  if [ -x "$root/build/cuda/src/meshtrain" ]; then exe=$root/build/cuda/src/meshtrain
  else exe=$(command -v meshtrain || true)
  fi
fi
if [ -z "$exe" ]; then
  echo "nsys-rank.sh: no meshtrain executable (set MESHTRAIN_NSYS_EXE)" >&2
  exit 2
fi
# The job scripts ask `train --help` which options exist: answer without a profile.
for a in "$@"; do
  case $a in --help | -h) exec "$exe" "$@" ;; esac
done
rank=${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}}
dir=${MESHTRAIN_NSYS_DIR:-nsys}
mkdir -p "$dir"
read -r -a extra <<< "${MESHTRAIN_NSYS_ARGS:-}"
exec "${MESHTRAIN_NSYS:-nsys}" profile --capture-range=cudaProfilerApi --capture-range-end=stop \
  --trace=cuda,nvtx,osrt --force-overwrite=true --output="$dir/rank_$rank" "${extra[@]}" \
  "$exe" "$@"
