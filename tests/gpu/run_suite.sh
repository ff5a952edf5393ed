#!/usr/bin/env bash
# The GPU suite: every parallel layout through NCCL at 2-8 ranks on the GPUs of one node, with
# each rank its own emulated host (MESHTRAIN_EMULATE_HOSTS=1), so one GPU is enough. It proves
# the GPU and NCCL paths of each layout; its speeds mean nothing (sockets over loopback).
#   tests/gpu/run_suite.sh BIN_DIR OUT_DIR [CASE_REGEX]
# BIN_DIR holds meshtrain and the test executables (a jobs/bundle-gpu.sh bundle's bin/, or a
# cuda build folder: build/cuda, whose src/ and tests/ are searched). Each case runs with its own
# timeout (CASE_TIMEOUT, default 150 s; every case that passed so far took 95 s or less) and log
# (OUT_DIR/<case>.log); cases run side by side up to RANK_SLOTS ranks at once (default 14). The
# tiny models leave the GPU's arithmetic idle; the time goes to start-up and to the ranks taking
# turns on the GPU: the contexts of separate processes are time-sliced, and a collective's
# kernels wait for peers that run only in their own slices (a GPT-2 dp 2 x pp 2 x tp 2 step:
# 2.2 s). With the ranks' host threads blocking on the GPU instead of spinning (emulated hosts
# ask for blocking sync), 14 slots on a 16-core H200 node kept the load average at 10-18 and
# the GPU busy all along (2026-12-05, sixth run): the whole suite is about 6,100 rank-seconds,
# some 450 s of one call. One line per case goes to OUT_DIR/summary.txt:
#   PASS|FAIL  case  ranks  layout  precision  steps  max-rel-loss-diff  seconds  note
# Exit 0 when every case passed. Needs python3 (the comparisons) and h5dump-free tools only.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd); only=${3:-.}
slots=${RANK_SLOTS:-14}; case_timeout=${CASE_TIMEOUT:-150}
# Cases that train many runs each, run before all others and alone (side by side only with each
# other). The FP8 bit-identity tests train every layout twice per saving (test_fp8_fused_grad_amax:
# the fused amaxes and the kept weight scales, each on and off): alone on an H100 93-100 s at 2
# ranks and 45 s for fp8_kernels_1 (2026-12-06), but inside the whole suite, sharing the GPU and
# the CPUs with the other cases' ranks, they took 4-7x that: killed at 240 s, and on the second
# day at 420 s (fp8_kernels_1 passed in 325 s).
declare -A alone=([fp8_kernels_1]=1 [fp8_fused_grad_amax_2]=1)
declare -A min_timeout=([fp8_kernels_1]=240 [fp8_fused_grad_amax_2]=240)
# No case starts after SUITE_BUDGET seconds (default 530): those left are reported NOTRUN, so
# the summary comes back whole from a device call of limited length (10 minutes).
budget=${SUITE_BUDGET:-530}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 NCCL_NVLS_ENABLE=0
# SUITE_EMULATE=0 runs the cases without emulated hosts: a dry run of this script on a CPU build.
export MESHTRAIN_EMULATE_HOSTS=${SUITE_EMULATE:-1}
export MESHTRAIN_SOURCE_DIR=$here PYTHONUNBUFFERED=1
exe() {  # NAME: the executable, wherever BIN_DIR keeps it
  local f
  for f in "$bin/$1" "$bin/src/$1" "$bin/tests/$1" "$bin/perf/bench/$1"; do
    [ -x "$f" ] && { echo "$f"; return; }
  done
  echo "missing:$1"
}
mt=$(exe meshtrain)
summary=$out/summary.txt
: > "$summary"
: > "$out/timeline.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1

# ---- data: the shipped corpus as byte tokens ----
data=$out/data/kjv
if [ ! -e "${data}_train_000000.bin" ] && [ "${SUITE_LIST:-0}" != 1 ]; then
  "$mt" prep --prep.input "$here/inputs/kjv.txt" --prep.output "$data" --prep.tokenizer byte \
    > "$out/prep.log" 2>&1 || { echo "prep failed"; cat "$out/prep.log"; exit 1; }
fi
train_data=("--data.train" "${data}_train_*.bin" "--data.val" "")

# ---- the scheduler: a case is a function run in the background with its ranks counted ----
declare -A case_ranks=()
order=()
add() { order+=("$1"); case_ranks[$1]=$2; }  # NAME RANKS (the function case_NAME runs it)
running=0
declare -A pid_of=()
reap() {  # wait for one case to end
  local n
  wait -n 2> /dev/null || true
  for n in "${!pid_of[@]}"; do
    if ! kill -0 "${pid_of[$n]}" 2> /dev/null; then
      wait "${pid_of[$n]}" 2> /dev/null
      running=$((running - case_ranks[$n]))
      unset "pid_of[$n]"
    fi
  done
}
launch() {
  local n=$1 r=${case_ranks[$1]}
  while [ $((running + r)) -gt "$slots" ] && [ "$running" -gt 0 ]; do reap; done
  running=$((running + r))
  local limit=$case_timeout
  [ "${min_timeout[$n]:-0}" -gt "$limit" ] && limit=${min_timeout[$n]}
  ( local t0=$SECONDS
    # The case in a shell of its own (timeout kills its whole process group): this script's
    # variables and functions passed in.
    CASE=$n timeout -s KILL "$limit" bash -c \
      "$(declare -p here bin out slots case_timeout mt data train_data gpt2 gpt2l4 llama moe); $(declare -f); case_$n" \
      > "$out/$n.log" 2>&1
    local rc=$?
    local note=""
    [ $rc = 137 ] && note="killed after ${limit} s"
    if [ -e "$out/$n.result" ]; then
      read -r verdict rest < "$out/$n.result"
      [ $rc = 0 ] || verdict=FAIL
    else
      verdict=FAIL rest="- - - - exit $rc"
    fi
    printf '%-4s %-28s %s %s %ss %s\n' "$verdict" "$n" "$r" "$rest" $((SECONDS - t0)) "$note" \
      >> "$summary"
    echo "$n ranks $r started +$((t0 - t_start))s ended +$((SECONDS - t_start))s" >> "$out/timeline.txt" ) &
  pid_of[$n]=$!
}

