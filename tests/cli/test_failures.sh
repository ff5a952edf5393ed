#!/usr/bin/env bash
# Failures of the meshtrain executable (issue 17), one case per call: each must end the whole
# job with one message and an exit code, every rank gone within a bound, nothing lost.
#   test_failures.sh CASE WORKDIR DATA_GLOB -- MPIEXEC NUMPROC_FLAG [PREFLAGS...] -- EXE
#   test_failures.sh --measure ...same...   (no assertions: one line "case | rc | s | message"
#                                            for the before/after table of the note)
# A run that outlives BOUND seconds (default 90) is killed and counts as a hang; after every
# run no process whose command line names the case's folder may be left. The bound only
# detects hangs (every case ends in seconds), it measures nothing.
# Cases:
#   shard_one_rank      rank 1 alone is given a truncated shard (an MPMD launch: node-local data)
#   metrics_no_folder   --train.metrics in a folder that does not exist (only rank 0 writes it)
#   out_dir_one_rank    rank 1 alone has an output folder it cannot create
#   ckpt_unwritable     ckpt.dir cannot be created: found before step 1, not at the first save
#   one_rank_throws     an error on one rank that cannot be agreed: printed with the rank, abort
#   diverge_stop        lr 1e10, ckpt.every 1, ckpt.keep 1: exit 1 naming the step; latest
#                       still names a finite checkpoint
#   diverge_scaling     loss scaling whose every step overflows: stopped after max_skipped_steps
#   nan_stop / nan_skip / nan_rollback   one bad batch (MESHTRAIN_TEST_NAN_BATCH) under each
#                       train.on_nonfinite policy
#   watchdog_stall      rank 1 stops itself (SIGSTOP) before a dp all-reduce: every rank gone
#                       within comm.timeout + a margin, flight dumps name the collective
#   watchdog_skip       rank 1 leaves a dp all-reduce out: the dumps say who is behind
#   watchdog_abort_hangs  watchdog_stall whose aborts never return (MESHTRAIN_TEST_ABORT_HANGS,
#                       as NCCL's did on one GPU shared by emulated hosts): rank 0 exits on
#                       its own after 10 s and the launcher ends the stopped rank
#   metrics_4_ranks     a dp 2 x tp 2 run: metrics.jsonl parses line by line
#   metrics_full_disk   --train.metrics /dev/full: a warning, training goes on
#   ckpt_full_disk      the checkpoint's file on a full device: exit 1 naming the file, the cause
#   ckpt_metadata       a checkpoint whose dataset header is damaged: exit 2 naming the file
#   local_sigterm       SIGTERM to jobs/local.sh (signals the ranks directly): save, exit 3
#   local_sigint_twice  two Ctrl-C to jobs/local.sh: the second stops the ranks at once
#   slurm_mpirun_sigterm  jobs/slurm-cpu.sh with MESHTRAIN_LAUNCHER=mpirun (real mpirun, fake
#                       Slurm variables and scontrol): SIGTERM to the batch shell becomes SIGUSR1
#                       through mpirun: save, exit 3, requeue
# shellcheck disable=SC2016  # check conditions are single-quoted on purpose
set -euo pipefail

measure=0
if [ "$1" = --measure ]; then measure=1; shift; fi
case_name=$1 work=$2 data=$3
shift 3
[ "$1" = -- ] && shift
mpiexec=$1 np_flag=$2
shift 2
pre=()
while [ "$1" != -- ]; do pre+=("$1"); shift; done
shift
exe=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
bound=${BOUND:-90}

rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
cd "$work"

fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }
log() { echo "--- $*"; }

base=(--model.n_layer 1 --model.n_embd 32 --model.n_head 2 --train.seq_len 32
      --train.micro_batch 2 --train.warmup 1 --train.sample_tokens 0 --train.save false)
model=("${base[@]}" --data.train "$data" --train.eval_every 0 --data.val "")

# The launch lines (into `cmd`): N ranks of one command line, or one line per rank (MPMD,
# `:`-separated in mpiexec's syntax, `:::` here).
launch() { local n=$1; shift; cmd=("$mpiexec" "$np_flag" "$n" "${pre[@]}" "$exe" "$@"); }
launch_mpmd() {  # ARGS_RANK0... ::: ARGS_RANK1...
  local a=() b=() seen=0
  for x in "$@"; do
    if [ "$x" = ::: ]; then seen=1; continue; fi
    if [ $seen = 0 ]; then a+=("$x"); else b+=("$x"); fi
  done
  cmd=("$mpiexec" "${pre[@]}" "$np_flag" 1 "$exe" "${a[@]}" : "$np_flag" 1 "$exe" "${b[@]}")
}

