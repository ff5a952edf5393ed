#!/usr/bin/env bash
# FP8 against bf16 on one GPU (issue 35), in one device call: `meshtrain train` in bf16 and in
# fp8 (tensorwise; rowwise where asked), beside PyTorch torch.compile in bf16 and with float8
# linears on torch._scaled_mm (perf/reference/torch_llama_gpu.py --linears bf16,float8): the same
# model, AdamW, clipping at 1.0 and sequence length on both sides; meshtrain reads the shipped
# corpus as byte tokens, PyTorch random tokens (the step time does not depend on the ids).
#   jobs/bundle-gpu.sh gpubundle build/cuda/src/meshtrain
#   perf/gpu/fp8_step.sh gpubundle OUT [parts]
# parts (comma-separated, default llama8b,torch8b,converge):
#   llama8b   Llama-3.1-8B shape cut to LAYERS blocks (4), seq 4096, micro-batch 1
#   llama1b   Llama 3.2 1B, seq 2048, micro-batch 4
#   llama8b_mlpact  its bf16 and fp8 runs with --train.recompute_mlp_act true (after llama8b)
#   llama1b_mlpact  its bf16 run with --train.recompute_mlp_act true (after llama1b)
#   gpt2xl    GPT-2 1.5B, seq 1024, micro-batch 4
#   tracexl   the same for gpt2xl
#   rowwise   the llama8b run again with --fp8.recipe rowwise
#   torch8b / torch1b / torchxl   the PyTorch side of llama8b / llama1b / gpt2xl (compile, bf16
#             and float8 linears)
#   trace8b   llama8b's bf16 and fp8 runs again, 10 steps each under the CUPTI injection library
#             (the bundle's bin/libmeshtrain_cupti_trace.so): where the fp8 step's time goes,
#             per kernel category (fp8_cast: our casts, amaxes and packs) beside bf16's
#   converge  llama-150m, CONVERGE_STEPS (2000) steps on the corpus in each of
#             CONVERGE_PRECISIONS (bf16,fp8; each run CONVERGE_SECS, 300, at most), same seed:
#             the final losses (mean of the last 50 steps), each against the first, and the curves in
#             OUT/converge.svg (perf/tools/plot_loss.py). An entry PREC:SEED[:ATTN[:LR]] trains
#             with --train.seed SEED (default 1234), --attn.impl ATTN (auto) and --train.lr LR
#             (1e-3): the seed-to-seed spread, the attention kernel and the learning rate beside
#             the precisions (run converge_PREC_sSEED[_ATTN][_lrLR]; empty fields keep defaults).
#             CONVERGE_CORPUS=pysrc trains on the first
#             CORPUS_MB (64) MB of the device's Python sources (site-packages, sorted by path) instead
#             of the KJV: 2000 x 8192 byte tokens are 13 passes over the 1.3 MB KJV, which both
#             precisions memorise; 64 MB is seen once, so the losses compare learning, not recall.
# Environment: STEPS (20; the median of steps 6..STEPS is reported), TORCHXL_SECS (540: torchxl's
# limit). OUT receives one log and one metrics file per run and summary.txt.
set -uo pipefail
bundle=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd); what=${3:-llama8b,torch8b,converge}
# shellcheck disable=SC1091
source "$bundle/env.sh"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
sum=$out/summary.txt
status=0
# shellcheck source=perf/gpu/lib.sh
source "$here/lib.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$sum"
steps=${STEPS:-20}
data=/tmp/fp8_step_data/kjv
mkdir -p "$(dirname "$data")"
[ -e "${data}_train_000000.bin" ] || "$bundle/bin/meshtrain" prep --prep.input "$root/inputs/kjv.txt" \
  --prep.output "$data" --prep.tokenizer byte > "$out/prep.log" 2>&1
use_corpus() {  # PREFIX: the shards every later run trains on
  common=(--train.log_every 1 --train.eval_every 0 --train.sample_tokens 0 --train.save false
          --ckpt.final false --data.train "$1_train_*.bin" --data.val "")
}
use_corpus "$data"

