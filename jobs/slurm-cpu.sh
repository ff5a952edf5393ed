#!/usr/bin/env bash
# CPU-only job (the cpu build: Kokkos Serial, MPI between ranks): one rank per task, each bound
# to --cpus-per-task cores that OpenBLAS uses. Submit from the meshtrain checkout:
#   sbatch jobs/slurm-cpu.sh --config inputs/cpu-bench.ini
#   sbatch --nodes=2 --ntasks-per-node=16 jobs/slurm-cpu.sh --dp 32 --config inputs/cpu-bench.ini
# Pre-timeout checkpoint, requeue and resume as in jobs/slurm-gpu.sh.
#SBATCH --job-name=meshtrain-cpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=1
#SBATCH --time=01:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
##SBATCH --partition=cpu --account=PROJECT
set -euo pipefail
for MT_ROOT in "${SLURM_SUBMIT_DIR:-$PWD}" "${MESHTRAIN_HOME:-}" "$(dirname "$0")/.." ""; do
  [ -z "$MT_ROOT" ] || [ ! -f "$MT_ROOT/jobs/lib/slurm_common.sh" ] || break
done
[ -n "$MT_ROOT" ] || { echo "submit from a meshtrain checkout, or set MESHTRAIN_HOME" >&2; exit 2; }
# shellcheck source=lib/slurm_common.sh
. "$MT_ROOT/jobs/lib/slurm_common.sh"
mt_main cpu "$@"
