#!/usr/bin/env bash
# Issue 34's GPU figure on one GPU: Llama 3.2 1B at a long sequence (SEQ, default 32768) with
# context parallelism (CP ranks, default 4; ring), bf16, ZeRO-1 over dp x cp, each rank its own
# emulated host (MESHTRAIN_EMULATE_HOSTS=1) sharing the GPU through NCCL. What it measures:
#  - each rank's device memory at its peak (nvidia-smi's per-process used memory, sampled every
#    second: the ranks share one GPU, so the trainer's own figure, the GPU's total, would count
#    them all) next to the planner's prediction, which train's memory preflight prints;
#  - with TRACE=1 (the bundle's bin/libmeshtrain_cupti_trace.so), each rank's GPU timeline: the
#    ring's NCCL kernels per step, the part that ran beside computation (hidden) and alone
#    (exposed). On a shared GPU an exposed NCCL kernel also waits for its peers' turns on the
#    GPU, so that share is an upper bound; the real figure needs one GPU per rank (issue 40).
#   perf/gpu/cp_long.sh BUNDLE OUT [SEQ] [CP]
# Environment: STEPS (6), MB (1), ZERO (1), TRACE (0), MT_TIMEOUT (400 s), EXTRA (more train options,
# e.g. "--train.recompute true", which an 80 GB card needs for 4 ranks), PRESET (llama3.2-1b;
# a small one, e.g. llama-tiny, with EMULATE=0 PRECISION=fp32, dry-runs the script on a CPU
# build), PRECISION (bf16).
set -uo pipefail
bundle=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
seq=${3:-32768}; cp=${4:-4}
# shellcheck disable=SC1091
source "$bundle/env.sh"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
export OMPI_MCA_rmaps_base_oversubscribe=1 MESHTRAIN_EMULATE_HOSTS=${EMULATE:-1}
sum=$out/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$sum"
data=/tmp/cp_long_data/kjv
mkdir -p "$(dirname "$data")"
[ -e "${data}_train_000000.bin" ] || "$bundle/bin/meshtrain" prep --prep.input "$root/inputs/kjv.txt" \
  --prep.output "$data" --prep.tokenizer byte > "$out/prep.log" 2>&1
name=${PRESET:-llama3.2-1b}_seq${seq}_cp$cp
trace=()
if [ "${TRACE:-0}" = 1 ]; then
  trace=(-x CUDA_INJECTION64_PATH="$bundle/bin/libmeshtrain_cupti_trace.so"
         -x MESHTRAIN_CUPTI_OUT="$out/${name}_trace.%p.csv")
fi
# Per-process device memory, sampled while the job runs.
( while :; do
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null
    sleep 1
  done ) > "$out/${name}_smi.csv" &
sampler=$!
timeout "${MT_TIMEOUT:-400}" mpirun -np "$cp" --bind-to none -x MESHTRAIN_EMULATE_HOSTS \
  "${trace[@]}" "$bundle/bin/meshtrain" train --model.preset "${PRESET:-llama3.2-1b}" \
  --train.seq_len "$seq" --train.micro_batch "${MB:-1}" --train.steps "${STEPS:-6}" \
  --train.precision "${PRECISION:-bf16}" --mesh.cp "$cp" --zero.stage "${ZERO:-1}" --train.log_every 1 \
  --train.eval_every 0 --train.sample_tokens 0 --train.save false --ckpt.final false \
  --data.train "${data}_train_*.bin" --data.val "" --train.out_dir "/tmp/cp_long_runs/$name" ${EXTRA:-} \
  --train.metrics "$out/$name.jsonl" > "$out/$name.log" 2>&1
rc=$?
kill "$sampler" 2>/dev/null
echo "== $name: rc $rc" | tee -a "$sum"
grep -E "memory: predicted|^step +[0-9]+/|rror" "$out/$name.log" | tail -4 | tee -a "$sum"
python3 - "$out/${name}_smi.csv" << 'EOF' | tee -a "$sum"
import collections, sys
peak = collections.defaultdict(int)
for line in open(sys.argv[1]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
        peak[parts[0]] = max(peak[parts[0]], int(parts[1]))
for pid, mib in sorted(peak.items(), key=lambda kv: -kv[1]):
    print(f"process {pid}: peak {mib / 1024:.2f} GiB on the device (nvidia-smi)")
EOF
if [ "${TRACE:-0}" = 1 ]; then
  for f in "$out/${name}"_trace.*.csv; do
    [ -s "$f" ] || continue
    python3 "$here/../tools/cupti_trace_summary.py" "$f" --steps 3 --top 12 --comm-match SendRecv \
      --label "$(basename "$f" .csv)" >> "$sum" 2>&1 || echo "no summary of $f" >> "$sum"
    grep -E "communication|GPU busy" "$sum" | tail -2
    gzip -f "$f"
  done
fi
exit "$rc"