# median step ms, tokens/s and the largest memory of steps 6.. of a metrics file
stats() {
  python3 - "$1" << 'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
rows = [r for r in rows if "step_ms" in r]
tail = rows[5:] or rows
ms = statistics.median(r["step_ms"] for r in tail)
tok = statistics.median(r["tokens_per_s"] for r in tail)
mem = max(r.get("memory_bytes", 0) for r in rows) / 2**30
mfu = statistics.median(r.get("mfu", 0) for r in tail)
print(f"{ms:.2f} ms/step, {tok:,.0f} tok/s, MFU {100 * mfu:.1f}% (bf16 peak), {mem:.1f} GiB, "
      f"final loss {rows[-1]['loss']:.4f}")
EOF
}
train() {  # NAME SECS ARGS...: one meshtrain run, its line in the summary
  local name=$1 secs=$2; shift 2
  if run "$name" "$secs" "$bundle/bin/meshtrain" train "${common[@]}" \
      --train.out_dir "/tmp/fp8_step_runs/$name" --train.metrics "$out/$name.jsonl" "$@"; then
    note "$name: $(stats "$out/$name.jsonl")"
  else
    tail -5 "$out/$name.log" | tee -a "$sum"
  fi
}
ratio() {  # A B: step-time ratio A / B from their metrics files
  python3 - "$out/$1.jsonl" "$out/$2.jsonl" << 'EOF'
import json, statistics, sys
def med(p):
    rows = [json.loads(l) for l in open(p) if l.strip().startswith("{")]
    return statistics.median(r["step_ms"] for r in rows[5:] if "step_ms" in r)
a, b = med(sys.argv[1]), med(sys.argv[2])
print(f"speed-up {sys.argv[2].split('/')[-1][:-6]} / {sys.argv[1].split('/')[-1][:-6]}: {a / b:.3f}x")
EOF
}
layers=${LAYERS:-4}
l8shape=(--model.preset llama3.1-8b --model.n_layer "$layers" --train.seq_len 4096
         --train.micro_batch 1)
l8=("${l8shape[@]}" --train.steps "$steps")
if has llama8b; then
  train llama8b_bf16 240 "${l8[@]}" --train.precision bf16
  train llama8b_fp8 240 "${l8[@]}" --train.precision fp8
  [ -e "$out/llama8b_fp8.jsonl" ] && note "$(ratio llama8b_bf16 llama8b_fp8)"
fi
if has llama8b_mlpact; then  # both keeping only the MLP's pre-activation (after llama8b)
  for p in bf16 fp8; do
    train "llama8b_${p}_mlpact" 240 "${l8[@]}" --train.precision "$p" --train.recompute_mlp_act true
    [ -e "$out/llama8b_$p.jsonl" ] && note "$(ratio "llama8b_$p" "llama8b_${p}_mlpact")"
  done
fi
# PREFIX SHAPE...: bf16 and fp8 again, 10 steps each under the CUPTI injection library, each
# step's time per kernel category in the summary
trace() {
  local prefix=$1 inject=$bundle/bin/libmeshtrain_cupti_trace.so p name; shift
  for p in bf16 fp8; do
    name=${prefix}_$p
    # One file per process (Open MPI's singleton helpers load the library too): the largest
    # is the trainer's.
    run "$name" 240 env CUDA_INJECTION64_PATH="$inject" MESHTRAIN_CUPTI_OUT="$out/$name.%p.csv" \
      "$bundle/bin/meshtrain" train "${common[@]}" --train.out_dir "/tmp/fp8_step_runs/$name" \
      --train.metrics "$out/$name.jsonl" "$@" --train.steps 10 --train.precision "$p"
    # shellcheck disable=SC2012  # the names are ours
    mv "$(ls -S "$out/$name".*.csv | head -1)" "$out/$name.csv" && rm -f "$out/$name".*.csv
    python3 "$here/../tools/cupti_trace_summary.py" "$out/$name.csv" --steps 5 --top 30 \
      --label "$name" >> "$sum" 2>&1 || note "  $name: no summary"
    gzip -f "$out/$name.csv"
  done
}
has trace8b && trace trace8b "${l8shape[@]}"
if has rowwise; then
  train llama8b_fp8_rowwise 240 "${l8[@]}" --train.precision fp8 --fp8.recipe rowwise
fi
l1=(--model.preset llama3.2-1b --train.seq_len 2048 --train.micro_batch 4 --train.steps "$steps")
if has llama1b; then
  train llama1b_bf16 240 "${l1[@]}" --train.precision bf16
  train llama1b_fp8 240 "${l1[@]}" --train.precision fp8
  [ -e "$out/llama1b_fp8.jsonl" ] && note "$(ratio llama1b_bf16 llama1b_fp8)"
fi
if has llama1b_mlpact; then  # bf16 keeping only the MLP's pre-activation (memory against torch's)
  train llama1b_bf16_mlpact 240 "${l1[@]}" --train.precision bf16 --train.recompute_mlp_act true
  [ -e "$out/llama1b_bf16.jsonl" ] && note "$(ratio llama1b_bf16 llama1b_bf16_mlpact)"
fi
gshape=(--model.preset gpt2-1.5b --train.seq_len 1024 --train.micro_batch 4)
g=("${gshape[@]}" --train.steps "$steps")
if has gpt2xl; then
  train gpt2xl_bf16 300 "${g[@]}" --train.precision bf16
  train gpt2xl_fp8 300 "${g[@]}" --train.precision fp8
  [ -e "$out/gpt2xl_fp8.jsonl" ] && note "$(ratio gpt2xl_bf16 gpt2xl_fp8)"
