#!/usr/bin/env bash
# Multi-GPU runs of issue 11 on one node (one rank per GPU, NCCL backend), in one call:
#   jobs/bundle-gpu.sh gpubundle build/cuda/src/meshtrain build/cuda/perf/bench/bench_collectives
#   perf/gpu/multi_gpu.sh gpubundle OUT_DIR [equiv|nccl|ddp|all|llama|moe|watchdog|reshard|issue21]
# Give the device tool's $OUT as OUT_DIR: every log lands there as it is written, and each
# run is cut off after MT_TIMEOUT seconds (default 150), so a hung collective costs one run, not
# the whole call (2026-11-29: a first 2-GPU call spent its 420 s without returning a log).
# equiv: losses of 20 steps of every 2-GPU layout next to the 1-GPU run (fp32 and bf16);
# nccl:  all-reduce / all-gather / reduce-scatter bandwidth, ours and PyTorch's, 1 KB - 1 GB;
# ddp:   the seeds' DDP experiment: GPT-2 124M (seq 1024, bf16), 1 GPU vs 2 GPUs, with and
#        without NCCL_P2P_DISABLE=1.
# Issue 21 (issue21 = llama,moe,watchdog,reshard; layouts that need more GPUs than the machine
# has are skipped and say so):
# llama:    llama-150m, seq 1024, bf16, 20 steps: tp 2 (kv heads split), tp 4 (replicated kv: the
#           preset's kv heads < 4 are made so with --model.n_kv_head 2), pp 2, dp 2 ZeRO-1 and -3,
#           losses against the 1-GPU run, tokens/s and memory per layout;
# moe:      GPT-2-shaped MoE (8 experts, top-2, fp32: with fp64 router scores the layouts agree to
#           fp32 rounding; bf16 MoE trains too, but its layouts agree only within 16-bit
#           tolerances, docs/moe.md) over NCCL all-to-all: ep 2/4/8, ep x dp, ep x tp,
#           losses against ep 1 (fp64 router scores: no top-k flips), tokens/s, all-to-all share;
# watchdog: one rank stalled on a collective by the test hook: every rank must exit within
#           comm.timeout + 60 s, and the flight dumps must name the collective;
# reshard:  a checkpoint of (dp 2, tp 2) on 4 GPUs restored as (dp 1, tp 2) on 2, Llama and MoE,
#           the next 5 losses against the uninterrupted run.
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
  timeout "${MT_TIMEOUT:-150}" mpirun -np "$ngpu" --bind-to none python3 perf/reference/torch_collectives.py --max-bytes 1073741824 \
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
# losses FILE: the "loss" of each training record; compare REF FILE...: the worst relative
# difference of each FILE's losses against REF's.
compare() {
  python3 - "$@" <<'PY'
import json, sys, os
def losses(f):
    try:
        return [json.loads(l)["loss"] for l in open(f) if '"loss"' in l]
    except OSError:
        return []
ref = losses(sys.argv[1])
for f in sys.argv[2:]:
    l = losses(f)
    n = min(len(l), len(ref))
    worst = max((abs(a - b) / abs(b) for a, b in zip(l[:n], ref[:n])), default=float("nan"))
    rows = [json.loads(x) for x in open(f) if '"tokens_per_s"' in x] if l else []
    tps = sorted(r["tokens_per_s"] for r in rows[3:])[len(rows[3:]) // 2] if len(rows) > 3 else 0
    mem = max((r.get("memory_bytes", 0) for r in rows), default=0) / 2**30
    print(f"{os.path.basename(f)[:-6]}: {n} steps vs {os.path.basename(sys.argv[1])[:-6]}: worst "
          f"relative loss diff {worst:.2e}; {tps:.0f} tok/s, {mem:.1f} GiB")
PY
}
want() { [ "$what" = "$1" ] || [ "$what" = issue21 ]; }
fits() { [ "$1" -le "$ngpu" ] || { echo "skipped (needs $1 GPUs, have $ngpu): $2"; return 1; }; }

if want llama; then
  common=(--model.preset llama-150m --train.seq_len 1024 --train.steps 20 --train.precision bf16
          --train.log_every 1 --train.eval_every 0 --data.val "" --train.sample_tokens 0
          --train.save false --ckpt.final false --train.micro_batch 8)
  mt 1 "${common[@]}" --train.grad_accum 2 --train.metrics "$out/llama_1gpu.jsonl" \
    > "$out/llama_1gpu.log" 2>&1 || status=1
  runs=()
  for lay in "2:tp2_split:--mesh.tp 2 --train.grad_accum 2" \
             "4:tp4_replicated:--mesh.tp 4 --model.n_kv_head 2 --train.grad_accum 2" \
             "2:pp2:--mesh.pp 2 --train.grad_accum 2" \
             "2:dp2_zero1:--mesh.dp 2 --zero.stage 1 --train.grad_accum 1" \
             "2:dp2_zero3:--mesh.dp 2 --zero.stage 3 --train.grad_accum 1"; do
    n=${lay%%:*}; rest=${lay#*:}; name=${rest%%:*}; args=${rest#*:}
    fits "$n" "llama $name" || continue
    # shellcheck disable=SC2086
    mt "$n" "${common[@]}" $args --train.metrics "$out/llama_$name.jsonl" \
      > "$out/llama_$name.log" 2>&1 || { status=1; tail -3 "$out/llama_$name.log"; }
    runs+=("$out/llama_$name.jsonl")
  done
  # tp 4 replicated runs a model with 2 kv heads: its reference is that model on 1 GPU.
  if fits 4 "llama tp4 reference"; then
    mt 1 "${common[@]}" --model.n_kv_head 2 --train.grad_accum 2 \
      --train.metrics "$out/llama_1gpu_kv2.jsonl" > "$out/llama_1gpu_kv2.log" 2>&1 || status=1
    compare "$out/llama_1gpu_kv2.jsonl" "$out/llama_tp4_replicated.jsonl"
  fi
  [ ${#runs[@]} -gt 0 ] && compare "$out/llama_1gpu.jsonl" "${runs[@]}"
fi

if want moe; then
  common=(--model.preset gpt2-124m --model.n_layer 4 --moe.experts 8 --moe.top_k 2
          --moe.router_fp64 --train.seq_len 512 --train.steps 20 --train.precision fp32
          --train.log_every 1 --train.eval_every 0 --data.val "" --train.sample_tokens 0
          --train.save false --ckpt.final false --train.micro_batch 8)
  mt 1 "${common[@]}" --train.grad_accum 8 --train.metrics "$out/moe_ep1.jsonl" \
    > "$out/moe_ep1.log" 2>&1 || status=1
  runs=()
  for lay in "2:ep2:--mesh.ep 2 --train.grad_accum 4" "4:ep4:--mesh.ep 4 --train.grad_accum 2" \
             "8:ep8:--mesh.ep 8 --train.grad_accum 1" \
             "4:ep2_dp2:--mesh.dp 2 --mesh.ep 2 --train.grad_accum 2" \
             "4:ep2_tp2:--mesh.ep 2 --mesh.tp 2 --train.grad_accum 4"; do
    n=${lay%%:*}; rest=${lay#*:}; name=${rest%%:*}; args=${rest#*:}
    fits "$n" "moe $name" || continue
    # shellcheck disable=SC2086
    mt "$n" "${common[@]}" $args --train.metrics "$out/moe_$name.jsonl" \
      > "$out/moe_$name.log" 2>&1 || { status=1; tail -3 "$out/moe_$name.log"; }
    runs+=("$out/moe_$name.jsonl")
    grep -E "step +20/" "$out/moe_$name.log" | tail -1
  done
  [ ${#runs[@]} -gt 0 ] && compare "$out/moe_ep1.jsonl" "${runs[@]}"
fi

if want watchdog && fits 2 "watchdog"; then
  # Rank 1 stalls the 3rd operation on 'dp'; comm.timeout 20 s: all ranks gone by 80 s.
  t0=$SECONDS
  MESHTRAIN_TEST_COLLECTIVE=stall:1:dp:3 MT_TIMEOUT=140 mt 2 --model.preset gpt2-124m \
    --model.n_layer 2 --train.seq_len 256 --train.micro_batch 4 --train.steps 10 --mesh.dp 2 \
    --comm.timeout 20 --train.eval_every 0 --data.val "" --train.sample_tokens 0 \
    --train.save false --ckpt.final false --train.out_dir "$out/watchdog" \
    > "$out/watchdog.log" 2>&1
  rc=$?
  echo "watchdog: rc $rc after $((SECONDS - t0)) s (limit 80 s); flight dumps:" \
    "$(find "$out/watchdog" -name 'flight_*.json' 2>/dev/null | wc -l)"
  grep -hE "watchdog on rank|all_reduce|did not" "$out/watchdog.log" | head -4
  [ $((SECONDS - t0)) -le 80 ] && [ "$rc" -ne 0 ] || status=1
fi

if want reshard && fits 4 "reshard"; then
  for fam in llama moe; do
    # MoE in fp32: the continuation is compared to fp32 rounding (bf16 MoE exists, docs/moe.md).
    if [ $fam = llama ]; then m=(--model.preset llama-150m --model.n_layer 4 --train.precision bf16)
    else m=(--model.preset gpt2-124m --model.n_layer 4 --moe.experts 8 --moe.router_fp64
            --train.precision fp32); fi
    common=("${m[@]}" --train.seq_len 512 --train.micro_batch 4
            --train.log_every 1 --train.eval_every 0 --data.val "" --train.sample_tokens 0
            --train.save false --train.metrics /dev/null)
    mt 4 "${common[@]}" --mesh.dp 2 --mesh.tp 2 --train.steps 10 --train.grad_accum 1 \
      --ckpt.dir "$out/reshard_$fam/ckpt" --ckpt.every 5 --ckpt.final false \
      --train.metrics "$out/reshard_${fam}_full.jsonl" > "$out/reshard_${fam}_4gpu.log" 2>&1 || status=1
    mt 2 "${common[@]}" --mesh.tp 2 --train.steps 10 --train.grad_accum 2 \
      --train.resume "$out/reshard_$fam/ckpt/step_00000005.h5" --ckpt.final false \
      --train.metrics "$out/reshard_${fam}_resumed.jsonl" > "$out/reshard_${fam}_2gpu.log" 2>&1 || status=1
    python3 - "$out/reshard_${fam}_full.jsonl" "$out/reshard_${fam}_resumed.jsonl" "$fam" <<'PY'
import json, sys
def by_step(f):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f)) if "loss" in r}
a, b = by_step(sys.argv[1]), by_step(sys.argv[2])
common = sorted(set(a) & set(b))
worst = max((abs(a[s] - b[s]) / abs(a[s]) for s in common), default=float("nan"))
print(f"reshard {sys.argv[3]}: steps {common} after the 4-GPU checkpoint, worst relative loss diff "
      f"{worst:.2e}")
PY
  done
fi
exit $status
