#!/usr/bin/env bash
# One node x G GPUs, one rank per GPU. Submit from the meshtrain checkout:
#   sbatch jobs/slurm-gpu.sh [--dp N] [--pp N] [--tp N] [SUBCOMMAND] [meshtrain options]
#   sbatch jobs/slurm-gpu.sh --tp 4 --config inputs/gpt2-124m.ini --train.micro_batch 16
#   sbatch --gpus-per-node=8 --ntasks-per-node=8 jobs/slurm-gpu.sh selfcheck --mesh.tp 8
# Keep --ntasks-per-node equal to --gpus-per-node. Before the time limit Slurm sends SIGUSR1
# (--signal below); meshtrain checkpoints and exits 3, this job requeues itself and the next run
# resumes from <ckpt.dir>/latest, appending to the same log. Options: jobs/lib/slurm_common.sh.
#SBATCH --job-name=meshtrain
#SBATCH --nodes=1
#SBATCH --gpus-per-node=4
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
##SBATCH --exclusive
##SBATCH --partition=gpu --account=PROJECT
set -euo pipefail
for MT_ROOT in "${SLURM_SUBMIT_DIR:-$PWD}" "${MESHTRAIN_HOME:-}" "$(dirname "$0")/.." ""; do
  [ -z "$MT_ROOT" ] || [ ! -f "$MT_ROOT/jobs/lib/slurm_common.sh" ] || break
done
[ -n "$MT_ROOT" ] || { echo "submit from a meshtrain checkout, or set MESHTRAIN_HOME" >&2; exit 2; }
# shellcheck source=lib/slurm_common.sh
. "$MT_ROOT/jobs/lib/slurm_common.sh"
mt_main gpu "$@"