# run NAME WANT_RC REGEX [VAR=VALUE...] -- launch|launch_mpmd ARGS...: runs with a bound, times
# it, checks that no process naming $work is left, the exit code and the message (NAME.log).
run() {
  local name=$1 want=$2 regex=$3 rc=0 envs=()
  shift 3
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  "$@"
  local t0 t1
  t0=$(date +%s.%N)
  env "${envs[@]}" timeout -s KILL "$bound" "${cmd[@]}" > "$name.log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  local left
  left=$(pgrep -f -- "$work/" || true)
  # shellcheck disable=SC2086  # one pid per word
  [ -z "$left" ] || kill -KILL $left 2> /dev/null || true
  if [ $measure = 1 ]; then
    local msg
    msg=$(grep -E "error|warning: (cannot|non-finite)|watchdog|diverged|exiting with" "$name.log" |
          grep -v "^\[rank" | head -n 2 | tr '\n' ' ' | cut -c1-300 || true)
    [ -n "$msg" ] || msg=$(grep -E "^step " "$name.log" | tail -n 1 | cut -d'|' -f1-2 || true)
    [ $rc != 137 ] || msg="(killed after ${bound} s: hung) $msg"
    [ -z "$left" ] || msg="$msg (ranks left behind)"
    echo "RESULT | $case_name/$name | $rc | $secs | $msg"
    return 0
  fi
  [ -z "$left" ] || { cat "$name.log"; fail "$name: processes left behind: $left"; }
  [ "$rc" != 137 ] || { cat "$name.log"; fail "$name: still running after $bound s (a hang)"; }
  [ "$rc" = "$want" ] || { cat "$name.log"; fail "$name: exit code $rc, expected $want"; }
  grep -Ezq -- "$regex" "$name.log" || { cat "$name.log"; fail "$name: output does not match '$regex'"; }
  log "$name: exit code $rc in $secs s, message as expected"
}

# check 'CONDITION' MESSAGE: the condition is evaluated here (single-quoted by the callers).
# shellcheck disable=SC2016
check() { [ $measure = 1 ] || { eval "$1" || fail "$2"; }; }

# Every tensor of a checkpoint is finite (h5dump prints nan/inf as such).
finite_h5() { ! h5dump "$1" 2> /dev/null | grep -Eiq '(^|[ ,(])-?(nan|inf)'; }
latest_of() { cat "$1/checkpoints/latest" 2> /dev/null || echo none; }