# result VERDICT LAYOUT PRECISION STEPS DIFF: what the case writes for the summary.
result() { echo "$*" > "$out/$CASE.result"; }
run_np() {  # N ARGS...: mpirun of N ranks, each its own emulated host
  local n=$1; shift
  mpirun -np "$n" --bind-to none -x MESHTRAIN_EMULATE_HOSTS -x MESHTRAIN_TEST_COMM_TIMEOUT \
    -x MESHTRAIN_TEST_FLIGHT_DIR "$@"
}
# The tests' collective watchdog (tests/harness_main.cpp): a hang in a collective ends the case
# with the operation named and flight dumps in OUT/flight_<case>, well before the case timeout.
export MESHTRAIN_TEST_COMM_TIMEOUT=${TEST_COMM_TIMEOUT:-60}
# A Catch2 executable at N ranks: PASS when every rank passed.
catch2() {  # NAME N [ARGS...]
  local t=$1 n=$2; shift 2
  export MESHTRAIN_TEST_FLIGHT_DIR=$out/flight_$CASE
  mkdir -p "$MESHTRAIN_TEST_FLIGHT_DIR"
  run_np "$n" "$(exe "$t")" --durations yes "$@"
  local rc=$?
  local line
  line=$(sed 's/\x1b\[[0-9;]*m//g' "$out/$CASE.log" | grep -E "All tests passed|test cases:" | tail -1 |
         tr -s ' ' | cut -c1-60)
  if [ $rc = 0 ]; then result PASS "$t" - - - "${line// /_}"; else result FAIL "$t" - - - "exit_$rc"; fi
}
# losses REF RUN TOL: the worst relative difference of RUN's losses against REF's (metrics JSON
# lines), PASS when <= TOL and both have every step.
compare() {  # REF RUN TOL LAYOUT PRECISION
  python3 - "$@" <<'PY' > "$out/$CASE.result"
import json, sys
ref, run, tol, layout, prec = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
def losses(f):
    try:
        return [r["loss"] for r in map(json.loads, open(f)) if "loss" in r and "step" in r]
    except OSError:
        return []
a, b = losses(ref), losses(run)
n = min(len(a), len(b))
worst = max((abs(x - y) / abs(x) for x, y in zip(a[:n], b[:n])), default=float("inf"))
ok = n > 0 and len(a) == len(b) and worst <= tol
print("PASS" if ok else "FAIL", layout, prec, f"{n}/{len(a)}", f"{worst:.2e}", f"tol_{tol:g}")
PY
}
wait_for() {  # FILE: a reference run of another case (up to the case timeout)
  local i
  for ((i = 0; i < case_timeout; i += 2)); do [ -e "$1.done" ] && return 0; sleep 2; done
  return 1
}

