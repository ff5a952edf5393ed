#!/usr/bin/env bash
# N nodes x G GPUs, one rank per GPU, (dp, pp, tp) from the command line or the environment
# (MESHTRAIN_DP/_PP/_TP); dp defaults to ranks / (pp x tp). tp stays within a node (NVLink),
# pp spans nodes. Submit from the meshtrain checkout:
#   sbatch --nodes=4 jobs/slurm-multinode.sh --pp 2 --tp 4 --config inputs/gpt2-124m.ini
#   sbatch --nodes=2 --export=ALL,MESHTRAIN_TP=4,MESHTRAIN_LAUNCHER=mpirun jobs/slurm-multinode.sh
# Pre-timeout checkpoint, requeue and resume as in jobs/slurm-gpu.sh; options in
# jobs/lib/slurm_common.sh, the site's NCCL/MPI settings in jobs/lib/site_env.sh.
#SBATCH --job-name=meshtrain
#SBATCH --nodes=2
#SBATCH --gpus-per-node=4
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=06:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
#SBATCH --exclusive
##SBATCH --partition=gpu --account=PROJECT
set -euo pipefail
for MT_ROOT in "${SLURM_SUBMIT_DIR:-$PWD}" "${MESHTRAIN_HOME:-}" "$(dirname "$0")/.." ""; do
  [ -z "$MT_ROOT" ] || [ ! -f "$MT_ROOT/jobs/lib/slurm_common.sh" ] || break
done
[ -n "$MT_ROOT" ] || { echo "submit from a meshtrain checkout, or set MESHTRAIN_HOME" >&2; exit 2; }
# shellcheck source=lib/slurm_common.sh
. "$MT_ROOT/jobs/lib/slurm_common.sh"
mt_main gpu "$@"
