#!/usr/bin/env bash
# meshtrain's training step against PyTorch's on one CPU core, measured in the same run.
#
#   cmake --preset cpu && cmake --build --preset cpu        # this script builds nothing
#   perf/cpu/step_vs_torch.sh [build-dir=build/cpu] [rounds=3] [steps=10] [preset=cpu-bench] [micro-batch=8]
#
# Runs perf/bench/bench_train_step and perf/reference/torch_gpt2_step.py alternately (meshtrain, torch,
# meshtrain, torch, ...) so that both see the same machine load, each with one BLAS/OpenMP
# thread, and prints the median over rounds of each round's median step time, tokens/s and the
# ratio meshtrain / PyTorch step time (target <= 1.0). The per-kernel table of meshtrain's last
# round follows. PYTHON overrides the interpreter (default /usr/bin/python3, Debian's torch).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-build/cpu}"
rounds="${2:-3}"
steps="${3:-10}"
preset="${4:-cpu-bench}"
mb="${5:-8}"
python="${PYTHON:-/usr/bin/python3}"
bench="$build/perf/bench/bench_train_step"
[[ -x "$bench" ]] || { echo "step_vs_torch.sh: $bench not found; build first (cmake --build --preset cpu)" >&2; exit 2; }

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
common=(--preset "$preset" --micro-batch "$mb" --steps "$steps" --warmup 2)
log="$(mktemp)"
trap 'rm -f "$log" "$log.mt" "$log.pt"' EXIT

field() { sed -n "s/^RESULT $1 .*$2=\([0-9.]*\).*/\1/p" "$log" | tr '\n' ' '; }

for ((r = 1; r <= rounds; ++r)); do
  # Only the last round profiles (the profile runs its own steps, after the timed ones).
  prof=0; ((r == rounds)) && prof=3
  "$bench" "${common[@]}" --profile-steps "$prof" > "$log.mt"
  grep '^RESULT' "$log.mt" >> "$log"
  "$python" "$here/../reference/torch_gpt2_step.py" "${common[@]}" > "$log.pt"
  grep '^RESULT' "$log.pt" >> "$log"
  echo "round $r: meshtrain $(field meshtrain median_ms | awk '{print $NF}') ms, torch $(field torch median_ms | awk '{print $NF}') ms" >&2
done

calc() { awk "BEGIN {print $1}"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mt_ms=$(field meshtrain median_ms | median)
pt_ms=$(field torch median_ms | median)
tokens=$(sed -n 's/.*= \([0-9]*\) tokens\/step.*/\1/p' "$log.mt" | head -1)

echo
head -1 "$log.mt"
grep '^# attention' "$log.pt"
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; median of $rounds interleaved rounds of $steps steps"
printf '%-28s %12s %12s\n' "" "ms/step" "tokens/s"
printf '%-28s %12.1f %12.0f\n' "meshtrain" "$mt_ms" "$(calc "$tokens / $mt_ms * 1000")"
printf '%-28s %12.1f %12.0f\n' "PyTorch $("$python" -c 'import torch; print(torch.__version__)')" \
  "$pt_ms" "$(calc "$tokens / $pt_ms * 1000")"
printf '%-28s %12.2f   (target <= 1.0)\n' "ratio meshtrain/PyTorch" "$(calc "$mt_ms / $pt_ms")"
echo
sed -n '/^# per-kernel/,$p' "$log.mt"