# ---- Catch2 suites through NCCL (the CPU suite's layout matrices, on the GPU) ----
case_comm_2() { catch2 test_communicator 2; }
case_comm_4() { catch2 test_communicator 4; }
case_all_to_all_4() { catch2 test_all_to_all 4; }
case_pipeline_runner_2() { catch2 test_pipeline_runner 2; }
case_pipeline_runner_4() { catch2 test_pipeline_runner 4; }
case_dp_pipeline_4() { catch2 test_dp_pipeline 4; }
case_dp_training_2() { catch2 test_dp_training 2; }
case_dp_training_4() { catch2 test_dp_training 4; }
case_tensor_parallel_2() { catch2 test_tensor_parallel 2; }
case_tensor_parallel_4() { catch2 test_tensor_parallel 4; }
case_layouts_2() { catch2 test_layouts 2; }
case_layouts_4() { catch2 test_layouts 4; }
case_layouts_8() { catch2 test_layouts 8; }
case_moe_layouts_2() { catch2 test_moe_layouts 2; }
case_moe_layouts_4() { catch2 test_moe_layouts 4; }
case_moe_layouts_8() { catch2 test_moe_layouts 8; }
case_resume_8() { catch2 test_resume 8; }
case_moe_resume_8() { catch2 test_moe_resume 8; }
case_hf_export_2() { catch2 test_hf_export 2; }
case_hf_export_4() { catch2 test_hf_export 4; }
case_ring_attention_2() { catch2 test_ring_attention 2; }
case_ring_attention_4() { catch2 test_ring_attention 4; }
case_cp_layouts_2() { catch2 test_cp_layouts 2; }
case_cp_layouts_4() { catch2 test_cp_layouts 4; }
# FP8 groundwork (issue 35): the codec, casts and emulated GEMMs in device kernels at one rank,
# and cuBLASLt's FP8 matmul against the emulation (test_kernels_gemm_fp8 requires cuBLASLt for
# the tensorwise TN forms; its WARN lines give the largest error over sum|terms| and which path
# the rowwise cases took); the amax agreement over NCCL at 2.
case_fp8_kernels_1() {
  local t rc=0
  # With the kernels whose fused FP8 amax the kept inputs and the MLP backward use (norms,
  # GELU, SwiGLU: their CUDA and packed bf16 paths), the kept inputs against recomputation and
  # the fused backward amaxes and the kept weight scales against neither; the weight scale kept
  # and the residual as the GEMM's C (test_kernels_linear_fp8_fused) with cuBLASLt.
  for t in test_kernels_fp8_format test_kernels_fp8_cast test_kernels_gemm_fp8 \
           test_kernels_linear_fp8 test_kernels_linear_fp8_fused test_fp8_linears \
           test_fp8_layouts test_kernels_rmsnorm \
           test_kernels_layernorm test_kernels_swiglu test_kernels_pointwise test_fp8_kept_inputs \
           test_fp8_fused_grad_amax; do
    "$(exe "$t")" --durations yes || rc=$?
  done
  if [ $rc = 0 ]; then result PASS fp8_kernels - - - -; else result FAIL fp8_kernels - - - "exit_$rc"; fi
}
case_fp8_amax_2() { catch2 test_fp8_amax 2; }
# Kernels outside FP8 whose CUDA path differs from the host's: the embedding backward's sorted
# segments (CUB's radix sort on the stream) against host sums.
case_kernels_1() { catch2 test_kernels_embedding 1; }
# FP8 linears (issue 35): the tp agreement GEMM by GEMM (test_fp8_linears) and the Trainer's
# FP8 layouts against one rank (test_fp8_layouts: dp 2 ZeRO-1, pp 2, tp 2 with and without sp,
# rowwise, cp 2; at 4 ranks tp x dp, tp x pp, tp x cp) over NCCL, with cuBLASLt's FP8 GEMM.
case_fp8_linears_2() { catch2 test_fp8_linears 2; }
case_fp8_linears_4() { catch2 test_fp8_linears 4; }
case_fp8_layouts_2() { catch2 test_fp8_layouts 2; }
case_fp8_layouts_4() { catch2 test_fp8_layouts 4; }
# The MLP backward's fused amaxes and the kept weight scales against neither, bit for bit,
# under tp (with sp) and cp.
case_fp8_fused_grad_amax_2() { catch2 test_fp8_fused_grad_amax 2; }
# The collectives and the pipeline runner always; the CPU suite's layout matrices (hundreds of
# NCCL communicators and steps: ~10 minutes each at 8 ranks on one GPU) with SUITE_MATRICES=1.
for c in comm_2 pipeline_runner_2; do add "$c" 2; done
add all_to_all_4 4
add ring_attention_2 2
add fp8_kernels_1 1
add kernels_1 1
add fp8_amax_2 2
add fp8_linears_2 2
add fp8_linears_4 4
add fp8_fused_grad_amax_2 2
if [ "${SUITE_MATRICES:-0}" = 1 ]; then
  # test_fp8_layouts trains ~20 layouts, each with its own NCCL communicators: more than 120 s
  # at 2 ranks on one GPU (2026-12-05); its layouts run below as meshtrain train cases.
  add fp8_layouts_2 2
  add fp8_layouts_4 4
  for c in comm_4 hf_export_2 dp_training_2 tensor_parallel_2 layouts_2 moe_layouts_2 \
           cp_layouts_2; do add "$c" 2; done
  for c in pipeline_runner_4 dp_pipeline_4 dp_training_4 tensor_parallel_4 layouts_4 \
           moe_layouts_4 hf_export_4 ring_attention_4 cp_layouts_4; do add "$c" 4; done
  for c in layouts_8 moe_layouts_8 resume_8 moe_resume_8; do add "$c" 8; done
fi

# ---- meshtrain train at GPT-2 / Llama shapes: every layout against the 1-rank GPU run ----
# comm.timeout 60: a hang ends in the watchdog's named error well inside the case timeout.
# GPT-2 with 2 blocks (one per stage at pp 2: every layout's code path, half the per-block
# collectives and kernels of 4, which the ranks' turns on the one GPU make the cost of a step);
# 4 blocks for pp 4 and the interleaved schedule (2 chunks of 2 stages), with their own reference.
gpt2_base=(--model.preset gpt2-124m --train.seq_len 256 --comm.timeout 60
           --train.log_every 1 --train.eval_every 0 --train.sample_tokens 0
           --ckpt.final false --train.lr 6e-4 --train.warmup 5 "${train_data[@]}")
gpt2=("${gpt2_base[@]}" --model.n_layer 2)
gpt2l4=("${gpt2_base[@]}" --model.n_layer 4)
llama=(--model.preset llama-150m --model.n_layer 2 --train.seq_len 256 --comm.timeout 60
       --train.log_every 1 --train.eval_every 0 --train.sample_tokens 0
       --ckpt.final false --train.lr 6e-4 --train.warmup 5 "${train_data[@]}")