case $case_name in
  shard_one_rank)
    printf 'not a shard at all, 100 bytes or so of text, certainly not 1024 bytes of header...' \
      > short.bin
    run mpmd 2 "token shard '.*short\.bin' is [0-9]+ bytes, shorter than .* \(rank 1 of 2\)" -- \
      launch_mpmd train "${model[@]}" --train.out_dir "$work/a" ::: \
      train "${base[@]}" --data.train "$work/short.bin" --train.eval_every 0 --data.val "" \
      --train.out_dir "$work/a"
    ;;
  metrics_no_folder)
    run run 2 "train.metrics: the folder of '.*nope/metrics.jsonl'.* does not exist" -- \
      launch 2 train "${model[@]}" --train.out_dir "$work/a" --train.metrics "$work/nope/metrics.jsonl"
    ;;
  out_dir_one_rank)
    touch afile
    run mpmd 2 "train.out_dir: cannot create the folder '.*afile/out'.*\(rank 1 of 2\)" -- \
      launch_mpmd train "${model[@]}" --train.out_dir "$work/a" ::: \
      train "${model[@]}" --train.out_dir "$work/afile/out"
    ;;
  ckpt_unwritable)
    touch afile
    run run 2 "ckpt.dir: cannot create the folder '.*afile/ckpt'" -- \
      launch 2 train "${model[@]}" --train.out_dir "$work/a" --ckpt.dir "$work/afile/ckpt"
    check '! grep -q "^step " run.log' "a step ran before the unwritable ckpt.dir was found"
    ;;
  one_rank_throws)
    run run 1 "error on rank 1: test hook: an error on this rank alone.*rank 1 failed alone" \
      MESHTRAIN_TEST_THROW_AT_STEP=2 -- launch 2 train "${model[@]}" --train.out_dir "$work/a"
    ;;
  diverge_stop)
    run run 1 "training diverged: non-finite (loss|gradients).* at step [0-9]+.*stays latest" -- \
      launch 2 train "${model[@]}" --train.out_dir "$work/a" --train.steps 6 --train.lr 1e10 \
      --ckpt.every 1 --ckpt.keep 1
    check '[ "$(latest_of a)" != none ]' "no checkpoint is latest"
    check 'finite_h5 "a/checkpoints/$(latest_of a)"' "latest ($(latest_of a)) is not finite"
    check 'grep -q "\"nonfinite\": \[" a/metrics.jsonl' "the metrics do not flag the NaN"
    check 'python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" a/metrics.jsonl' \
      "a/metrics.jsonl is not valid JSON lines"
    ;;
  diverge_scaling)
    run run 1 "4 consecutive steps without an update \(inf/nan gradients under loss scaling" -- \
      launch 2 train "${model[@]}" --train.out_dir "$work/a" --train.steps 10 \
      --train.loss_scaling on --train.loss_scale_init 1267650600228229401496703205376 \
      --train.max_skipped_steps 4
    ;;
  nan_stop)
    run run 1 "non-finite gradients at step 4 \(train.on_nonfinite=stop\).*step_00000003.h5" \
      MESHTRAIN_TEST_NAN_BATCH=3 -- launch 2 train "${model[@]}" --train.out_dir "$work/a" \
      --train.steps 6 --ckpt.every 1 --ckpt.keep 1
    check '[ "$(latest_of a)" = step_00000003.h5 ]' "latest is $(latest_of a), not step 3"
    check 'finite_h5 a/checkpoints/step_00000003.h5' "step 3 is not finite"
    ;;
  nan_skip)
    run run 0 "non-finite gradients at step 4: update skipped \(train.on_nonfinite=skip\)" \
      MESHTRAIN_TEST_NAN_BATCH=3 -- launch 2 train "${model[@]}" --train.out_dir "$work/a" \
      --train.steps 6 --train.on_nonfinite skip
    ;;
  nan_rollback)
    run run 0 "rolled back to step 2 .*batches left out: 3" MESHTRAIN_TEST_NAN_BATCH=3 -- \
      launch 2 train "${model[@]}" --train.out_dir "$work/a" --train.steps 6 \
      --train.on_nonfinite rollback --ckpt.every 2 --ckpt.keep 1
    check '[ "$(latest_of a)" = step_00000006.h5 ]' "latest is $(latest_of a), not step 6"
    check 'finite_h5 a/checkpoints/step_00000006.h5' "step 6 is not finite"
    ;;
  watchdog_stall)
    run run 1 "watchdog on rank 0: operation #3 all_reduce .* on communicator 'dp'.*not arrived at #3 on 'dp': rank 1 \(no flight dump" \
      MESHTRAIN_TEST_COLLECTIVE=stall:1:dp:3 -- launch 2 train "${model[@]}" --train.out_dir "$work/a" \
      --train.steps 6 --comm.timeout 3
    check 'python3 - a/flight_0.json <<< "
