#!/usr/bin/env bash
# Checkpoints and restarts of the meshtrain executable (issue 8), one case per call:
#   test_resume.sh CASE WORKDIR DATA_GLOB -- LAUNCHER...      (LAUNCHER: mpiexec -n 2 ... meshtrain)
# Cases:
#   crash    rank 0 is SIGKILLed after writing step 4's .tmp (MESHTRAIN_TEST_CRASH_AT); the
#            restart with --train.resume latest continues from step 2 and ends with the loss of
#            an uninterrupted run
#   signal   one rank raises SIGUSR1 after step 3 (MESHTRAIN_TEST_SIGNAL_AT_STEP): every rank
#            agrees, saves step 3, exits 3; the resume (same layout, then another one) ends with
#            the uninterrupted run's loss
#   kill     a real `kill -USR1` of the ranks while rank 0 waits at step 3's boundary
#            (MESHTRAIN_TEST_WAIT_SIGNAL_AT_STEP makes the timing deterministic): exit 3, resume
#   errors   a flipped data byte, a truncated file, another model configuration: exit 2 with a
#            message naming the tensor, the file, the key
#   convert  meshtrain convert of `latest` into a HuggingFace folder that `generate` loads
#   convert_mixtral  the same for a Llama with MoE blocks at mesh.ep 2 (MixtralForCausalLM),
#            and train --model.init_from of it at ep 2 and ep 1 (same first loss), bad configs
#   convert_llama  a Llama (tp 2, kv heads split) exports itself at the end of training as a
#            sharded LlamaForCausalLM folder, and `convert` of its last checkpoint writes the
#            same files byte for byte; `generate` loads it greedily; tests/reference/
#            check_hf_folder.py (python3, json + struct) checks the index, headers and config
#   async_kill    (ckpt.async, the default) step 4's background write is held with its file
#            incomplete (MESHTRAIN_TEST_HOLD_CKPT_WRITE) while training goes on to step 5, where rank 0
#            waits; kill -9 of rank 1 then: `latest` stays on step 2, the resume continues it
#            to the uninterrupted run's loss
#   async_signal  the same held write, then kill -USR1 of the ranks at step 5: the write of step
#            4 commits, step 5 is saved once more, exit 3, and the resume matches
#   async_full_disk  step 4's background write goes to a full device (its .tmp is a link to
#            /dev/full): reported at a following step with the file and the cause, exit 1,
#            `latest` still step 2, nothing saved after it
#   async_fallback  an MPI without MPI_THREAD_MULTIPLE (MESHTRAIN_MPI_THREAD_LEVEL=funneled):
#            one warning, synchronous saves
# The launcher is the ctest MPI command line for 2 ranks; its last word is the executable.
# MESHTRAIN_TEST_ARGS adds options to every training run (GPU builds: --train.precision bf16,
# --zero.stage 3, ...); MESHTRAIN_TEST_LAYOUT_TOL is the relative loss tolerance of the resume
# under another layout (default 1e-5, fp32 rounding).
set -euo pipefail

