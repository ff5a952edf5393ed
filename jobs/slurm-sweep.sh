#!/usr/bin/env bash
# One run of a scaling sweep per array task. perf/scaling/scaling.py writes the runs (each a
# folder with an `args` file, one argument per line) and a list per node count, and prints the
# sbatch lines, e.g.
#   sbatch --nodes=2 --array=0-5 jobs/slurm-sweep.sh gpu STUDY/slurm/array_2n.list
# Task i runs the (i+1)-th folder of the list; its output and exit code land in that folder for
# `scaling.py collect`. A run that fails is recorded as failed; the other tasks go on.
#SBATCH --job-name=meshtrain-sweep
#SBATCH --nodes=1
#SBATCH --gpus-per-node=4
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=00:30:00
#SBATCH --signal=B:USR1@60
#SBATCH --output=%x-%A_%a.out
##SBATCH --exclusive
##SBATCH --partition=gpu --account=PROJECT
set -euo pipefail
for MT_ROOT in "${SLURM_SUBMIT_DIR:-$PWD}" "${MESHTRAIN_HOME:-}" "$(dirname "$0")/.." ""; do
  [ -z "$MT_ROOT" ] || [ ! -f "$MT_ROOT/jobs/lib/slurm_common.sh" ] || break
done
[ -n "$MT_ROOT" ] || { echo "submit from a meshtrain checkout, or set MESHTRAIN_HOME" >&2; exit 2; }
# shellcheck source=lib/slurm_common.sh
. "$MT_ROOT/jobs/lib/slurm_common.sh"

mode=${1:?usage: slurm-sweep.sh gpu|cpu LIST}
list=${2:?usage: slurm-sweep.sh gpu|cpu LIST}
run_dir=$(sed -n "$((${SLURM_ARRAY_TASK_ID:?not an array task} + 1))p" "$list")
[ -f "$run_dir/args" ] || mt_die "task $SLURM_ARRAY_TASK_ID of $list: no $run_dir/args"
mapfile -t args < "$run_dir/args"
export MESHTRAIN_CHECKPOINTS=${MESHTRAIN_CHECKPOINTS:-off}   # timing runs: no checkpoints
mt_log "sweep task $SLURM_ARRAY_TASK_ID: $run_dir (output in $run_dir/output.log)"
exec >> "$run_dir/output.log" 2>&1
# A run that dies before meshtrain starts (bad layout) still leaves its exit code.
trap 'rc=$?; [ -f "$run_dir/exit_code" ] || echo "$rc" > "$run_dir/exit_code"' EXIT
mt_setup "$mode" "${args[@]}"
mt_run
echo "$MT_RC" > "$run_dir/exit_code"
mt_finish "$MT_RC"