fi
has tracexl && trace tracexl "${gshape[@]}"
if has torch8b; then
  run torch8b 300 python3 "$root/perf/reference/torch_llama_gpu.py" --preset llama3.1-8b \
    --layers "$layers" --seq 4096 --micro-batch 1 --mode compile --linears bf16,float8 \
    --steps "$steps"
  grep -vi warn "$out/torch8b.log" | tail -4 | tee -a "$sum"
fi
if has torch1b; then
  run torch1b 300 python3 "$root/perf/reference/torch_llama_gpu.py" --preset llama3.2-1b \
    --seq 2048 --micro-batch 4 --mode compile --linears bf16,float8 --steps "$steps"
  grep -vi warn "$out/torch1b.log" | tail -4 | tee -a "$sum"
fi
if has torchxl; then
  # 48 blocks compiled twice (bf16, float8): more than 300 s on the H100 (2026-12-06).
  run torchxl "${TORCHXL_SECS:-540}" python3 "$root/perf/reference/torch_gpt2_gpu.py" --preset gpt2-1.5b \
    --seq 1024 --micro-batch 4 --mode compile --linears bf16,float8 --steps "$steps"
  grep -vi warn "$out/torchxl.log" | tail -3 | tee -a "$sum"
fi
if has converge; then
  cs=${CONVERGE_STEPS:-2000}
  c=(--model.preset llama-150m --train.seq_len 1024 --train.micro_batch 8 --train.steps "$cs")
  corpus=KJV
  if [ "${CONVERGE_CORPUS:-kjv}" = pysrc ]; then
    py=/tmp/fp8_step_data/pysrc
    if [ ! -e "${py}_train_000000.bin" ]; then
      python3 - "$py.txt" "${CORPUS_MB:-64}" << 'EOF' | tee -a "$sum"
import pathlib, sys, sysconfig
root, limit, n = pathlib.Path(sysconfig.get_paths()["purelib"]), int(sys.argv[2]) << 20, 0
with open(sys.argv[1], "wb") as out:
    for p in sorted(root.rglob("*.py")):
        if n >= limit:
            break
        b = p.read_bytes()[: limit - n]
        out.write(b)
        n += len(b)
print(f"pysrc corpus: {n / 2**20:.1f} MB of {root}/**/*.py")
EOF
      "$bundle/bin/meshtrain" prep --prep.input "$py.txt" --prep.output "$py" \
        --prep.tokenizer byte > "$out/prep_pysrc.log" 2>&1
    fi
    use_corpus "$py"
    corpus="the device's Python sources (${CORPUS_MB:-64} MB)"
  fi
  IFS=, read -r -a cprec <<< "${CONVERGE_PRECISIONS:-bf16,fp8}"
  curves=()
  for item in "${cprec[@]}"; do
    IFS=: read -r p seed attn lr <<< "$item"
    name=$p extra=(--train.seed "${seed:-1234}")
    if [ -n "$seed" ]; then name+="_s$seed"; fi
    if [ -n "$attn" ]; then name+="_$attn"; extra+=(--attn.impl "$attn"); fi
    if [ -n "$lr" ]; then name+="_lr$lr"; extra+=(--train.lr "$lr"); fi
    train "converge_$name" "${CONVERGE_SECS:-300}" "${c[@]}" --train.precision "$p" "${extra[@]}"
    # A run that wrote no metrics (refused options, a crash) is reported above, not plotted.
    [ -s "$out/converge_$name.jsonl" ] && curves+=("$name=$out/converge_$name.jsonl")
  done
  # The mean loss of the last 50 steps of each, and each against the first (the baseline).
  python3 - "${curves[@]}" << 'EOF' | tee -a "$sum"
import json, sys
def last(p):
    rows = [json.loads(l) for l in open(p) if l.strip().startswith("{")]
    tail = [r["loss"] for r in rows if "loss" in r][-50:]
    return sum(tail) / len(tail), len(rows)
base = None
for name, path in (a.split("=", 1) for a in sys.argv[1:]):
    try:
        m, n = last(path)
    except (OSError, ZeroDivisionError):
        print(f"converge: {name}: no losses ({path})")
        continue
    base = base or (name, m)
    print(f"converge: {name} mean loss of the last 50 steps {m:.4f} ({n} steps), "
          f"{name} / {base[0]} = {m / base[1]:.4f}")
EOF
  python3 "$here/../tools/plot_loss.py" "$out/converge.svg" "${curves[@]}" \
    --title "llama-150m, $cs steps on $corpus, ${CONVERGE_PRECISIONS:-bf16,fp8} (same seed)" \
    >> "$sum" 2>&1
fi
exit $status
