#!/usr/bin/env bash
# `meshtrain doctor` on runs made to show each finding of the seeds' table (issue 37):
#   test_doctor.sh CASE WORKDIR DATA_GLOB -- MPIEXEC NUMPROC_FLAG [PREFLAGS...] -- EXE
# Cases (tiny models, a few steps, oversubscribed ranks):
#   bubble     pp 4 with 2 micro-batches: 60 % bubble, 7 micro-batches halve it to 30 %
#   unhidden   dp 2 with dp.overlap false: the all-reduce is not hidden, and why
#   nan        data batch 3's gradients are NaN (MESHTRAIN_TEST_NAN_BATCH), train.on_nonfinite
#              skip: non-finite gradients at step 4, not an fp16 overflow
#   stall      rank 1 stops itself before dp all-reduce #3 (MESHTRAIN_TEST_COLLECTIVE), the
#              watchdog aborts the job: the hung collective waits for rank 1
#   cp         context parallelism 2 at 2 ranks: the run's layout (and the planner's) has cp,
#              and the gradients are reduced over dp x cp
# Every case also shows the memory headroom per rank and the measured against predicted step.
set -euo pipefail
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
rm -rf "$work"
mkdir -p "$work"
cd "$work"
fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }

base=(--model.n_embd 32 --model.n_head 2 --train.seq_len 32 --train.micro_batch 2
      --train.warmup 1 --train.sample_tokens 0 --train.save false --data.train "$data"
      --train.eval_every 0 --data.val "" --ckpt.final false --train.out_dir "$work/run")
# train N WANT_RC [VAR=VALUE...] -- ARGS...
train() {
  local n=$1 want=$2 rc=0 envs=()
  shift 2
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" timeout -s KILL 90 "$mpiexec" "$np_flag" "$n" "${pre[@]}" "$exe" train \
    "${base[@]}" "$@" > train.log 2>&1 || rc=$?
  [ "$rc" = "$want" ] || { cat train.log; fail "train exited $rc, expected $want"; }
}
# expect REGEX...: each must match the doctor's report
expect() {
  (cd "$src" && "$exe" doctor "$work/run") > doctor.log 2>&1 || { cat doctor.log; fail "doctor failed"; }
  cat doctor.log
  for re in "$@" "memory \[(ok|!)\]: (peak per rank of .*least headroom [0-9]+% on rank|rank 0 at step [0-9]+: .* \([0-9]+% free\))" \
            "step time \[(ok|!)\]: measured [0-9.]+ ms .*predicted [0-9.]+ ms by the planner"; do
    grep -Eq -- "$re" doctor.log || fail "the report does not match '$re'"
  done
}

case $case_name in
  bubble)
    train 4 0 -- --model.n_layer 4 --mesh.pp 4 --train.grad_accum 2 --train.steps 3
    expect "pipeline bubble \[!\]: 60% of each stage's step at pp 4 with 2 micro-batches" \
           "-> GPU utilisation swinging -> pipeline bubbles -> more micro-batches: 7 micro-batches \(train.grad_accum 7\) would halve it to 30%" \
           "memory \[ok\]: peak per rank of .*: rank 0 .*rank 1 .*rank 2 .*rank 3 .*least headroom [0-9]+% on rank"
    ;;
  unhidden)
    train 2 0 -- --model.n_layer 1 --dp.overlap false --train.steps 4
    expect "communication \[!\]: dp 2 \(gradient all-reduce, ZeRO-0\): [0-9.]+ ms per step, [0-9]% hidden" \
           "the dp all-reduce is not hidden: dp.overlap=false launches every bucket after backward" \
           "no speed-up with more GPUs -> data-parallel communication -> gradient compression"
    ;;
  nan)
    train 2 0 MESHTRAIN_TEST_NAN_BATCH=3 -- --model.n_layer 1 --train.steps 6 \
      --train.on_nonfinite skip
    expect "stability \[!\]: 6 steps logged; non-finite gradients at step 4 \(update skipped\)" \
           "not an fp16 overflow \(fp32\): the first non-finite step is 4"
    ;;
  stall)
    train 2 1 MESHTRAIN_TEST_COLLECTIVE=stall:1:dp:3 -- --model.n_layer 1 --train.steps 6 \
      --comm.timeout 3
    expect "hung collective \[!\]: 'dp' #3 all_reduce of [0-9]+ bytes waits on rank\(s\) 0; not arrived: rank 1 \(no flight dump" \
           "-> the job hung on rank 1" "memory \[ok\]: rank 0 at step 2: .*not recorded \(the run did not reach its end\)"
    ;;
  cp)
    train 2 0 -- --model.n_layer 1 --mesh.cp 2 --train.steps 3
    expect "run: 2 rank\(s\), dp 1 x cp 2 x pp 1 x tp 1, ZeRO-0" \
           "communication \[(ok|!)\]: dp 1 x cp 2 \(gradient all-reduce, ZeRO-0\)" \
           "planner: [0-9.]+ [KM]iB per rank of stage 0"
    ;;
  *)
    fail "unknown case"
    ;;
esac
echo "--- $case_name: ok"
