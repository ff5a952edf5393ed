#!/usr/bin/env bash
# The before/after table of issue 17: every case of tests/cli/test_failures.sh in measure mode
# (no assertions; exit code, seconds until every rank was gone, the message) for two builds.
#   perf/cpu/failures_table.sh OLD_EXE NEW_EXE DATA_GLOB [bound_s=60]
# DATA_GLOB: token shards, as a pattern (meshtrain expands it), e.g. 'build/cpu/cli_prep/kjv_train_*.bin'.
# A case the old build has no option for ends in its usage error; a hang is killed at the bound.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
old=$(realpath "$1") new=$(realpath "$2") data=$3 bound=${4:-60}  # the cases run in their own folders
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cases=(shard_one_rank metrics_no_folder out_dir_one_rank ckpt_unwritable one_rank_throws
       diverge_stop diverge_scaling nan_stop nan_skip nan_rollback watchdog_stall watchdog_skip
       metrics_4_ranks metrics_full_disk ckpt_full_disk ckpt_metadata local_sigterm
       local_sigint_twice slurm_mpirun_sigterm)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "| case | build | exit | s | message |"
echo "|---|---|---|---|---|"
for c in "${cases[@]}"; do
  for b in old new; do
    exe=$old; [ $b = new ] && exe=$new
    BOUND=$bound bash "$here/tests/cli/test_failures.sh" --measure "$c" "$work/$b-$c" "$data" -- \
      mpiexec -n --oversubscribe -- "$exe" 2>&1 | sed -n 's/^RESULT | \(.*\)/\1/p' |
      while IFS='|' read -r name rc secs msg; do
        echo "| $name | $b | $rc | $secs | ${msg//|//} |"
      done
  done
done
