# shellcheck shell=bash
# What the Slurm batch scripts in jobs/ share (sourced by them, never run). A script sets its
# #SBATCH header and calls `mt_main gpu|cpu "$@"`; everything below is plain bash that reads the
# SLURM_* variables Slurm sets in a batch job, so tests/scripts/test_slurm_jobs.sh runs it with
# fake srun/scontrol/mpirun/meshtrain on PATH.
#
# Script arguments:  [--dp N] [--pp N] [--tp N] [--ranks N] [--] [SUBCOMMAND] [meshtrain options]
#   SUBCOMMAND defaults to `train`. --dp/--pp/--tp become --mesh.dp/--mesh.pp/--mesh.tp (only the
#   axes given: a --config file's [mesh] section is not overridden by defaults); the environment
#   variables MESHTRAIN_DP/_PP/_TP do the same. --ranks runs fewer ranks than the allocation
#   holds (scaling sweeps on part of a node).
#
# Environment (all optional):
#   MESHTRAIN_EXE         the executable; default: the checkout's build/<preset>/src/meshtrain,
#                         else `meshtrain` on PATH (e.g. after `spack load meshtrain`)
#   MESHTRAIN_LAUNCHER    srun (default; `srun --mpi=$MESHTRAIN_SRUN_MPI`, pmix by default) or
#                         mpirun (Open MPI's mpirun inside the allocation)
#   MESHTRAIN_OUT_DIR     train.out_dir; default $SLURM_SUBMIT_DIR/out/<job name>-<job id>
#   MESHTRAIN_CKPT_DIR    ckpt.dir; default <out_dir>/ckpt
#   MESHTRAIN_CHECKPOINTS auto (default: on when `meshtrain train --help` lists --ckpt.dir),
#                         on, off: pass --ckpt.dir, and `--train.resume latest` when
#                         <ckpt.dir>/latest exists
#   MESHTRAIN_MAX_REQUEUES stop requeueing after this many restarts (default 50)
#   MESHTRAIN_SITE_ENV    file with the site's NCCL/MPI settings (default jobs/lib/site_env.sh)
#   SRUN_FLAGS, MPIRUN_FLAGS extra launcher flags (word-split)
#
# Exit codes of meshtrain the scripts act on (README "Exit codes"; issue 8):
#   0 done; 3 = checkpoint saved after SIGUSR1/SIGTERM, requeue me -> `scontrol requeue`, and the
#   next run resumes from <ckpt.dir>/latest; anything else is a failure, passed on, not requeued.

MT_REQUEUE_RC=3

mt_log() { echo "[meshtrain-job $(date '+%F %T')] $*"; }
mt_die() { echo "[meshtrain-job] error: $*" >&2; exit 2; }

# A positive integer or die naming the setting.
mt_int() {
  case $2 in '' | *[!0-9]* | 0) mt_die "$1=$2 must be a positive integer" ;; esac
}

# GPUs of this node: SLURM_GPUS_ON_NODE, else SLURM_GPUS_PER_NODE (which may be typed: 'h100:4').
mt_gpus_per_node() {
  local g=${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-0}}
  g=${g##*:}
  g=${g%%(*}
  echo "${g:-0}"
}

# Value of option NAME in the meshtrain arguments MT_ARGS (`--NAME V` or `--NAME=V`), or empty.
mt_arg_value() {
  local name=$1 i
  for ((i = 0; i < ${#MT_ARGS[@]}; i++)); do
    case ${MT_ARGS[i]} in
      "--$name") echo "${MT_ARGS[i + 1]:-}"; return ;;
      "--$name="*) echo "${MT_ARGS[i]#*=}"; return ;;
    esac
  done
}

# Value of KEY in [SECTION] of an INI file (meshtrain's --config format), or empty.
mt_ini_value() {
  [ -f "$1" ] || return 0
  awk -v sec="$2" -v key="$3" '
    /^[ \t]*\[/ { s = $0; gsub(/[][ \t]/, "", s); next }
    s == sec && index($0, "=") {
      k = substr($0, 1, index($0, "=") - 1); v = substr($0, index($0, "=") + 1)
      gsub(/^[ \t]+|[ \t]+$/, "", k); gsub(/^[ \t]+|[ \t]+$/, "", v)
      if (k == key) { print v; exit }
    }' "$1"
}

# A dotted option's value: command line, else the --config file, else empty.
mt_option() {
  local v cfg
  v=$(mt_arg_value "$1")
  if [ -z "$v" ]; then
    cfg=$(mt_arg_value config)
    [ -n "$cfg" ] || cfg=$(mt_arg_value c)
    [ -z "$cfg" ] || v=$(mt_ini_value "$cfg" "${1%%.*}" "${1#*.}")
  fi
  echo "$v"
}

# Split the script's arguments: MT_DP/MT_PP/MT_TP/MT_RANKS, MT_SUB, MT_ARGS.
mt_parse_args() {
  MT_DP=${MESHTRAIN_DP:-} MT_PP=${MESHTRAIN_PP:-} MT_TP=${MESHTRAIN_TP:-} MT_RANKS=""
  while [ $# -gt 0 ]; do
    case $1 in
      --dp | --pp | --tp | --ranks)
        [ $# -ge 2 ] || mt_die "$1 needs a value"
        local v=$2 o=${1#--}; shift 2 ;;
      --dp=* | --pp=* | --tp=* | --ranks=*)
        local v=${1#*=} o=${1%%=*}; o=${o#--}; shift ;;
      --) shift; break ;;
      *) break ;;
    esac
    case $o in dp) MT_DP=$v ;; pp) MT_PP=$v ;; tp) MT_TP=$v ;; ranks) MT_RANKS=$v ;; esac
  done
  MT_SUB=train
  if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then MT_SUB=$1; shift; fi
  MT_ARGS=("$@")
}