# train NAME N MODEL PRECISION ARGS...: one run of 10 steps, metrics in OUT/NAME.jsonl
train_run() {
  local name=$1 n=$2 model=$3 prec=$4; shift 4
  local -n m=$model
  run_np "$n" "$mt" train "${m[@]}" --train.steps 10 --train.save false --train.precision "$prec" \
    --train.out_dir "$out/run_$name" --train.metrics "$out/$name.jsonl" "$@"
  local rc=$?
  touch "$out/$name.jsonl.done"
  return $rc
}
# A reference (1 rank) and the layouts compared with it. Global batch 16 sequences throughout.
for prec in fp32 bf16; do
  tol=1e-5; [ $prec = bf16 ] && tol=2e-3
  for model in gpt2 gpt2l4; do
    eval "case_${model}_ref_$prec() { train_run ${model}_ref_$prec 1 $model $prec --train.micro_batch 8 --train.grad_accum 2 && result PASS reference $prec 10 0 ; }"
    add "${model}_ref_$prec" 1
  done
  while read -r name model n args; do
    eval "case_gpt2_${name}_$prec() { wait_for $out/${model}_ref_$prec.jsonl; train_run gpt2_${name}_$prec $n $model $prec $args; compare $out/${model}_ref_$prec.jsonl $out/gpt2_${name}_$prec.jsonl $tol $name $prec; }"
    add "gpt2_${name}_$prec" "$n"
  done <<EOF
dp2 gpt2 2 --mesh.dp 2 --train.micro_batch 8 --train.grad_accum 1
dp2_zero1 gpt2 2 --mesh.dp 2 --zero.stage 1 --train.micro_batch 8 --train.grad_accum 1
dp2_zero2 gpt2 2 --mesh.dp 2 --zero.stage 2 --train.micro_batch 4 --train.grad_accum 2
dp2_zero3 gpt2 2 --mesh.dp 2 --zero.stage 3 --train.micro_batch 8 --train.grad_accum 1
dp2_zero1_offload gpt2 2 --mesh.dp 2 --zero.stage 1 --zero.offload_optimizer cpu --train.micro_batch 8 --train.grad_accum 1
tp2 gpt2 2 --mesh.tp 2 --train.micro_batch 8 --train.grad_accum 2
tp2_sp gpt2 2 --mesh.tp 2 --tp.sequence_parallel --train.micro_batch 8 --train.grad_accum 2
tp4_sp gpt2 4 --mesh.tp 4 --tp.sequence_parallel --train.micro_batch 8 --train.grad_accum 2
pp2_1f1b gpt2 2 --mesh.pp 2 --pp.schedule 1f1b --train.micro_batch 4 --train.grad_accum 4
pp2_gpipe gpt2 2 --mesh.pp 2 --pp.schedule gpipe --train.micro_batch 8 --train.grad_accum 2
pp2_interleaved gpt2l4 2 --mesh.pp 2 --pp.schedule interleaved --pp.virtual_chunks 2 --train.micro_batch 4 --train.grad_accum 4
pp4_1f1b gpt2l4 4 --mesh.pp 4 --train.micro_batch 2 --train.grad_accum 8
3d_8 gpt2 8 --mesh.dp 2 --mesh.pp 2 --mesh.tp 2 --tp.sequence_parallel --zero.stage 1 --train.micro_batch 4 --train.grad_accum 2
cp2 gpt2 2 --mesh.cp 2 --train.micro_batch 8 --train.grad_accum 2
cp4 gpt2 4 --mesh.cp 4 --train.micro_batch 8 --train.grad_accum 2
cp2_allgather gpt2 2 --mesh.cp 2 --cp.comm all_gather --train.micro_batch 8 --train.grad_accum 2
cp2_tp2_sp gpt2 4 --mesh.cp 2 --mesh.tp 2 --tp.sequence_parallel --train.micro_batch 8 --train.grad_accum 2
cp2_pp2_dp2_zero1 gpt2 8 --mesh.cp 2 --mesh.pp 2 --mesh.dp 2 --zero.stage 1 --train.micro_batch 4 --train.grad_accum 2
EOF
done
for prec in fp32 bf16; do
  tol=1e-5; [ $prec = bf16 ] && tol=2e-3
  # llama-150m has 4 kv heads: tp 2 splits them; with 2 kv heads, tp 4 replicates them.
  eval "case_llama_ref_$prec() { train_run llama_ref_$prec 1 llama $prec --train.micro_batch 8 --train.grad_accum 2 && result PASS reference $prec 10 0; }"
  eval "case_llama_kv2_ref_$prec() { train_run llama_kv2_ref_$prec 1 llama $prec --model.n_kv_head 2 --train.micro_batch 8 --train.grad_accum 2 && result PASS reference $prec 10 0; }"
  add "llama_ref_$prec" 1
  add "llama_kv2_ref_$prec" 1
  while read -r name ref n args; do
    eval "case_llama_${name}_$prec() { wait_for $out/${ref}_$prec.jsonl; train_run llama_${name}_$prec $n llama $prec $args; compare $out/${ref}_$prec.jsonl $out/llama_${name}_$prec.jsonl $tol $name $prec; }"
    add "llama_${name}_$prec" "$n"
  done <<EOF
