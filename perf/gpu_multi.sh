#!/usr/bin/env bash
# Multi-GPU runs of issue 11 on one node (one rank per GPU, NCCL backend), in one call:
#   jobs/bundle-gpu.sh gpubundle build/cuda/src/meshtrain build/cuda/perf/bench_collectives
#   perf/gpu_multi.sh gpubundle OUT_DIR [equiv|nccl|ddp|all]
# Give the device tool's $OUT as OUT_DIR: every log lands there as it is written, and each
# run is cut off after MT_TIMEOUT seconds (default 150), so a hung collective costs one run, not
# the whole call (2026-11-29: a first 2-GPU call spent its 420 s without returning a log).
# equiv: losses of 20 steps of every 2-GPU layout next to the 1-GPU run (fp32 and bf16);
# nccl:  all-reduce / all-gather / reduce-scatter bandwidth, ours and PyTorch's, 1 KB - 1 GB;
# ddp:   the seeds' DDP experiment: GPT-2 124M (seq 1024, bf16), 1 GPU vs 2 GPUs, with and
#        without NCCL_P2P_DISABLE=1.
set -uo pipefail
bundle=$(cd "$1" && pwd); out=${2:-/tmp/gpu_multi}; what=${3:-all}
mkdir -p "$out"
export LD_LIBRARY_PATH=$bundle/lib:${LD_LIBRARY_PATH:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi topo -m | tee "$out/topo.txt"
mt() {
  timeout "${MT_TIMEOUT:-150}" mpirun -np "$1" --bind-to none "$bundle/bin/meshtrain" train "${@:2}"
}
status=0
if [ "$what" = equiv ] || [ "$what" = all ]; then
  for prec in fp32 bf16; do
    common=(--model.preset gpt2-124m --model.n_layer 4 --train.seq_len 256 --train.steps 20
            --train.precision "$prec" --train.log_every 1 --train.eval_every 0 --data.val ""
            --train.sample_tokens 0 --train.save false --ckpt.final false --train.lr 6e-4 --train.warmup 5)
    mt 1 "${common[@]}" --train.micro_batch 8 --train.grad_accum 2 \
      --train.metrics "$out/equiv_${prec}_1gpu.jsonl" > "$out/equiv_${prec}_1gpu.log" 2>&1 || status=1
    for lay in "dp:--mesh.dp 2 --train.micro_batch 8 --train.grad_accum 1" \
               "dp_zero3:--mesh.dp 2 --zero.stage 3 --train.micro_batch 8 --train.grad_accum 1" \
               "pp:--mesh.pp 2 --train.micro_batch 8 --train.grad_accum 2" \
               "tp:--mesh.tp 2 --train.micro_batch 8 --train.grad_accum 2" \
               "tp_sp:--mesh.tp 2 --tp.sequence_parallel --train.micro_batch 8 --train.grad_accum 2"; do
      name=${lay%%:*}; args=${lay#*:}
      # shellcheck disable=SC2086
      mt 2 "${common[@]}" $args --train.metrics "$out/equiv_${prec}_$name.jsonl" \
        > "$out/equiv_${prec}_$name.log" 2>&1 || { status=1; tail -5 "$out/equiv_${prec}_$name.log"; }
    done
    python3 - "$out" "$prec" <<'PY'
import json, sys, glob, os
out, prec = sys.argv[1], sys.argv[2]
def losses(f):
    return [json.loads(l)["loss"] for l in open(f) if '"loss"' in l]
ref = losses(f"{out}/equiv_{prec}_1gpu.jsonl")
for f in sorted(glob.glob(f"{out}/equiv_{prec}_*.jsonl")):
    if f.endswith("_1gpu.jsonl"):
        continue
    l = losses(f)
    n = min(len(l), len(ref))
    worst = max((abs(a - b) / abs(b) for a, b in zip(l[:n], ref[:n])), default=float("nan"))
    print(f"{prec} {os.path.basename(f)[:-6]}: {n} steps, worst relative loss diff vs 1 GPU "
          f"{worst:.2e}, step 20 loss {l[-1] if l else float('nan'):.4f} (1 GPU {ref[-1]:.4f})")
PY
  done
fi
if [ "$what" = nccl ] || [ "$what" = all ]; then
  timeout "${MT_TIMEOUT:-150}" mpirun -np "$ngpu" --bind-to none "$bundle/bin/bench_collectives" --backend nccl \
    --max-bytes 1073741824 --iters 20 2>&1 | tee "$out/nccl_meshtrain.txt"
  timeout "${MT_TIMEOUT:-150}" mpirun -np "$ngpu" --bind-to none python3 perf/torch_collectives.py --max-bytes 1073741824 \
    2>&1 | tee "$out/nccl_torch.txt"
fi
if [ "$what" = ddp ] || [ "$what" = all ]; then
  common=(--model.preset gpt2-124m --train.seq_len 1024 --train.micro_batch 16 --train.steps 30
          --train.precision bf16 --train.log_every 1 --train.eval_every 0 --data.val ""
          --train.sample_tokens 0 --train.save false --ckpt.final false)
  mt 1 "${common[@]}" --train.metrics "$out/ddp_1gpu.jsonl" > "$out/ddp_1gpu.log" 2>&1 || status=1
  mt 2 "${common[@]}" --mesh.dp 2 --train.metrics "$out/ddp_2gpu.jsonl" > "$out/ddp_2gpu.log" 2>&1 || status=1
  NCCL_P2P_DISABLE=1 mt 2 "${common[@]}" --mesh.dp 2 \
    --train.metrics "$out/ddp_2gpu_nop2p.jsonl" > "$out/ddp_2gpu_nop2p.log" 2>&1 || status=1
  python3 - "$out" <<'PY'
import json, sys, statistics
out = sys.argv[1]
def rate(f):
    rows = [json.loads(l) for l in open(f) if '"tokens_per_s"' in l]
    r = [x["tokens_per_s"] for x in rows[5:]]  # warm-up excluded
    return statistics.median(r) / 1024, statistics.median(x["step_ms"] for x in rows[5:])
one = rate(f"{out}/ddp_1gpu.jsonl")
print(f"1 GPU: {one[0]:.1f} samples/s ({one[1]:.1f} ms/step)")
for name in ("ddp_2gpu", "ddp_2gpu_nop2p"):
    try:
        r = rate(f"{out}/{name}.jsonl")
        print(f"{name}: {r[0]:.1f} samples/s ({r[1]:.1f} ms/step), {r[0] / one[0]:.2f}x of 1 GPU, "
              f"weak-scaling efficiency {r[0] / one[0] / 2:.2f}")
    except Exception as e:
        print(name, "failed:", e)
PY
fi
exit $status
