#!/usr/bin/env bash
# Runs the payload of each Slurm script in jobs/ without Slurm: fake srun, mpirun, scontrol and
# meshtrain on PATH log their arguments; the SLURM_* variables are those Slurm sets in a batch job.
# Checks the launch lines (ranks = nodes x GPUs, --mesh.*, --train.resume latest) and the requeue
# logic.
#   tests/scripts/test_slurm_jobs.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
work=$2
rm -rf "$work"
mkdir -p "$work/bin" "$work/spool" "$work/checkout/build/cpu/src"
work=$(cd "$work" && pwd)
log=$work/calls.log
failures=0

# ---- stubs ----------------------------------------------------------------------------------
# srun / mpirun: log the line, then exec the program (the first argument named meshtrain), so
# signals sent to the launcher reach the fake meshtrain as they would reach ranks.
for launcher in srun mpirun; do
  cat > "$work/bin/$launcher" <<'EOF'
#!/usr/bin/env bash
echo "${0##*/} $*" >> "$STUB_LOG"
for ((i = 1; i <= $#; i++)); do
  a=${!i}
  if [ "${a##*/}" = meshtrain ]; then exec "${@:i}"; fi
done
echo "stub: no meshtrain in: $*" >&2
exit 99
EOF
done
cat > "$work/bin/scontrol" <<'EOF'
#!/usr/bin/env bash
echo "scontrol $*" >> "$STUB_LOG"
exit "${FAKE_SCONTROL_RC:-0}"
EOF
# meshtrain: answers `train --help` (with --ckpt.dir unless FAKE_NO_CKPT), logs its arguments and
# thread variables, exits FAKE_RC; with FAKE_WAIT_SIGNAL it waits for SIGUSR1 and exits 3 (the
# requeue code) as meshtrain does after its checkpoint.
cat > "$work/bin/meshtrain" <<'EOF'
#!/usr/bin/env bash
if [ "${2:-}" = --help ]; then
  [ -n "${FAKE_NO_CKPT:-}" ] || echo "  --ckpt.dir arg   checkpoint folder"
  exit 0
fi
echo "meshtrain $*" >> "$STUB_LOG"
echo "env OMP_NUM_THREADS=${OMP_NUM_THREADS:-} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-}" >> "$STUB_LOG"
if [ -n "${FAKE_WAIT_SIGNAL:-}" ]; then
  trap 'echo "meshtrain got SIGUSR1" >> "$STUB_LOG"; exit 3' USR1
  touch "$FAKE_WAIT_SIGNAL"
  for _ in $(seq 600); do sleep 0.1; done
  exit 1
fi
exit "${FAKE_RC:-0}"
EOF
chmod +x "$work/bin"/*
cp "$work/bin/meshtrain" "$work/checkout/build/cpu/src/meshtrain"
# The submit directory: a checkout whose jobs/ is the tree under test.
ln -s "$src/jobs" "$work/checkout/jobs"

# ---- helpers --------------------------------------------------------------------------------
fail() { echo "FAIL [$case_name]: $*"; failures=$((failures + 1)); }
has() { grep -qF -- "$2" <<< "$(grep "^$1 " "$log" || true)" || fail "no '$2' in the $1 line: $(grep "^$1 " "$log" || echo '(not called)')"; }
hasnt() { ! grep -qF -- "$2" <<< "$(grep "^$1 " "$log" || true)" || fail "unexpected '$2' in the $1 line"; }
called() { grep -q "^$1 " "$log" || fail "$1 not called"; }
not_called() { ! grep -q "^$1 " "$log" || fail "$1 called: $(grep "^$1 " "$log")"; }
output_has() { grep -qF -- "$1" "$work/$case_name.out" || fail "output lacks '$1'"; }

# run_job NAME EXPECTED_RC SCRIPT [VAR=VALUE...] -- [script args...]
# Runs a copy of jobs/SCRIPT the way slurmd does (from its spool, cwd = submit dir) in a clean
# environment: a 2-node x 4-GPU allocation unless the case overrides the variables.
run_job() {
  case_name=$1
  local want=$2 script=$3 rc
  shift 3
  local vars=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  [ $# -eq 0 ] || shift
  : > "$log"
  cp "$src/jobs/$script" "$work/spool/slurm_script"
  set +e
  (cd "$work/checkout" && env -i PATH="$work/bin:/usr/bin:/bin" HOME="$work" STUB_LOG="$log" \
    SLURM_JOB_ID=4242 SLURM_JOB_NAME=meshtrain SLURM_SUBMIT_DIR="$work/checkout" \
    SLURM_NNODES=2 SLURM_JOB_NUM_NODES=2 SLURM_NTASKS=8 SLURM_NPROCS=8 SLURM_NTASKS_PER_NODE=4 \
    SLURM_TASKS_PER_NODE="4(x2)" SLURM_GPUS_ON_NODE=4 SLURM_GPUS_PER_NODE=4 SLURM_CPUS_PER_TASK=8 \
    SLURM_CPUS_ON_NODE=32 MESHTRAIN_EXE="$work/bin/meshtrain" "${vars[@]}" \
    bash "$work/spool/slurm_script" "$@") > "$work/$case_name.out" 2>&1
  rc=$?
  set -e
  [ "$rc" = "$want" ] || fail "exit $rc, expected $want; output:$(sed 's/^/  | /' "$work/$case_name.out")"
}

out=$work/checkout/out/meshtrain-4242

# ---- launch lines ---------------------------------------------------------------------------
run_job multinode_srun 0 slurm-multinode.sh -- --pp 2 --tp 2 --train.steps 5
has srun "--mpi=pmix"
has srun "--nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=8 --cpu-bind=cores"
has srun "--gpu-bind=none"
has meshtrain "train --mesh.pp 2 --mesh.tp 2 --train.out_dir $out --ckpt.dir $out/ckpt --train.steps 5"
hasnt meshtrain "--mesh.dp"
hasnt meshtrain "--train.resume"
has env "OMP_NUM_THREADS=8 OPENBLAS_NUM_THREADS=8"
not_called scontrol

run_job multinode_env_mesh 0 slurm-multinode.sh MESHTRAIN_DP=2 MESHTRAIN_TP=4 -- --config x.ini
has meshtrain "train --mesh.dp 2 --mesh.tp 4 "
has meshtrain "--config x.ini"

run_job multinode_mpirun 0 slurm-multinode.sh MESHTRAIN_LAUNCHER=mpirun MPIRUN_FLAGS="--report-bindings" -- --dp 8
has mpirun "-np 8 --map-by ppr:4:node:PE=8 --bind-to core"
has mpirun "--report-bindings"
has meshtrain "train --mesh.dp 8 "
not_called srun

run_job one_node_typed_gpus 0 slurm-gpu.sh SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 SLURM_NTASKS=4 \
  SLURM_GPUS_ON_NODE= SLURM_GPUS_PER_NODE=h100:4 -- selfcheck --mesh.tp 4
has srun "--nodes=1 --ntasks=4 --ntasks-per-node=4"
has meshtrain "selfcheck --mesh.tp 4"
hasnt meshtrain "--ckpt.dir"          # only train gets checkpoint arguments

run_job part_of_a_node 0 slurm-gpu.sh SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 SLURM_NTASKS=4 -- --ranks 2 --tp 2
has srun "--nodes=1 --ntasks=2 --ntasks-per-node=2"

run_job cpu_job 0 slurm-cpu.sh SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 SLURM_NTASKS_PER_NODE=8 SLURM_GPUS_ON_NODE= \
  SLURM_GPUS_PER_NODE= SLURM_CPUS_PER_TASK=2 MESHTRAIN_EXE= -- --dp 8 --config inputs/cpu-bench.ini
has srun "--nodes=1 --ntasks=8 --ntasks-per-node=8 --cpus-per-task=2"
hasnt srun "--gpu-bind"
has srun "$work/checkout/build/cpu/src/meshtrain train --mesh.dp 8"   # the checkout's cpu build
has env "OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2"

# prep over every task of a CPU job: the ranks share the corpus files (README "Data").
run_job cpu_prep 0 slurm-cpu.sh SLURM_GPUS_ON_NODE= SLURM_GPUS_PER_NODE= -- prep \
  --prep.input "raw/*.jsonl.zst" --prep.output data/web
has srun "--nodes=2 --ntasks=8 --ntasks-per-node=4"
has meshtrain "prep --prep.input raw/*.jsonl.zst --prep.output data/web"
hasnt meshtrain "--ckpt.dir"
hasnt meshtrain "--mesh."

run_job cpu_part_of_two_nodes 0 slurm-cpu.sh SLURM_GPUS_ON_NODE= SLURM_GPUS_PER_NODE= \
  SLURM_NTASKS_PER_NODE= -- --ranks 2
has srun "--nodes=1 --ntasks=2 --ntasks-per-node=2 --cpus-per-task=8"

# A --config file's out_dir is the run's; no --train.out_dir is added, the checkpoints go there.
mkdir -p "$work/checkout/cfg"
printf '[train]\nout_dir = %s\n[mesh]\ntp = 2\n' "$work/ini_out" > "$work/checkout/cfg/run.ini"
run_job ini_out_dir 0 slurm-multinode.sh -- --config cfg/run.ini
hasnt meshtrain "--train.out_dir"
has meshtrain "--ckpt.dir $work/ini_out/ckpt"

run_job no_checkpoint_support 0 slurm-multinode.sh FAKE_NO_CKPT=1 -- --tp 2
hasnt meshtrain "--ckpt.dir"
has meshtrain "--train.out_dir $out"

# Submitted from elsewhere (an installed copy): the library comes from MESHTRAIN_HOME.
mkdir -p "$work/elsewhere"
run_job meshtrain_home 0 slurm-gpu.sh SLURM_SUBMIT_DIR="$work/elsewhere" MESHTRAIN_HOME="$work/checkout" \
  SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 SLURM_NTASKS=4 -- --tp 2
has meshtrain "train --mesh.tp 2 --train.out_dir $work/elsewhere/out/meshtrain-4242"

# ---- resume and requeue ---------------------------------------------------------------------
mkdir -p "$out/ckpt" && echo step_00000100.h5 > "$out/ckpt/latest"
run_job resume_latest 0 slurm-multinode.sh SLURM_RESTART_COUNT=1 -- --tp 2
has meshtrain "--ckpt.dir $out/ckpt --train.resume latest"
output_has "resuming from $out/ckpt/latest (restart 1)"
rm -rf "$out"

run_job requeue_on_exit_3 0 slurm-multinode.sh FAKE_RC=3 -- --tp 2
has scontrol "requeue 4242"
output_has "requeueing job 4242"

run_job exit_0_no_requeue 0 slurm-multinode.sh FAKE_RC=0 -- --tp 2
not_called scontrol

run_job failure_propagates 1 slurm-multinode.sh FAKE_RC=1 -- --tp 2
not_called scontrol
output_has "meshtrain failed (exit 1); not requeued"

run_job config_error_propagates 2 slurm-multinode.sh FAKE_RC=2 -- --tp 2
not_called scontrol

run_job requeue_limit 3 slurm-multinode.sh FAKE_RC=3 SLURM_RESTART_COUNT=5 MESHTRAIN_MAX_REQUEUES=5 -- --tp 2
not_called scontrol

run_job scontrol_fails 3 slurm-multinode.sh FAKE_RC=3 FAKE_SCONTROL_RC=1 -- --tp 2
called scontrol

# --signal=B:USR1@<s>: Slurm signals the batch shell; it forwards SIGUSR1 to the launcher, the
# fake meshtrain "checkpoints" and exits 3, the job requeues itself and exits 0.
case_name=signal_forwarded
: > "$log"
ready=$work/meshtrain_ready
rm -f "$ready"
cp "$src/jobs/slurm-gpu.sh" "$work/spool/slurm_script"
(cd "$work/checkout" && exec env -i PATH="$work/bin:/usr/bin:/bin" HOME="$work" STUB_LOG="$log" \
  SLURM_JOB_ID=777 SLURM_JOB_NAME=meshtrain SLURM_SUBMIT_DIR="$work/checkout" SLURM_NNODES=1 \
  SLURM_NTASKS=4 SLURM_NTASKS_PER_NODE=4 SLURM_GPUS_ON_NODE=4 SLURM_CPUS_PER_TASK=8 \
  MESHTRAIN_EXE="$work/bin/meshtrain" FAKE_WAIT_SIGNAL="$ready" \
  bash "$work/spool/slurm_script" --tp 4) > "$work/$case_name.out" 2>&1 &
job=$!
for _ in $(seq 300); do [ -e "$ready" ] && break; sleep 0.1; done
[ -e "$ready" ] || fail "fake meshtrain never started"
kill -USR1 "$job"
rc=0
wait "$job" || rc=$?
[ "$rc" = 0 ] || fail "exit $rc, expected 0; output:$(sed 's/^/  | /' "$work/$case_name.out")"
grep -q "meshtrain got SIGUSR1" "$log" || fail "SIGUSR1 did not reach meshtrain"
has scontrol "requeue 777"

# ---- configuration errors stop before the launch ---------------------------------------------
run_job bad_mesh 2 slurm-multinode.sh -- --dp 3 --tp 2
not_called srun
output_has "dp x pp x tp = 3 x 1 x 2 = 6 but the job runs 8 ranks"

run_job tasks_not_gpus 2 slurm-multinode.sh SLURM_NTASKS_PER_NODE=2 -- --tp 2
not_called srun
output_has "--ntasks-per-node=2 but --gpus-per-node=4"

run_job duplicate_axis 2 slurm-multinode.sh -- --tp 2 --mesh.tp 4
output_has "--tp 2 and --mesh.tp both given"

# ---- a sweep array task ---------------------------------------------------------------------
sweep=$work/sweep
mkdir -p "$sweep/r0" "$sweep/r1"
printf '%s\n' --ranks 4 --dp 4 train --train.metrics "$sweep/r0/metrics.jsonl" > "$sweep/r0/args"
printf '%s\n' --ranks 8 --dp 3 train > "$sweep/r1/args"
printf '%s\n' "$sweep/r0" "$sweep/r1" > "$sweep/array.list"
run_job sweep_task_0 0 slurm-sweep.sh SLURM_ARRAY_TASK_ID=0 -- gpu "$sweep/array.list"
has srun "--nodes=1 --ntasks=4 --ntasks-per-node=4"
has meshtrain "train --mesh.dp 4 --train.out_dir"
has meshtrain "--train.metrics $sweep/r0/metrics.jsonl"
hasnt meshtrain "--ckpt.dir"           # sweeps time steps: no checkpoints
[ "$(cat "$sweep/r0/exit_code")" = 0 ] || fail "r0/exit_code is not 0"
run_job sweep_task_1_fails 2 slurm-sweep.sh SLURM_ARRAY_TASK_ID=1 -- gpu "$sweep/array.list"
[ "$(cat "$sweep/r1/exit_code" 2>/dev/null)" = 2 ] || fail "r1/exit_code is not 2"
grep -qF "dp x pp x tp = 3 x 1 x 1" "$sweep/r1/output.log" || fail "r1/output.log lacks the error"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed (logs in $work)"
  exit 1
fi
echo "all Slurm job checks passed"