tp2_kv_split llama_ref 2 --mesh.tp 2 --train.micro_batch 8 --train.grad_accum 2
tp4_kv_replicated llama_kv2_ref 4 --model.n_kv_head 2 --mesh.tp 4 --tp.sequence_parallel --train.micro_batch 8 --train.grad_accum 2
pp2_dp2_zero3 llama_ref 4 --mesh.pp 2 --mesh.dp 2 --zero.stage 3 --train.micro_batch 4 --train.grad_accum 2
tp2_dp2_zero3 llama_ref 4 --mesh.tp 2 --mesh.dp 2 --zero.stage 3 --train.micro_batch 4 --train.grad_accum 2
cp2 llama_ref 2 --mesh.cp 2 --train.micro_batch 8 --train.grad_accum 2
cp4_dp1 llama_ref 4 --mesh.cp 4 --train.micro_batch 8 --train.grad_accum 2
cp2_tp2_kv_split llama_ref 4 --mesh.cp 2 --mesh.tp 2 --train.micro_batch 8 --train.grad_accum 2
EOF
done

# ---- train.precision fp8 (issue 35): the bf16 model with FP8 linears (cuBLASLt) ----
# The 1-rank fp8 run against the 1-rank bf16 run (2e-2: FP8 rounding of every block's linears;
# the CPU's tiny models move by 2.3e-4, a 124M model at seq 256 is to be measured here first),
# and layouts against the 1-rank fp8 run with equal micro-batches (a tensorwise scale is a
# micro-batch's) at 5e-3: bf16's 2e-3 plus values that cross an FP8 rounding boundary through
# fp32/bf16 reduction-order differences (test_fp8_layouts); rowwise at tp 2 with sp.
for model in gpt2 llama; do
  eval "case_${model}_ref_fp8() { train_run ${model}_ref_fp8 1 $model fp8 --train.micro_batch 8 --train.grad_accum 2 && result PASS reference fp8 10 0; }"
  eval "case_${model}_ref_fp8_rowwise() { train_run ${model}_ref_fp8_rowwise 1 $model fp8 --fp8.recipe rowwise --train.micro_batch 8 --train.grad_accum 2 && result PASS reference fp8 10 0; }"
  eval "case_${model}_fp8_vs_bf16() { wait_for $out/${model}_ref_fp8.jsonl; wait_for $out/${model}_ref_bf16.jsonl; compare $out/${model}_ref_bf16.jsonl $out/${model}_ref_fp8.jsonl 2e-2 fp8_vs_bf16 fp8; }"
  add "${model}_ref_fp8" 1
  add "${model}_ref_fp8_rowwise" 1
  add "${model}_fp8_vs_bf16" 1
  while read -r name ref n args; do
    eval "case_${model}_${name}_fp8() { wait_for $out/${model}_${ref}.jsonl; train_run ${model}_${name}_fp8 $n $model fp8 $args; compare $out/${model}_${ref}.jsonl $out/${model}_${name}_fp8.jsonl 5e-3 $name fp8; }"
    add "${model}_${name}_fp8" "$n"
  done <<EOF
dp2_zero1 ref_fp8 2 --mesh.dp 2 --zero.stage 1 --train.micro_batch 8 --train.grad_accum 1
tp2 ref_fp8 2 --mesh.tp 2 --train.micro_batch 8 --train.grad_accum 2
tp2_sp ref_fp8 2 --mesh.tp 2 --tp.sequence_parallel --train.micro_batch 8 --train.grad_accum 2
pp2_1f1b ref_fp8 2 --mesh.pp 2 --pp.schedule 1f1b --train.micro_batch 8 --train.grad_accum 2
tp2_dp2_zero1_sp ref_fp8 4 --mesh.tp 2 --mesh.dp 2 --zero.stage 1 --tp.sequence_parallel --train.micro_batch 8 --train.grad_accum 1
tp2_sp_rowwise ref_fp8_rowwise 2 --fp8.recipe rowwise --mesh.tp 2 --tp.sequence_parallel --train.micro_batch 8 --train.grad_accum 2
cp2 ref_fp8 2 --mesh.cp 2 --train.micro_batch 8 --train.grad_accum 2
EOF
done

# ---- MoE over NCCL all-to-all: ep 2/4/8, ep x dp, ep x tp against ep 1 (global balancing) ----
moe=(--model.preset demo --moe.experts 8 --moe.top_k 2 --moe.router_fp64 true --train.seq_len 128 --comm.timeout 60
     --train.log_every 1 --train.eval_every 0 --train.sample_tokens 0 --ckpt.final false --train.lr 6e-4 --train.warmup 2 "${train_data[@]}")
case_moe_ref() { train_run moe_ref 1 moe fp32 --train.micro_batch 8 && result PASS reference fp32 10 0; }
add moe_ref 1
while read -r name n args; do
  eval "case_moe_$name() { wait_for $out/moe_ref.jsonl; train_run moe_$name $n moe fp32 $args; compare $out/moe_ref.jsonl $out/moe_$name.jsonl 1e-5 $name fp32; }"
  add "moe_$name" "$n"
