#!/usr/bin/env bash
# CPU: an MoE model's training step at mesh.ep = 1 and 2 on the same 2 ranks (dp 2 in both), and
# the share of the step spent in the MoE all-to-alls; memory per rank next to the planner's
# prediction (issue 20, docs/moe.md).
#
#   perf/cpu/moe_ep.sh [build-dir=build/cpu] [rounds=3] [steps=8] [experts=8]
#
# Model: the `demo` preset (4 blocks, n_embd 128, byte vocabulary) with every block an MoE
# block of `experts` GELU experts of width 512, top-2, aux 0.01; micro-batch 8 x 128 tokens,
# 1 micro-batch per step and rank, fp32, ZeRO-1. ep = 1: both ranks hold all experts and
# reduce their gradients over dp; ep = 2: each holds half and they exchange tokens. Rounds
# alternate ep 1 and ep 2 so both see the same machine load; the medians over the steps after
# the first two are printed from the metrics files (step_ms, tokens_per_s, the per-block
# a2a_ms summed over blocks, peak RSS per rank).
set -euo pipefail
build="${1:-build/cpu}"
rounds="${2:-3}"
steps="${3:-8}"
experts="${4:-8}"
exe="$build/src/meshtrain"
[[ -x "$exe" ]] || exe="$build/meshtrain"
[[ -x "$exe" ]] || { echo "moe_ep.sh: meshtrain not found under $build" >&2; exit 2; }
launcher="${MESHTRAIN_LAUNCHER:-mpirun}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
"$exe" prep --prep.input inputs/kjv.txt --prep.output "$work/kjv" --prep.tokenizer byte > /dev/null
common=(train --model.preset demo --moe.experts "$experts" --moe.top_k 2 --moe.ffn_hidden_size 512
        --train.micro_batch 8 --train.seq_len 128 --train.steps "$steps" --train.warmup 1
        --train.log_every 1 --train.eval_every 0 --train.save false --train.sample_tokens 0
        --zero.stage 1 --data.train "$work/kjv_train_*.bin" --data.val "$work/kjv_val_*.bin")
for ((r = 1; r <= rounds; ++r)); do
  for ep in 1 2; do
    "$launcher" -np 2 --oversubscribe "$exe" "${common[@]}" --mesh.ep "$ep" \
      --train.out_dir "$work/ep$ep-$r" > "$work/ep$ep-$r.log" 2>&1 ||
      { cat "$work/ep$ep-$r.log" >&2; exit 1; }
  done
done
python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys, glob
work, rounds = sys.argv[1], int(sys.argv[2])
print("| ep | step ms (median) | tokens/s | all-to-all ms | a2a share | memory/rank MiB |")
print("|---:|---:|---:|---:|---:|---:|")
res = {}
for ep in (1, 2):
    ms, tok, a2a, mem = [], [], [], []
    for r in range(1, rounds + 1):
        recs = [json.loads(l) for l in open(f"{work}/ep{ep}-{r}/metrics.jsonl")]
        recs = [x for x in recs if "step_ms" in x][2:]  # training steps after the first two
        for x in recs:
            ms.append(x["step_ms"]); tok.append(x["tokens_per_s"]); mem.append(x["memory_bytes"])
            a2a.append(sum(b["a2a_ms"] for b in x.get("moe", [])))
    m, a = statistics.median(ms), statistics.median(a2a)
    res[ep] = m
    print(f"| {ep} | {m:.1f} | {statistics.median(tok):.0f} | {a:.1f} | {100 * a / m:.1f}% |"
          f" {max(mem) / 2**20:.0f} |")
print(f"ep 2 / ep 1 throughput: {res[1] / res[2]:.3f}x")
PY