import json, sys
d = json.load(open(sys.argv[1]))
dp = [c for c in d[\"communicators\"] if c[\"name\"] == \"dp\"][0]
e = [x for x in dp[\"entries\"] if x[\"seq\"] == 3][0]
assert e[\"op\"] == \"all_reduce\" and e[\"state\"] == \"outstanding\", e
"' "a/flight_0.json does not show dp #3 outstanding"
    # Rank 1 wrote nothing while stopped: the verdict above says "(no flight dump". It may write
    # one later, once the job's end wakes it (mpirun sends SIGCONT before SIGTERM; over NCCL its
    # collective #3 then fails at once against rank 0's aborted communicator, on the GPU suite's
    # emulated hosts), so its file, if any, must be newer than rank 0's verdict.
    check '[ ! -e a/flight_1.json ] || [ a/flight_1.json -nt a/flight_0.json ]' \
      "rank 1 wrote its dump before rank 0's verdict, while it was stopped"
    ;;
  watchdog_abort_hangs)
    run run 1 "the abort did not end the job within 10 s; exiting" \
      MESHTRAIN_TEST_COLLECTIVE=stall:1:dp:3 MESHTRAIN_TEST_ABORT_HANGS=1 -- launch 2 train \
      "${model[@]}" --train.out_dir "$work/a" --train.steps 6 --comm.timeout 3
    check '[ -e a/flight_0.json ]' "rank 0 wrote no flight dump"
    ;;
  watchdog_skip)
    run run 1 "not arrived at #3 on 'dp': rank 1 \(its last operation on 'dp' is #2 all_reduce" \
      MESHTRAIN_TEST_COLLECTIVE=skip:1:dp:3 -- launch 2 train "${model[@]}" --train.out_dir "$work/a" \
      --train.steps 6 --comm.timeout 3
    check '[ -e a/flight_0.json ]' "rank 0 wrote no flight dump"
    ;;
  metrics_4_ranks)
    run run 0 "step +3/3" -- launch 4 train "${base[@]}" --data.train "$data" --train.out_dir \
      "$work/a" --train.steps 3 --mesh.tp 2 --train.eval_every 1 --data.val "$data" \
      --train.eval_batches 1
    check 'python3 - a/metrics.jsonl <<< "
import json, sys
lines = open(sys.argv[1]).read().splitlines()
recs = [json.loads(l) for l in lines]
steps = [r[\"step\"] for r in recs if \"loss\" in r]
assert steps == [1, 2, 3], steps
assert all(r[\"ranks\"] == 4 for r in recs if \"loss\" in r)
assert sum(1 for r in recs if \"val_loss\" in r) == 3, recs
"' "a/metrics.jsonl is not 3 step records and 3 val records, one JSON object per line"
    ;;
  metrics_full_disk)
    run run 0 "warning: cannot write the metrics file '/dev/full': No space left on device" -- \
      launch 2 train "${model[@]}" --train.out_dir "$work/a" --train.steps 3 --train.metrics /dev/full
    check 'grep -Eq "step +3/3" run.log' "training did not go on"
    ;;
  ckpt_full_disk)
    mkdir -p a/checkpoints
    ln -s /dev/full a/checkpoints/step_00000002.h5.tmp
    run run 1 "step_00000002.h5.tmp': writing failed: .*(No space left on device|space)" -- \
      launch 2 train "${model[@]}" --train.out_dir "$work/a" --train.steps 2
    check '[ ! -e a/checkpoints/latest ]' "a latest was written for a failed save"
    ;;
  ckpt_metadata)
    run save 0 "step +2/2" -- launch 2 train "${model[@]}" --train.out_dir "$work/a" --train.steps 2
    f=a/checkpoints/step_00000002.h5
    # The object header of one dataset (h5ls -v: "Location: 1:ADDRESS"), overwritten.
    addr=$(h5ls -v "$f/model/transformer.wpe.weight" | sed -n 's/.*Location: *[0-9]*:\([0-9]*\).*/\1/p')
    [ -n "$addr" ] || fail "h5ls did not report the header address of wpe"
    printf 'XXXXXXXXXXXXXXXX' | dd of="$f" bs=1 seek=$((addr + 8)) conv=notrunc status=none
    run resume 2 "step_00000002.h5' is damaged \(its HDF5 metadata cannot be read\)" -- \
      launch 2 train "${model[@]}" --train.out_dir "$work/b" --train.steps 4 --train.resume "$f"
    ;;
  local_sigterm | local_sigint_twice)
    rc=0
    # Job control on: a background job of a script would otherwise start with SIGINT ignored,
    # which its traps cannot undo (a terminal's foreground job does not).
    set -m
    hold=0; [ "$case_name" = local_sigint_twice ] && hold=1
    MESHTRAIN_EXE=$exe MESHTRAIN_TEST_WAIT_SIGNAL_AT_STEP=2 MESHTRAIN_TEST_HOLD_AFTER_STOP=$hold \
      "$src/jobs/local.sh" -n 2 train \
      "${model[@]}" --train.out_dir "$work/a" --train.steps 6 > run.log 2>&1 &
    pid=$!
    set +m
    for _ in $(seq 600); do grep -q "waiting for a stop signal" run.log && break; sleep 0.1; done
    grep -q "waiting for a stop signal" run.log || { kill "$pid"; cat run.log; fail "never waited"; }
    t0=$(date +%s.%N)
    if [ "$case_name" = local_sigterm ]; then
      kill -TERM "$pid"
    else
      # The second one while rank 0 is still busy with the first (the hook holds it there, as
      # a slow save would; without it a tiny model saves before any second signal can come).
      kill -INT "$pid"
      for _ in $(seq 600); do grep -q "holding before the save" run.log && break; sleep 0.1; done
      grep -q "holding before the save" run.log || { kill -KILL "$pid"; cat run.log; fail "never held"; }
      kill -INT "$pid"
    fi
    # The guard must not hold the test's output open (ctest waits for it) or outlive the case.
    ( sleep "$bound"; kill -KILL "$pid" 2> /dev/null ) > /dev/null 2>&1 &
    guard=$!
    wait "$pid" || rc=$?
    pkill -P "$guard" 2> /dev/null || true; kill "$guard" 2> /dev/null || true
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    left=$(pgrep -f -- "$work/" || true)
    # shellcheck disable=SC2086
    [ -z "$left" ] || kill -KILL $left 2> /dev/null || true
    if [ $measure = 1 ]; then
      echo "RESULT | $case_name | $rc | $secs | latest=$(latest_of a)"
      exit 0
    fi
    [ -z "$left" ] || fail "processes left behind: $left"
    if [ "$case_name" = local_sigterm ]; then
      [ "$rc" = 3 ] || { cat run.log; fail "exit code $rc after SIGTERM, expected 3"; }
      [ "$(latest_of a)" = step_00000002.h5 ] || { cat run.log; fail "latest is $(latest_of a)"; }
    else
      if [ "$rc" = 0 ] || [ "$rc" = 3 ]; then cat run.log; fail "exit code $rc after two SIGINTs"; fi
      ! grep -q "exiting with status 3" run.log || fail "the second SIGINT still saved"
    fi
    log "exit code $rc in $secs s"
    ;;
  slurm_mpirun_sigterm)
    mkdir -p bin
    printf '#!/bin/sh\necho "scontrol $*" >> "%s/scontrol.log"\n' "$work" > bin/scontrol
    chmod +x bin/scontrol
    rc=0
    (cd "$work" && PATH="$work/bin:$(dirname "$(command -v "$mpiexec")"):$PATH" SLURM_JOB_ID=99 \
      SLURM_JOB_NAME=t SLURM_SUBMIT_DIR="$work" SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 \
      SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 SLURM_CPUS_PER_TASK=1 MESHTRAIN_LAUNCHER=mpirun \
      MPIRUN_FLAGS="${pre[*]}" MESHTRAIN_EXE="$exe" MESHTRAIN_TEST_WAIT_SIGNAL_AT_STEP=2 \
      exec bash "$src/jobs/slurm-cpu.sh" train "${model[@]}" --train.out_dir "$work/a" \
      --train.steps 6) > run.log 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q "waiting for a stop signal" run.log && break; sleep 0.1; done
    grep -q "waiting for a stop signal" run.log || { kill "$pid"; cat run.log; fail "never waited"; }
    t0=$(date +%s.%N)
    kill -TERM "$pid"
    wait "$pid" || rc=$?
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ $measure = 1 ]; then
      echo "RESULT | $case_name | $rc | $secs | latest=$(cat a/ckpt/latest 2> /dev/null || echo none)"
      exit 0
    fi
    [ "$rc" = 0 ] || { cat run.log; fail "job exit code $rc, expected 0 (requeued)"; }
    grep -q "SIGTERM forwarded as SIGUSR1 (mpirun)" run.log || { cat run.log; fail "not forwarded"; }
    grep -q "exiting with status 3" run.log || { cat run.log; fail "the ranks did not exit 3"; }
    grep -q "scontrol requeue 99" scontrol.log || fail "not requeued"
    [ "$(cat a/ckpt/latest)" = step_00000002.h5 ] || fail "latest is not step 2"
    log "job exit 0 (requeued) in $secs s"
    ;;
  *)
    fail "unknown case"
    ;;
esac
[ $measure = 1 ] || log "ok"