done <<EOF
ep2 2 --mesh.ep 2 --train.micro_batch 4
ep4 4 --mesh.ep 4 --train.micro_batch 2
ep8 8 --mesh.ep 8 --train.micro_batch 1
ep2_dp4_zero2 4 --mesh.ep 2 --zero.stage 2 --train.micro_batch 2
ep2_tp2 4 --mesh.ep 2 --mesh.tp 2 --train.micro_batch 4
EOF
# FP8 experts (fp8.experts: rowwise per token, moe/grouped_gemm.hpp): ep 2 x dp 2 against the 1-rank fp8 run
# with the same micro-batches (the attention linears' tensorwise scales are a micro-batch's), at
# the dense fp8 layouts' 5e-3.
case_moe_ref_fp8() { train_run moe_ref_fp8 1 moe fp8 --fp8.experts true --train.micro_batch 4 --train.grad_accum 2 && result PASS reference fp8 10 0; }
add moe_ref_fp8 1
case_moe_ep2_fp8() {
  wait_for "$out/moe_ref_fp8.jsonl"
  train_run moe_ep2_fp8 2 moe fp8 --fp8.experts true --mesh.ep 2 --train.micro_batch 4
  compare "$out/moe_ref_fp8.jsonl" "$out/moe_ep2_fp8.jsonl" 5e-3 ep2 fp8
}
add moe_ep2_fp8 2

# ---- a checkpoint written at 4 ranks, restored at 2, continuing as the uninterrupted run ----
reshard() {  # NAME MODEL ARGS4 -- ARGS2
  local name=$1 model=$2; shift 2
  local a4=() a2=() seen=0 x
  for x in "$@"; do if [ "$x" = -- ]; then seen=1; continue; fi
    if [ $seen = 0 ]; then a4+=("$x"); else a2+=("$x"); fi; done
  local -n m=$model
  run_np 4 "$mt" train "${m[@]}" --train.steps 10 --train.save false --train.precision fp32 "${a4[@]}" --train.out_dir "$out/run_$name" \
    --ckpt.every 5 --ckpt.dir "$out/run_$name/ckpt" --train.metrics "$out/${name}_full.jsonl" || return 1
  run_np 2 "$mt" train "${m[@]}" --train.steps 10 --train.save false --train.precision fp32 "${a2[@]}" --train.out_dir "$out/run_${name}_2" \
    --train.resume "$out/run_$name/ckpt/step_00000005.h5" --ckpt.dir "$out/run_${name}_2/ckpt" \
    --train.metrics "$out/${name}_resumed.jsonl" || return 1
  # The resumed run's steps 6-10 against the uninterrupted run's.
  python3 - "$out/${name}_full.jsonl" "$out/${name}_resumed.jsonl" > "$out/$name.tail.jsonl" <<'PY'
import json, sys
full = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r and "step" in r]
res = {r["step"] for r in map(json.loads, open(sys.argv[2])) if "loss" in r and "step" in r}
for r in full:
    if r["step"] in res: print(json.dumps(r))
PY
  compare "$out/$name.tail.jsonl" "$out/${name}_resumed.jsonl" 1e-5 "4->2_ranks" fp32
}
case_reshard_llama() { reshard reshard_llama llama --mesh.dp 2 --mesh.tp 2 --zero.stage 1 \
  --train.micro_batch 4 --train.grad_accum 2 -- --mesh.tp 2 --train.micro_batch 8 --train.grad_accum 2; }
case_reshard_moe() { reshard reshard_moe moe --mesh.ep 4 --zero.stage 3 --train.micro_batch 1 \
  --train.grad_accum 2 -- --mesh.ep 2 --train.micro_batch 2 --train.grad_accum 2; }
add reshard_llama 4
add reshard_moe 4

# ---- the HF export of a checkpoint under tp 2 is the 1-rank export, byte for byte ----
case_export_tp2() {
  run_np 1 "$mt" train "${llama[@]}" --train.steps 2 --train.save false --ckpt.every 2 --train.out_dir "$out/run_export" \
    --ckpt.dir "$out/run_export/ckpt" --train.micro_batch 4 > /dev/null || return 1
  local ck=$out/run_export/ckpt/step_00000002.h5 n
  for n in 1 2; do
    local tp=(); [ $n = 2 ] && tp=(--mesh.tp 2)
    run_np "$n" "$mt" train "${llama[@]}" "${tp[@]}" --train.steps 2 --train.resume "$ck" \
      --train.save true --train.micro_batch 4 --train.out_dir "$out/run_export_$n" \
      --ckpt.dir "$out/run_export_$n/ckpt" || return 1
  done
  if cmp "$out/run_export_1/model/model.safetensors" "$out/run_export_2/model/model.safetensors"; then
    result PASS export_tp2 fp32 2 0
  else
    result FAIL export_tp2 fp32 2 differ
  fi
}
add export_tp2 2