# The executable: MESHTRAIN_EXE, else the checkout's build for this mode, else PATH.
mt_find_exe() {
  local preset=$1
  if [ -n "${MESHTRAIN_EXE:-}" ]; then echo "$MESHTRAIN_EXE"; return; fi
  if [ -x "$MT_ROOT/build/$preset/src/meshtrain" ]; then
    echo "$MT_ROOT/build/$preset/src/meshtrain"; return
  fi
  command -v meshtrain || mt_die "no meshtrain executable: build it (cmake --preset $preset &&" \
    "cmake --build --preset $preset), \`spack load meshtrain\`, or set MESHTRAIN_EXE"
}

# Ranks, ranks per node and CPUs per rank from the allocation (MT_NODES, MT_RANKS, MT_RPN, MT_CPT).
mt_layout() {
  local mode=$1 gpn
  MT_NODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
  MT_CPT=${SLURM_CPUS_PER_TASK:-1}
  if [ "$mode" = gpu ]; then
    gpn=$(mt_gpus_per_node)
    mt_int "GPUs per node (--gpus-per-node)" "$gpn"
    # One rank per GPU: the allocation's tasks must match, or srun cannot place the ranks.
    if [ -n "${SLURM_NTASKS_PER_NODE:-}" ] && [ "${SLURM_NTASKS_PER_NODE}" != "$gpn" ]; then
      mt_die "--ntasks-per-node=${SLURM_NTASKS_PER_NODE} but --gpus-per-node=$gpn:" \
        "one rank per GPU needs them equal"
    fi
    MT_RPN=$gpn
    local all=$((MT_NODES * gpn))
    MT_RANKS=${MT_RANKS:-$all}
    mt_int "--ranks" "$MT_RANKS"
    [ "$MT_RANKS" -le "$all" ] || mt_die "--ranks $MT_RANKS > $MT_NODES node(s) x $gpn GPU(s)"
    if [ "$MT_RANKS" -lt "$all" ]; then
      # Part of the allocation (a sweep's small runs): fill whole nodes, then the rest.
      MT_NODES=$(((MT_RANKS + gpn - 1) / gpn))
      [ "$MT_RANKS" -ge "$gpn" ] || MT_RPN=$MT_RANKS
      [ $((MT_RANKS % MT_RPN)) -eq 0 ] ||
        mt_die "--ranks $MT_RANKS is not a multiple of $gpn GPUs per node"
    fi
  else
    local all=${SLURM_NTASKS:-${SLURM_NPROCS:-1}}
    MT_RANKS=${MT_RANKS:-$all}
    mt_int "--ranks" "$MT_RANKS"
    [ "$MT_RANKS" -le "$all" ] || mt_die "--ranks $MT_RANKS > the job's $all tasks (--ntasks)"
    # Fill nodes as the allocation does; fewer ranks than a node's tasks use one node.
    MT_RPN=${SLURM_NTASKS_PER_NODE:-$(((all + MT_NODES - 1) / MT_NODES))}
    [ "$MT_RANKS" -ge "$MT_RPN" ] || MT_RPN=$MT_RANKS
    MT_NODES=$(((MT_RANKS + MT_RPN - 1) / MT_RPN))
  fi
}

