#!/usr/bin/env bash
# Run meshtrain on this machine under mpirun: jobs/local.sh [-n RANKS] <subcommand> [options...]
# Oversubscribes (more ranks than cores is fine for tests and demos) and, when run as root
# (containers, CI), sets the two variables Open MPI requires to allow it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
ranks=1
if [ "${1:-}" = "-n" ]; then ranks=$2; shift 2; fi
exe=${MESHTRAIN_EXE:-$here/build/cpu/src/meshtrain}
if [ ! -x "$exe" ]; then
  echo "jobs/local.sh: $exe not found; build first (cmake --preset cpu && cmake --build --preset cpu)" >&2
  exit 2
fi
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
read -r -a flags <<< "${MPIRUN_FLAGS:-}"   # extra mpirun flags, word-split
exec mpirun -np "$ranks" --oversubscribe "${flags[@]}" "$exe" "$@"
