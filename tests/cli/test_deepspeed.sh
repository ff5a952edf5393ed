#!/usr/bin/env bash
# --deepspeed and TensorBoard end to end (issue 37), one case per call:
#   test_deepspeed.sh CASE WORKDIR DATA_GLOB -- MPIEXEC NUMPROC_FLAG [PREFLAGS...] -- EXE
# Cases:
#   equivalent   a 2-rank run from tests/cli/deepspeed/tiny_zero1.json (batch 8 = 2 x 2 x dp 2,
#                AdamW, WarmupDecayLR, ZeRO-1, clipping, activation checkpointing) writes
#                TensorBoard events that tests/reference/read_tfevents.py (a reader of its own)
#                finds equal to metrics.jsonl; `meshtrain config` prints its INI, and
#                `train --config` of that INI trains the same losses, step for step
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
run() { timeout -s KILL 120 "$mpiexec" "$np_flag" 2 "${pre[@]}" "$exe" "$@"; }

model=(--model.n_layer 2 --model.n_embd 32 --model.n_head 2 --train.seq_len 32
       --train.sample_tokens 0 --train.save false --data.train "$data" --data.val "$data"
       --train.eval_every 2 --train.eval_batches 1 --train.steps 4 --ckpt.final false)
ds=$src/tests/cli/deepspeed/tiny_zero1.json

case $case_name in
  equivalent)
    run train --deepspeed "$ds" "${model[@]}" --train.out_dir "$work/a" \
      --train.tensorboard "$work/tb" > a.log 2>&1 || { cat a.log; fail "train --deepspeed"; }
    grep -q "global batch 8 = micro-batch 2 x accumulation 2 x dp" a.log ||
      { cat a.log; fail "the batch rule's result is not in the log"; }
    python3 "$src/tests/reference/read_tfevents.py" "$work/tb" --metrics a/metrics.jsonl ||
      fail "the TensorBoard events do not match the metrics"
    "$exe" config --deepspeed "$ds" --config.world 2 "${model[@]}" --train.out_dir "$work/b" \
      > equivalent.ini 2> config.log || { cat config.log; fail "meshtrain config"; }
    grep -q "lr_schedule = ds_warmup_decay" equivalent.ini || { cat equivalent.ini; fail "INI"; }
    run train --config equivalent.ini > b.log 2>&1 || { cat b.log; fail "train --config"; }
    python3 - a/metrics.jsonl b/metrics.jsonl <<'PY' || fail "the two runs' losses differ"
import json, sys
def losses(p):
    return [(r["step"], r["loss"], r["lr"]) for r in map(json.loads, open(p)) if "loss" in r]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == 4 and a == b, (a, b)
PY
    echo "--- equivalent: events match metrics; the printed INI trains the same 4 losses"
    ;;
  *)
    fail "unknown case"
    ;;
esac