# ---- the watchdog over NCCL, and a rank killed mid-step ----
case_watchdog_stall() {
  BOUND=120 bash "$here/tests/cli/test_failures.sh" watchdog_stall "$out/work_stall" \
    "${data}_train_*.bin" -- mpirun -np --bind-to none -x MESHTRAIN_EMULATE_HOSTS -- "$mt" &&
    result PASS stall_dp_allreduce fp32 - -
}
case_watchdog_skip() {
  BOUND=120 bash "$here/tests/cli/test_failures.sh" watchdog_skip "$out/work_skip" \
    "${data}_train_*.bin" -- mpirun -np --bind-to none -x MESHTRAIN_EMULATE_HOSTS -- "$mt" &&
    result PASS skip_dp_allreduce fp32 - -
}
case_rank_killed() {
  local log=$out/rank_killed.train.log t0 pid victim
  run_np 2 "$mt" train "${gpt2[@]}" --mesh.dp 2 --train.steps 1000 --train.save false --train.micro_batch 8 \
    --train.out_dir "$out/run_killed" > "$log" 2>&1 &
  pid=$!
  for ((t0 = 0; t0 < 120; t0++)); do grep -q "step *3/" "$log" && break; sleep 1; done
  victim=$(pgrep -f "^$mt train .*run_killed" | tail -1)
  kill -KILL "$victim"
  t0=$SECONDS
  wait "$pid"; local rc=$?
  sleep 1
  local left; left=$(pgrep -f -- "--train.out_dir $out/run_killed" || true)
  if [ "$rc" != 0 ] && [ -z "$left" ]; then
    result PASS "rank_killed_exit_$rc" fp32 - "gone_in_$((SECONDS - t0))s"
  else
    result FAIL "rank_killed_exit_$rc" fp32 - "left:${left//$'\n'/,}"
  fi
}
add watchdog_stall 2
add watchdog_skip 2
add rank_killed 2

# ---- run the selected cases: references first (others wait for them), then the largest ----
# Seconds each case took at 14 slots on the H200 (perf/archive/gpu-suite/sixth_run, 2026-12-05;
# cases that did not start there: the earlier runs' figure x 1.17, that run's mean ratio; the
# two FP8 bit-identity cases, which run alone first: their time alone on the H100, 2026-12-06).
# Cases start in order of ranks x seconds, largest first, so the 8-rank cases do not end up
# alone at the tail; an unlisted case counts 20 s.
declare -A est=(
  [all_to_all_4]=32 [comm_2]=77 [export_tp2]=21 [fp8_amax_2]=4 [fp8_fused_grad_amax_2]=100
  [fp8_kernels_1]=45
  [fp8_layouts_2]=70 [fp8_layouts_4]=234 [fp8_linears_2]=4 [fp8_linears_4]=5 [gpt2_3d_8_bf16]=35
  [gpt2_3d_8_fp32]=30 [gpt2_cp2_allgather_bf16]=12 [gpt2_cp2_allgather_fp32]=13 [gpt2_cp2_bf16]=13
  [gpt2_cp2_fp32]=12 [gpt2_cp2_pp2_dp2_zero1_bf16]=35 [gpt2_cp2_pp2_dp2_zero1_fp32]=44
  [gpt2_cp2_tp2_sp_bf16]=31 [gpt2_cp2_tp2_sp_fp32]=27 [gpt2_cp4_bf16]=30 [gpt2_cp4_fp32]=26
  [gpt2_dp2_bf16]=11 [gpt2_dp2_fp32]=9 [gpt2_dp2_zero1_bf16]=9 [gpt2_dp2_zero1_fp32]=11
  [gpt2_dp2_zero1_fp8]=11 [gpt2_dp2_zero1_offload_bf16]=11 [gpt2_dp2_zero1_offload_fp32]=11
  [gpt2_dp2_zero2_bf16]=11 [gpt2_dp2_zero2_fp32]=9 [gpt2_dp2_zero3_bf16]=12
  [gpt2_dp2_zero3_fp32]=11 [gpt2_fp8_vs_bf16]=8 [gpt2_pp2_1f1b_bf16]=19 [gpt2_pp2_1f1b_fp32]=17
  [gpt2_pp2_1f1b_fp8]=14 [gpt2_pp2_gpipe_bf16]=23 [gpt2_pp2_gpipe_fp32]=18
  [gpt2_pp2_interleaved_bf16]=30 [gpt2_pp2_interleaved_fp32]=11 [gpt2_pp4_1f1b_bf16]=53
  [gpt2_pp4_1f1b_fp32]=42 [gpt2_ref_bf16]=7 [gpt2_ref_fp32]=5 [gpt2_ref_fp8]=6
  [gpt2_ref_fp8_rowwise]=6 [gpt2_tp2_bf16]=9 [gpt2_tp2_dp2_zero1_sp_fp8]=13 [gpt2_tp2_fp32]=9
  [gpt2_tp2_fp8]=26 [gpt2_tp2_sp_bf16]=13 [gpt2_tp2_sp_fp32]=9 [gpt2_tp2_sp_fp8]=24
  [gpt2_tp2_sp_rowwise_fp8]=19 [gpt2_tp4_sp_bf16]=33 [gpt2_tp4_sp_fp32]=29 [gpt2l4_ref_bf16]=7
  [gpt2l4_ref_fp32]=7 [llama_cp2_bf16]=16 [llama_cp2_fp32]=22 [llama_cp2_tp2_kv_split_bf16]=17
  [llama_cp2_tp2_kv_split_fp32]=23 [llama_cp4_dp1_bf16]=14 [llama_cp4_dp1_fp32]=28
  [llama_dp2_zero1_fp8]=11 [llama_fp8_vs_bf16]=1 [llama_kv2_ref_bf16]=6 [llama_kv2_ref_fp32]=5
  [llama_pp2_1f1b_fp8]=9 [llama_pp2_dp2_zero3_bf16]=17 [llama_pp2_dp2_zero3_fp32]=31
  [llama_ref_bf16]=6 [llama_ref_fp32]=5 [llama_ref_fp8]=6 [llama_ref_fp8_rowwise]=6
  [llama_tp2_dp2_zero1_sp_fp8]=20 [llama_tp2_dp2_zero3_bf16]=17 [llama_tp2_dp2_zero3_fp32]=19
  [llama_tp2_fp8]=20 [llama_tp2_kv_split_bf16]=10 [llama_tp2_kv_split_fp32]=11
  [llama_tp2_sp_fp8]=27 [llama_tp2_sp_rowwise_fp8]=14 [llama_tp4_kv_replicated_bf16]=29
  [llama_tp4_kv_replicated_fp32]=22 [moe_ep2]=18 [moe_ep2_dp4_zero2]=22 [moe_ep2_tp2]=20
  [moe_ep4]=20 [moe_ep8]=31 [moe_ref]=3 [moe_ref_fp8]=5 [moe_ep2_fp8]=20 [pipeline_runner_2]=87 [rank_killed]=19 [reshard_llama]=29
  [reshard_moe]=50 [ring_attention_2]=12 [watchdog_skip]=14 [watchdog_stall]=25)
