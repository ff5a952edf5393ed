#!/usr/bin/env bash
# Run meshtrain on this machine under mpirun:
#   jobs/local.sh [-n RANKS] [--emulate-hosts] <subcommand> [options...]
# Oversubscribes (more ranks than cores is fine for tests and demos) and, when run as root
# (containers, CI), sets the two variables Open MPI requires to allow it.
#
# --emulate-hosts (GPU builds): every rank claims a host of its own for NCCL
# (MESHTRAIN_EMULATE_HOSTS=1: meshtrain sets NCCL_HOSTID per rank, NCCL_SOCKET_IFNAME=lo,
# NCCL_IB_DISABLE=1), so several ranks can share one GPU and any layout runs on a workstation
# with one GPU. It proves that a layout works; its speed means nothing (sockets over loopback).
# Takes build/cuda/src/meshtrain when MESHTRAIN_EXE is not set and that build exists.
#
# Signals: Ctrl-C (SIGINT), SIGTERM and SIGUSR1 go to the ranks themselves, not through mpirun:
# Open MPI's mpirun answers a SIGINT or SIGTERM of its own by killing the ranks about a second
# later, before `train` has saved, and then exits 1. The ranks save at the next step boundary
# and exit 3 (requeue), which this script returns; a second Ctrl-C stops them at once.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
ranks=1
emulate=0
while [ $# -gt 0 ]; do
  case $1 in
    -n) ranks=$2; shift 2 ;;
    --emulate-hosts) emulate=1; shift ;;
    *) break ;;
  esac
done
default_exe=$here/build/cpu/src/meshtrain
if [ "$emulate" = 1 ]; then
  export MESHTRAIN_EMULATE_HOSTS=1
  [ -x "$here/build/cuda/src/meshtrain" ] && default_exe=$here/build/cuda/src/meshtrain
fi
exe=${MESHTRAIN_EXE:-$default_exe}
if [ ! -x "$exe" ]; then
  echo "jobs/local.sh: $exe not found; build first (cmake --preset cpu && cmake --build --preset cpu)" >&2
  exit 2
fi
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
read -r -a flags <<< "${MPIRUN_FLAGS:-}"   # extra mpirun flags, word-split
# A session of its own: the terminal's Ctrl-C reaches this script, not mpirun.
[ "$emulate" = 1 ] && flags+=(-x MESHTRAIN_EMULATE_HOSTS)
setsid mpirun -np "$ranks" --oversubscribe "${flags[@]}" "$exe" "$@" < /dev/null &
pid=$!
# shellcheck disable=SC2317  # called from the traps
forward() {  # SIGNAL: to every rank (mpirun's children on this machine)
  local children
  children=$(pgrep -P "$pid" || true)
  # shellcheck disable=SC2086  # one pid per word
  [ -z "$children" ] || kill -s "$1" $children 2> /dev/null || true
}
# The second Ctrl-C is counted here, where signals arrive in order: a rank that is descheduled
# when both reach it would see them as one pending signal.
ints=0
# shellcheck disable=SC2317  # called from the trap
on_int() {
  ints=$((ints + 1))
  if [ "$ints" -ge 2 ]; then
    echo "jobs/local.sh: second Ctrl-C: stopping the ranks now (no checkpoint)" >&2
    forward KILL
  else
    forward INT
  fi
}
trap on_int INT
trap 'forward TERM' TERM
trap 'forward USR1' USR1
# wait returns early (status > 128) when a trapped signal arrives: wait until mpirun is gone,
# then once more for its status.
while kill -0 "$pid" 2> /dev/null; do wait "$pid" || true; done
rc=0
wait "$pid" || rc=$?
exit "$rc"