# --mesh.* arguments for the axes given; checks the product when all three are known.
mt_mesh_args() {
  local axis v
  MT_MESH=()
  for axis in dp pp tp; do
    case $axis in dp) v=$MT_DP ;; pp) v=$MT_PP ;; tp) v=$MT_TP ;; esac
    if [ -n "$(mt_arg_value "mesh.$axis")" ]; then
      [ -z "$v" ] || mt_die "--$axis $v and --mesh.$axis both given"
      continue
    fi
    [ -z "$v" ] || { mt_int "--$axis" "$v"; MT_MESH+=("--mesh.$axis" "$v"); }
  done
  local pp=${MT_PP:-$(mt_option mesh.pp)} tp=${MT_TP:-$(mt_option mesh.tp)}
  local dp=${MT_DP:-$(mt_option mesh.dp)}
  pp=${pp:-1} tp=${tp:-1}
  if [ -z "$dp" ] || [ "$dp" = 0 ]; then
    [ $((MT_RANKS % (pp * tp))) -eq 0 ] ||
      mt_die "pp x tp = $pp x $tp does not divide the $MT_RANKS ranks"
  elif [ $((dp * pp * tp)) -ne "$MT_RANKS" ]; then
    mt_die "dp x pp x tp = $dp x $pp x $tp = $((dp * pp * tp)) but the job runs $MT_RANKS ranks"
  fi
  if [ "${MT_MODE}" = gpu ] && [ "$tp" -gt "$MT_RPN" ]; then
    mt_log "warning: tp=$tp spans nodes ($MT_RPN GPUs per node); tensor parallelism wants NVLink"
  fi
}

# train: output folder, checkpoint folder and `--train.resume latest` (MT_TRAIN).
mt_train_args() {
  MT_TRAIN=()
  local out ckpt mode=${MESHTRAIN_CHECKPOINTS:-auto}
  out=$(mt_option train.out_dir)
  if [ -z "$out" ]; then
    out=${SLURM_SUBMIT_DIR:-$PWD}/out/${SLURM_JOB_NAME:-meshtrain}-${SLURM_JOB_ID:-0}
    out=${MESHTRAIN_OUT_DIR:-$out}
    MT_TRAIN+=(--train.out_dir "$out")
  fi
  mkdir -p "$out"
  if [ "$mode" = auto ]; then
    local help
    help=$("$MT_EXE" train --help 2>/dev/null || true)
    case $help in *--ckpt.dir*) mode=on ;; *) mode=off ;; esac
  fi
  if [ "$mode" != on ]; then
    mt_log "checkpoints off (MESHTRAIN_CHECKPOINTS=${MESHTRAIN_CHECKPOINTS:-auto})"
    return 0
  fi
  ckpt=$(mt_option ckpt.dir)
  if [ -z "$ckpt" ]; then
    ckpt=${MESHTRAIN_CKPT_DIR:-$out/ckpt}
    MT_TRAIN+=(--ckpt.dir "$ckpt")
  fi
  if [ -z "$(mt_option train.resume)" ] && [ -e "$ckpt/latest" ]; then
    MT_TRAIN+=(--train.resume latest)
    mt_log "resuming from $ckpt/latest (restart ${SLURM_RESTART_COUNT:-0})"
  fi
}

# The launch command (MT_CMD).
mt_launch_cmd() {
  local launcher=${MESHTRAIN_LAUNCHER:-srun} flags
  case $launcher in
    srun)
      # srun does not inherit --cpus-per-task from sbatch since Slurm 22.05: pass it again.
      MT_CMD=(srun "--mpi=${MESHTRAIN_SRUN_MPI:-pmix}" "--nodes=$MT_NODES" "--ntasks=$MT_RANKS"
        "--ntasks-per-node=$MT_RPN" "--cpus-per-task=$MT_CPT"
        "--cpu-bind=${MESHTRAIN_CPU_BIND:-cores}")
      # Every rank sees all GPUs of its node (NCCL needs its peers); meshtrain picks its own.
      [ "$MT_MODE" != gpu ] || MT_CMD+=(--gpu-bind=none)
      read -r -a flags <<< "${SRUN_FLAGS:-}"
      ;;
    mpirun)
      # Open MPI 4/5 inside the allocation: ranks per node with PE cores each, bound to cores.
      # (A longer odls_base_sigkill_timeout would let ranks save after a SIGTERM of mpirun's
      # own, but Open MPI 4.1 then waits twice that long after any non-zero exit, the requeue
      # code 3 included: signals reach the ranks as SIGUSR1 instead, see mt_run.)
      MT_CMD=(mpirun -np "$MT_RANKS" --map-by "ppr:$MT_RPN:node:PE=$MT_CPT" --bind-to core
        -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS)
      read -r -a flags <<< "${MPIRUN_FLAGS:-}"
      ;;
    *) mt_die "MESHTRAIN_LAUNCHER=$launcher: use srun or mpirun" ;;
  esac
  MT_CMD+=("${flags[@]}" "$MT_EXE" "$MT_SUB" "${MT_MESH[@]}" "${MT_TRAIN[@]}" "${MT_ARGS[@]}")
}