t_start=$SECONDS
refs=() by_size=()
for n in "${order[@]}"; do [[ $n == *ref* ]] && refs+=("$n"); done
while read -r _ n; do by_size+=("$n"); done < <(for n in "${order[@]}"; do
  echo "$((case_ranks[$n] * ${est[$n]:-20})) $n"; done | sort -s -k1,1nr)
if [ "${SUITE_LIST:-0}" = 1 ]; then  # the selected cases in the order they would start
  for n in "${!alone[@]}" "${refs[@]}" "${by_size[@]}"; do
    [[ $n =~ $only ]] && echo "$n ${case_ranks[$n]} ranks ~${est[$n]:-20}s"; done | awk '!seen[$1]++'
  exit 0
fi
pending=()
declare -A queued=() started_at=()
# The cases that run alone first: launched together, then waited for.
for n in "${!alone[@]}"; do
  if [[ $n =~ $only ]] && [ -n "${case_ranks[$n]:-}" ]; then
    queued[$n]=1
    started_at[$n]=$SECONDS
    launch "$n"
  fi
done
while [ "${#pid_of[@]}" -gt 0 ]; do reap; done
for n in "${refs[@]}" "${by_size[@]}"; do
  if [[ $n =~ $only ]] && [ -n "${case_ranks[$n]:-}" ] && [ -z "${queued[$n]:-}" ]; then
    queued[$n]=1
    pending+=("$n")
  fi
done
# The first pending case starts as soon as its ranks are free. While it waits, a later case that
# fits the free slots starts too when it cannot delay the first (EASY backfilling, by the
# estimates above): it is expected to end before the first's ranks come free (the shadow time),
# or it fits in the slots still spare then. Strictly in order, an 8-rank case waiting behind
# another left 6 of 14 slots idle for 165 s (2026-12-05).
shadow() {  # HEAD_RANKS: "TIME SPARE": when the head's ranks are expected free, and spare slots then
  local need=$1 free=$((slots - running)) t=$SECONDS end r
  while read -r end r; do
    [ "$free" -ge "$need" ] && break
    free=$((free + r)); t=$end
  done < <(for n in "${!pid_of[@]}"; do
    echo "$((started_at[$n] + ${est[$n]:-20})) ${case_ranks[$n]}"; done | sort -n)
  echo "$t $((free - need))"
}
while [ "${#pending[@]}" -gt 0 ]; do
  if [ $((SECONDS - t_start)) -ge "$budget" ]; then
    for n in "${pending[@]}"; do
      printf '%-6s %-28s %s - - - - 0s not started: past SUITE_BUDGET=%s s\n' NOTRUN "$n" \
        "${case_ranks[$n]}" "$budget" >> "$summary"
    done
    break
  fi
  head=${pending[0]} pick=-1
  if [ $((running + case_ranks[$head])) -le "$slots" ] || [ "$running" = 0 ]; then
    pick=0
  else
    read -r s_time s_spare < <(shadow "${case_ranks[$head]}")
    for i in "${!pending[@]}"; do
      c=${pending[$i]} r=${case_ranks[${pending[$i]}]}
      [ $((running + r)) -le "$slots" ] || continue
      if [ $((SECONDS + ${est[$c]:-20})) -le "$s_time" ] || [ "$r" -le "$s_spare" ]; then
        pick=$i
        break
      fi
    done
  fi
  if [ "$pick" -ge 0 ]; then
    started_at[${pending[$pick]}]=$SECONDS
    launch "${pending[$pick]}"
    unset "pending[$pick]"
    pending=("${pending[@]}")
  else
    reap
  fi
done
while [ "${#pid_of[@]}" -gt 0 ]; do reap; done
# Ranks a killed case's launcher left behind.
pkill -KILL -f "^$bin/" 2> /dev/null || true
sort -k2 "$summary" -o "$summary"
pass=$(grep -c '^PASS' "$summary"); fail=$(grep -vc '^PASS' "$summary")
echo "GPU suite: $pass passed, $fail failed in $((SECONDS - t_start)) s"
cat "$summary"
[ "$fail" = 0 ]
