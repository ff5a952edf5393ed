#!/usr/bin/env bash
# Pipeline schedules on the CPU build: bubble (measured, replayed, analytic) and activation
# memory per stage at pp = 4, for GPipe, 1F1B and interleaved 1F1B (v = 2) with m = 4, 8, 16.
#
#   cmake --preset cpu && cmake --build build/cpu --target bench_pipeline -j2   # builds nothing
#   perf/cpu/pipeline_schedules.sh [build-dir=build/cpu] [steps=10] [warmup=2] [pp=4]
#
# Writes the JSON lines of perf/bench/bench_pipeline.cpp to perf/results/pipeline_cpu.jsonl (pp = 4;
# other pp to pipeline_cpu_pp<N>.jsonl) and prints them as a markdown table. One BLAS/OpenMP
# thread per rank; ranks beyond the cores are oversubscribed (see perf/archive/journal.md for what that
# does to the measured figures). MODEL overrides the model options (default below).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-build/cpu}"
steps="${2:-10}"
warmup="${3:-2}"
pp="${4:-4}"
bench="$build/perf/bench/bench_pipeline"
[[ -x "$bench" ]] || { echo "pipeline_schedules.sh: $bench not found; build it first (cmake --build $build --target bench_pipeline)" >&2; exit 2; }
model="${MODEL:---n-layer 8 --n-embd 128 --n-head 4 --vocab 256 --seq-len 64 --micro-batch 2}"

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
if [[ "$(id -u)" == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
out="$here/../results/pipeline_cpu.jsonl"
[[ "$pp" == 4 ]] || out="$here/../results/pipeline_cpu_pp$pp.jsonl"
mkdir -p "$here/../results"

# shellcheck disable=SC2086
mpirun -np "$pp" --oversubscribe "$bench" $model --micro 4,8,16 \
  --schedules gpipe,1f1b,interleaved --chunks 2 --steps "$steps" --warmup "$warmup" | tee "$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out ($(getconf _NPROCESSORS_ONLN) cores, $pp ranks, $(date -u +%F))"

python3 - "$out" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
f = lambda v, d=2: "/".join(f"{x:.{d}f}" for x in v)
i = lambda v: "/".join(str(int(x)) for x in v)
print("\n| schedule | v | m | analytic | replay | measured idle/wall (stages) | busy | step ms "
      "(replay) | dilation | slots/chunk | in flight | act MiB/micro | allocated MiB | peak MiB | "
      "per-chunk slots MiB |")
print("|---|---:|---:|---:|---:|---|---:|---:|---:|---|---|---:|---|---|---|")
for r in rows:
    print(f"| {r['schedule']} | {r['v']} | {r['m']} | {r['bubble_analytic']:.3f} | "
          f"{r['bubble_replay_mean']:.3f} | {r['bubble_measured_mean']:.3f} "
          f"({f(r['bubble_measured'])}) | {r['bubble_busy']:.3f} | {r['step_ms']:.0f} "
          f"({r['replay_step_ms']:.0f}) | {r['compute_dilation']:.1f} | {i(r['n_slots'])} | "
          f"{i(r['in_flight'])} | {sum(r['act_micro_MiB'])/len(r['act_micro_MiB']):.2f} | "
          f"{f(r['act_alloc_MiB'], 1)} | {f(r['act_peak_MiB'], 1)} | "
          f"{f(r['act_chunk_slots_MiB'], 1)} |")
EOF