case_name=$1 work=$2 data=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
shift 3
[ "$1" = -- ] && shift
launch=("$@")
exe=${launch[${#launch[@]}-1]}

rm -rf "$work"
mkdir -p "$work"
cd "$work"

fail() { echo "FAIL ($case_name): $*" >&2; exit 1; }
log() { echo "--- $*"; }

# A 2-layer model on the shipped corpus, no evaluation, export or sample; 8 steps of a global
# batch of 4 sequences (dp 2 x micro-batch 2) unless a case says otherwise.
model=(train --model.n_layer 2 --model.n_embd 32 --model.n_head 2 --train.seq_len 32
       --train.warmup 1 --train.eval_every 0 --data.train "$data" --data.val ""
       --train.sample_tokens 0 --train.save false)
read -r -a extra <<< "${MESHTRAIN_TEST_ARGS:-}"
model+=("${extra[@]}")
common=("${model[@]}" --train.steps 8 --train.micro_batch 2)

# run NAME EXPECTED_RC [ENV=VALUE...] -- ARGS...: output in NAME.log
run() {
  local name=$1 want=$2 rc=0
  shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "${launch[@]}" "$@" > "$name.log" 2>&1 || rc=$?
  if [ "$rc" != "$want" ]; then
    cat "$name.log"
    fail "$name: exit code $rc, expected $want"
  fi
  log "$name: exit code $rc as expected"
}

has() {  # FILE REGEX
  grep -Eq -- "$2" "$1" || { cat "$1"; fail "$1 does not match '$2'"; }
}

# The loss of step N in a metrics file (the last record of that step: a resumed run appends).
loss_at() {
  grep "\"step\": $2, \"loss\"" "$1" | tail -n 1 | sed 's/.*"loss": \([^,]*\),.*/\1/'
}

same_loss() {  # A B [relative tolerance]
  awk -v a="$1" -v b="$2" -v tol="${3:-0}" 'BEGIN {
    d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= tol * (b < 0 ? -b : b)) }' ||
    fail "final loss $1 differs from the uninterrupted run's $2 (tolerance ${3:-0})"
  log "final loss $1 = uninterrupted $2"
}

reference() {
  run ref 0 -- "${common[@]}" --train.out_dir ref --ckpt.final false
  ref_loss=$(loss_at ref/metrics.jsonl 8)
  [ -n "$ref_loss" ] || fail "no loss of step 8 in ref/metrics.jsonl"
  [ ! -e ref/checkpoints/latest ] || fail "ckpt.final false still saved a checkpoint"
}

case $case_name in
  crash)
    reference
    rc=0
    MESHTRAIN_TEST_CRASH_AT=checkpoint:4 "${launch[@]}" "${common[@]}" --train.out_dir a \
      --ckpt.every 2 > crash.log 2>&1 || rc=$?
    [ "$rc" != 0 ] || { cat crash.log; fail "the run survived its SIGKILL"; }
    log "crash: exit code $rc (rank 0 killed during the save of step 4)"
    [ -f a/checkpoints/step_00000004.h5.tmp ] || fail "no step 4 .tmp left by the crash"
    [ ! -e a/checkpoints/step_00000004.h5 ] || fail "step 4 was committed despite the crash"
    [ "$(cat a/checkpoints/latest)" = step_00000002.h5 ] || fail "latest is not step 2"
    run restart 0 -- "${common[@]}" --train.out_dir a --ckpt.every 2 --train.resume latest
    has restart.log "resumed from a/checkpoints/step_00000002.h5 after step 2"
    has restart.log "step +8/8"
    same_loss "$(loss_at a/metrics.jsonl 8)" "$ref_loss"
    [ ! -e a/checkpoints/step_00000004.h5.tmp ] || fail "the crashed save's .tmp was not removed"
    [ "$(cat a/checkpoints/latest)" = step_00000008.h5 ] || fail "latest is not step 8"
    ;;
  signal)
    reference
    run stop 3 MESHTRAIN_TEST_SIGNAL_AT_STEP=3 -- "${common[@]}" --train.out_dir a
    has stop.log "stop requested \(SIGUSR1/SIGTERM\) after step 3/8: checkpoint saved"
    has stop.log "exiting with status 3"
    [ "$(cat a/checkpoints/latest)" = step_00000003.h5 ] || fail "latest is not step 3"
    grep -q '"step": 3, .*"checkpoint": 1, "ckpt_ms": ' a/metrics.jsonl ||
      fail "the metrics do not mark step 3 as a checkpoint step"
    cp -r a b
    run resume 0 -- "${common[@]}" --train.out_dir a --train.resume latest
    has resume.log "resumed from a/checkpoints/step_00000003.h5 after step 3"
    has resume.log "step +8/8"
    same_loss "$(loss_at a/metrics.jsonl 8)" "$ref_loss"
    # Another layout: tensor instead of data parallelism (the same model to fp32 rounding).
    run resume_tp 0 -- "${model[@]}" --train.steps 8 --train.micro_batch 4 --train.out_dir b \
      --train.resume latest --mesh.tp 2
    has resume_tp.log "saved under dp 2 x pp 1 x tp 1, ZeRO 0"
    same_loss "$(loss_at b/metrics.jsonl 8)" "$ref_loss" "${MESHTRAIN_TEST_LAYOUT_TOL:-1e-5}"
    ;;
  kill)
    reference
    rc=0
    MESHTRAIN_TEST_WAIT_SIGNAL_AT_STEP=3 "${launch[@]}" "${common[@]}" --train.out_dir a \
      > kill.log 2>&1 &
    pid=$!
    for _ in $(seq 600); do
      grep -q "waiting for a stop signal after step 3" kill.log && break
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.1
    done
    grep -q "waiting for a stop signal after step 3" kill.log || {
      kill "$pid" 2> /dev/null || true; cat kill.log; fail "rank 0 never waited at step 3"; }
    # The ranks themselves, as a batch system's signal reaches them (whether a launcher forwards
    # SIGUSR1 is its own configuration: Open MPI's mpirun does by default, some builds do not).
    ranks=$(pgrep -P "$pid" || true)
    [ -n "$ranks" ] || { kill "$pid"; cat kill.log; fail "no rank processes under $pid"; }
    log "kill -USR1 of the ranks (pids $(echo "$ranks" | tr '\n' ' '))"
    # shellcheck disable=SC2086  # one pid per word
    kill -USR1 $ranks
    wait "$pid" || rc=$?
    [ "$rc" = 3 ] || { cat kill.log; fail "exit code $rc after kill -USR1, expected 3"; }
    has kill.log "stop requested \(SIGUSR1/SIGTERM\) after step 3/8: checkpoint saved"
    run resume 0 -- "${common[@]}" --train.out_dir a --train.resume latest
    has resume.log "resumed from a/checkpoints/step_00000003.h5 after step 3"
    same_loss "$(loss_at a/metrics.jsonl 8)" "$ref_loss"
    ;;
  async_kill | async_signal)
    reference
    rc=0
    MESHTRAIN_TEST_HOLD_CKPT_WRITE=4 MESHTRAIN_TEST_WAIT_SIGNAL_AT_STEP=5 "${launch[@]}" \
      "${common[@]}" --train.out_dir a --ckpt.every 2 > held.log 2>&1 &
    pid=$!
    for _ in $(seq 600); do
      grep -q "background write of step 4 held before its file is closed" held.log &&
        grep -q "waiting for a stop signal after step 5" held.log && break
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.1
    done
    if ! grep -q "waiting for a stop signal after step 5" held.log ||
       ! grep -q "background write of step 4 held" held.log; then
      kill "$pid" 2> /dev/null || true; cat held.log; fail "the run never held step 4's write"
    fi
    [ -f a/checkpoints/step_00000004.h5.tmp ] || fail "no step 4 .tmp while its write is held"
    ranks=$(pgrep -P "$pid" || true)
    [ -n "$ranks" ] || { kill "$pid"; cat held.log; fail "no rank processes under $pid"; }
    if [ "$case_name" = async_kill ]; then
      victim=$(echo "$ranks" | tail -n 1)
      log "kill -9 of rank pid $victim while step 4 is being written in the background"
      kill -9 "$victim"
      wait "$pid" || rc=$?
      [ "$rc" != 0 ] || { cat held.log; fail "the run survived the kill -9 of a rank"; }
      [ "$(cat a/checkpoints/latest)" = step_00000002.h5 ] ||
        fail "latest is $(cat a/checkpoints/latest), not step 2"
      [ ! -e a/checkpoints/step_00000004.h5 ] || fail "step 4 was committed despite the kill"
      run resume 0 -- "${common[@]}" --train.out_dir a --ckpt.every 2 --train.resume latest
      has resume.log "resumed from a/checkpoints/step_00000002.h5 after step 2"
    else
      log "kill -USR1 of the ranks while step 4 is being written in the background"
      # shellcheck disable=SC2086  # one pid per word
      kill -USR1 $ranks
      wait "$pid" || rc=$?
      [ "$rc" = 3 ] || { cat held.log; fail "exit code $rc after kill -USR1, expected 3"; }
      has held.log "saved checkpoint a/checkpoints/step_00000004.h5 \(step 4, written in the background"
      has held.log "stop requested \(SIGUSR1/SIGTERM\) after step 5/8: checkpoint saved"
      [ "$(cat a/checkpoints/latest)" = step_00000005.h5 ] || fail "latest is not step 5"
      run resume 0 -- "${common[@]}" --train.out_dir a --train.resume latest
      has resume.log "resumed from a/checkpoints/step_00000005.h5 after step 5"
    fi
    has resume.log "step +8/8"
    same_loss "$(loss_at a/metrics.jsonl 8)" "$ref_loss"
    ;;
  async_full_disk)
    run first 0 -- "${model[@]}" --train.micro_batch 2 --train.out_dir a --train.steps 2
    [ "$(cat a/checkpoints/latest)" = step_00000002.h5 ] || fail "latest is not step 2"
    ln -s /dev/full a/checkpoints/step_00000004.h5.tmp
    run full 1 -- "${common[@]}" --train.out_dir a --ckpt.every 2 --train.resume latest
    has full.log "checkpoint of step 4 staged in [0-9]+ ms; writing step_00000004.h5 in the background"
    has full.log "the checkpoint of step 4 could not be written in the background \(reported after step [56]\): .*step_00000004.h5.tmp': writing failed: .*(No space left on device|space)"
    has full.log "a/checkpoints/latest was not changed: it still names a/checkpoints/step_00000002.h5"
    ! grep -Eq "step +[78]/8" full.log || { cat full.log; fail "training went on after the failure"; }
    [ "$(cat a/checkpoints/latest)" = step_00000002.h5 ] || fail "latest is not step 2"
    if [ -e a/checkpoints/step_00000004.h5 ] || [ -e a/checkpoints/step_00000006.h5 ]; then
      fail "a checkpoint after the failed write was committed"
    fi
    ;;
  async_fallback)
    run fallback 0 MESHTRAIN_MPI_THREAD_LEVEL=funneled -- "${common[@]}" --train.out_dir a \
      --ckpt.every 4
    has fallback.log "ckpt.async=true needs MPI_THREAD_MULTIPLE and this MPI provides MPI_THREAD_FUNNELED: checkpoints are written synchronously"
    [ "$(grep -c "needs MPI_THREAD_MULTIPLE" fallback.log)" = 1 ] || fail "the warning is not once"
    has fallback.log "saved checkpoint a/checkpoints/step_00000004.h5 \(step 4, [0-9]+ ms\)"
    ! grep -q "in the background" fallback.log || fail "a background write without MULTIPLE"
    [ "$(cat a/checkpoints/latest)" = step_00000008.h5 ] || fail "latest is not step 8"
    ;;
  errors)
    run save 0 -- "${model[@]}" --train.micro_batch 2 --train.out_dir a --train.steps 2
    ckpt=a/checkpoints/step_00000002.h5
    [ -f "$ckpt" ] || fail "no final checkpoint $ckpt"
    # A flipped byte inside the data of /model/transformer.wpe.weight (its file offset from
    # h5dump's storage layout).
    cp "$ckpt" corrupt.h5
    off=$(h5dump -p -H -d /model/transformer.wpe.weight corrupt.h5 |
      sed -n 's/.*OFFSET \([0-9]*\).*/\1/p')
    [ -n "$off" ] || fail "h5dump did not report the data offset of wpe"
    byte=$(od -An -tu1 -j $((off + 100)) -N1 corrupt.h5 | tr -d ' ')
    printf '%b' "\\$(printf '%03o' $(((byte + 1) % 256)))" |
      dd of=corrupt.h5 bs=1 seek=$((off + 100)) conv=notrunc status=none
    run corrupt 2 -- "${common[@]}" --train.out_dir c --train.resume corrupt.h5
    has corrupt.log "corrupt.h5' is corrupt: the checksum of tensor /model/transformer.wpe.weight"
    # A truncated file (a crash or a full disk).
    cp "$ckpt" truncated.h5
    truncate -s $(($(stat -c %s "$ckpt") / 2)) truncated.h5
    run truncated 2 -- "${common[@]}" --train.out_dir c --train.resume truncated.h5
    has truncated.log "truncated.h5' cannot be read as an HDF5 file"
    # Another model.
    run other_model 2 -- "${common[@]}" --train.out_dir c --train.resume "$ckpt" \
      --model.block_size 64
    has other_model.log "was saved with model.block_size=128"
    # Nothing to resume from.
    run no_latest 2 -- "${common[@]}" --train.out_dir d --train.resume latest
    has no_latest.log "no checkpoint to resume from"
    ;;
  convert)
    run save 0 -- "${model[@]}" --train.micro_batch 2 --train.out_dir a --train.steps 2
    run convert 0 -- convert --convert.checkpoint latest --convert.dir a/checkpoints \
      --convert.out hf
    has convert.log "step_00000002.h5 \(step 2.*\(tokenizer byte\)"
    if [ ! -f hf/model.safetensors ] || [ ! -f hf/config.json ]; then
      fail "convert wrote no HF folder"
    fi
    "$exe" generate --generate.model hf --generate.tokens 10 > generate.log 2>&1 ||
      { cat generate.log; fail "generate could not load the converted model"; }
    has generate.log "^And God said"
    ;;
  convert_llama)
    llama=(train --model.preset llama-tiny --model.n_layer 2 --train.seq_len 32 --train.warmup 1
           --train.eval_every 0 --data.train "$data" --data.val "" --train.sample_tokens 0
           "${extra[@]}")
    run save 0 -- "${llama[@]}" --mesh.tp 2 --train.micro_batch 2 --train.steps 2 \
      --train.out_dir a --ckpt.every 2 --train.save_max_shard_mb 0.05
    has save.log "saved a/model \(HuggingFace LlamaForCausalLM, F32\)"
    [ -f a/model/model.safetensors.index.json ] || fail "train.save wrote no sharded folder"
    run convert 0 -- convert --convert.checkpoint latest --convert.dir a/checkpoints \
      --convert.out hf --convert.max_shard_mb 0.05
    has convert.log "step_00000002.h5 \(step 2.*LlamaForCausalLM in F32 \(tokenizer byte\)"
    n=0
    for f in a/model/*; do
      cmp "$f" "hf/$(basename "$f")" || fail "convert's $(basename "$f") differs from train.save's"
      n=$((n + 1))
    done
    [ "$n" -gt 4 ] || fail "only $n files in the exported folder"
    log "train.save and convert wrote the same $n files"
    if command -v python3 > /dev/null; then
      python3 "$here/../reference/check_hf_folder.py" hf > check.log 2>&1 ||
        { cat check.log; fail "check_hf_folder.py rejected the folder"; }
      has check.log "LlamaForCausalLM: .* tensors in [0-9]+ shards"
    fi
    "$exe" generate --generate.model hf --generate.tokens 10 --generate.temperature 0 \
      > generate.log 2>&1 || { cat generate.log; fail "generate could not load the Llama folder"; }
    has generate.log "^And God said"
    ;;
  convert_mixtral)
    # A Llama with MoE blocks (4 experts, top-2) trained at mesh.ep 2 exports itself as a
    # MixtralForCausalLM folder; convert of its checkpoint writes the same bytes; generate loads
    # it; train imports it at ep 2 and at ep 1 to the same first loss; a config.json whose
    # experts ep does not divide, or whose top-1 Mixtral routing meshtrain cannot compute, is
    # one message and exit 2 on every rank.
    mixtral=(--model.preset llama-tiny --model.n_layer 2 --moe.experts 4 --moe.ffn_hidden_size 32
             --train.seq_len 32 --train.warmup 1 --train.eval_every 0 --data.train "$data"
             --data.val "" --train.sample_tokens 0 "${extra[@]}")
    run save 0 -- train "${mixtral[@]}" --mesh.ep 2 --train.micro_batch 2 --train.steps 2 \
      --train.out_dir a --ckpt.every 2 --train.save_max_shard_mb 0.05
    has save.log "saved a/model \(HuggingFace MixtralForCausalLM, F32\)"
    [ -f a/model/model.safetensors.index.json ] || fail "train.save wrote no sharded folder"
    run convert 0 -- convert --convert.checkpoint latest --convert.dir a/checkpoints \
      --convert.out hf --convert.max_shard_mb 0.05
    has convert.log "step_00000002.h5 \(step 2.*MixtralForCausalLM in F32 \(tokenizer byte\)"
    for f in a/model/*; do
      cmp "$f" "hf/$(basename "$f")" || fail "convert's $(basename "$f") differs from train.save's"
    done
    grep -q '"model.layers.1.block_sparse_moe.experts.3.w2.weight"' hf/model.safetensors.index.json ||
      fail "the index has no block_sparse_moe expert tensors"
    if command -v python3 > /dev/null; then
      python3 "$here/../reference/check_hf_folder.py" hf > check.log 2>&1 ||
        { cat check.log; fail "check_hf_folder.py rejected the folder"; }
      has check.log "MixtralForCausalLM: 41 tensors in [0-9]+ shards"
    fi
    "$exe" generate --generate.model hf --generate.tokens 10 --generate.temperature 0 \
      > generate.log 2>&1 || { cat generate.log; fail "generate could not load the Mixtral folder"; }
    has generate.log "^And God said"
    from=(train --moe.router_fp64 true --train.seq_len 32 --train.warmup 1
          --train.eval_every 0 --data.train "$data" --data.val "" --train.sample_tokens 0
          --train.save false --train.micro_batch 2 --train.steps 1 "${extra[@]}")
    run import_ep2 0 -- "${from[@]}" --model.init_from hf --mesh.ep 2 --train.out_dir ep2
    run import_ep1 0 -- "${from[@]}" --model.init_from hf --train.out_dir ep1
    same_loss "$(loss_at ep2/metrics.jsonl 1)" "$(loss_at ep1/metrics.jsonl 1)" 1e-5
    cp -r hf hf3
    sed -i 's/"num_local_experts": 4/"num_local_experts": 3/' hf3/config.json
    run bad_ep 2 -- "${from[@]}" --model.init_from hf3 --mesh.ep 2 --train.out_dir bad
    has bad_ep.log "mesh.ep=2 does not divide num_local_experts=3 of hf3/config.json \(moe.experts\)"
    cp -r hf hf1
    sed -i 's/"num_experts_per_tok": 2/"num_experts_per_tok": 1/' hf1/config.json
    run bad_top1 2 -- "${from[@]}" --model.init_from hf1 --train.out_dir bad
    has bad_top1.log "hf1/config.json: num_experts_per_tok=1: Mixtral renormalises"
    ;;
  *)
    fail "unknown case"
    ;;
esac
log "ok"