# SIGUSR1 to mpirun, which forwards it to every rank on every node, and to this node's ranks
# directly (mpirun's children), in case a build does not forward it: twice is harmless.
# shellcheck disable=SC2317  # called from the traps
mt_usr1_mpirun() {
  local children
  kill -USR1 "$MT_PID" 2>/dev/null || true
  children=$(pgrep -P "$MT_PID" 2>/dev/null || true)
  # shellcheck disable=SC2086  # one pid per word
  [ -z "$children" ] || kill -USR1 $children 2>/dev/null || true
}

# Run MT_CMD in the background and forward SIGUSR1/SIGTERM to it: with `--signal=B:USR1@<s>`
# Slurm signals this shell, srun passes the signal to every task. Open MPI's mpirun would kill
# the ranks about a second after a SIGTERM of its own, before their save, and exit 1 instead of
# the ranks' 3: under mpirun both signals go on as SIGUSR1, the same graceful stop.
# Sets MT_RC to the launcher's exit code.
mt_run() {
  mt_log "$(printf '%q ' "${MT_CMD[@]}")"
  "${MT_CMD[@]}" &
  MT_PID=$!
  if [ "${MESHTRAIN_LAUNCHER:-srun}" = mpirun ]; then
    trap 'mt_log "SIGUSR1 forwarded: checkpoint asked"; mt_usr1_mpirun' USR1
    trap 'mt_log "SIGTERM forwarded as SIGUSR1 (mpirun): checkpoint asked"; mt_usr1_mpirun' TERM
  else
    trap 'mt_log "SIGUSR1 forwarded: checkpoint asked"; kill -USR1 "$MT_PID" 2>/dev/null || true' USR1
    trap 'mt_log "SIGTERM forwarded: checkpoint asked"; kill -TERM "$MT_PID" 2>/dev/null || true' TERM
  fi
  # wait returns early (status > 128) when a trapped signal arrives: wait again until the
  # launcher is gone, then once more for its status (bash keeps it).
  while kill -0 "$MT_PID" 2>/dev/null; do wait "$MT_PID" || true; done
  wait "$MT_PID" && MT_RC=0 || MT_RC=$?
  trap - USR1 TERM
}

# Act on the exit code: requeue on MT_REQUEUE_RC, pass anything else on. Exits.
mt_finish() {
  local rc=$1 restarts=${SLURM_RESTART_COUNT:-0} max=${MESHTRAIN_MAX_REQUEUES:-50}
  if [ "$rc" -eq 0 ]; then
    mt_log "meshtrain finished (exit 0)"
    exit 0
  fi
  if [ "$rc" -ne "$MT_REQUEUE_RC" ]; then
    mt_log "meshtrain failed (exit $rc); not requeued"
    exit "$rc"
  fi
  if [ "$restarts" -ge "$max" ]; then
    mt_log "checkpoint saved, but this job was restarted $restarts times" \
      "(MESHTRAIN_MAX_REQUEUES=$max): not requeued"
    exit "$rc"
  fi
  mt_log "checkpoint saved (exit $rc): requeueing job ${SLURM_JOB_ID:-?}" \
    "(restart $((restarts + 1)))"
  if scontrol requeue "${SLURM_JOB_ID:?not in a Slurm job}"; then
    exit 0
  fi
  mt_log "scontrol requeue failed; resubmit this script by hand to resume from latest"
  exit "$rc"
}

# mt_setup MODE ARGS...: everything up to the launch command (MT_CMD).
mt_setup() {
  MT_MODE=$1; shift
  mt_parse_args "$@"
  local preset=cpu
  [ "$MT_MODE" = cpu ] || preset=cuda
  MT_EXE=$(mt_find_exe "$preset")
  mt_layout "$MT_MODE"
  mt_mesh_args
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$MT_CPT}
  export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$MT_CPT}
  local site=${MESHTRAIN_SITE_ENV:-$MT_ROOT/jobs/lib/site_env.sh}
  # shellcheck source=site_env.sh
  [ ! -f "$site" ] || . "$site"
  MT_TRAIN=()
  [ "$MT_SUB" != train ] || mt_train_args
  mt_launch_cmd
  mt_log "job ${SLURM_JOB_ID:-none} restart ${SLURM_RESTART_COUNT:-0}: $MT_RANKS rank(s) on" \
    "$MT_NODES node(s), $MT_RPN per node, $MT_CPT CPU(s) per rank, $MT_MODE," \
    "${MESHTRAIN_LAUNCHER:-srun}"
}

# The whole job: set up, run, requeue or exit.
mt_main() {
  mt_setup "$@"
  mt_run
  mt_finish "$MT_RC"
}
