#!/usr/bin/env bash
# `meshtrain prep` throughput on a JSON-lines corpus (perf/tools/prep_corpus.py) at several rank
# counts, plain / gzip / zstd, and a check that every rank count wrote the same shards.
#   perf/cpu/prep_throughput.sh MESHTRAIN CORPUS_DIR OUT_DIR [TOKENIZER_JSON] ["1 2"] [ROUNDS]
# TOKENIZER_JSON: an hf tokenizer.json (e.g. from perf/tools/make_bpe_tokenizer.py); "byte" (or
# empty) for the byte tokenizer. Prints one row per (kind, ranks): the best of ROUNDS (default
# 3) tokenising seconds as prep reports them (input read, JSON parsed, tokens in memory) and the
# whole command's wall time, with MB/s of JSON lines (uncompressed) for each, and the CPU
# seconds of that round's busiest rank and of all ranks: on a machine that other work shares,
# 1-rank CPU / busiest-rank CPU is the speed-up the ranks reach on cores of their own.
set -euo pipefail
mt=$1; corpus=$2; out=$3; tok=${4:-byte}; ranks=${5:-"1 2"}; rounds=${6:-3}
mkdir -p "$out"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
tok_args=(--prep.tokenizer byte)
[ "$tok" = byte ] || tok_args=(--prep.tokenizer hf --prep.tokenizer_json "$tok")
text_bytes=$(cat "$corpus"/corpus_*.jsonl | wc -c)
printf '%-6s %5s %10s %9s %10s %9s %9s %9s\n' kind ranks tokenise_s MB/s wall_s MB/s cpu_max cpu_sum
for kind in jsonl jsonl.gz jsonl.zst; do
  ls "$corpus"/corpus_*."$kind" > /dev/null 2>&1 || continue
  inputs=$(printf "%s\n" "$corpus"/corpus_*."$kind" | paste -sd,)
  first=""
  for n in $ranks; do
    best_t=""; best_w=""; cpu=""
    for _ in $(seq "$rounds"); do
      start=$(date +%s.%N)
      log=$(mpirun -np "$n" --oversubscribe "$mt" prep --prep.input "$inputs" \
        --prep.output "$out/$kind.$n/c" "${tok_args[@]}" --prep.progress_every 0 2>&1)
      wall=$(echo "$(date +%s.%N) - $start" | bc)
      t=$(echo "$log" | sed -n 's/.*tokenised in \([0-9.e-]*\) s.*/\1/p')
      [ -n "$t" ] || { echo "$log" >&2; exit 1; }
      if [ -z "$best_t" ] || [ "$(echo "$t < $best_t" | bc)" = 1 ]; then
        best_t=$t
        cpu=$(echo "$log" | sed -n 's/.*CPU \([0-9.e-]*\) s on the busiest rank, \([0-9.e-]*\) s over.*/\1 \2/p')
      fi
      if [ -z "$best_w" ] || [ "$(echo "$wall < $best_w" | bc)" = 1 ]; then best_w=$wall; fi
    done
    read -r cpu_max cpu_sum <<< "$cpu"
    printf '%-6s %5d %10.2f %9.1f %10.2f %9.1f %9.2f %9.2f\n' "${kind#jsonl}" "$n" "$best_t" \
      "$(echo "$text_bytes / $best_t / 1000000" | bc -l)" "$best_w" \
      "$(echo "$text_bytes / $best_w / 1000000" | bc -l)" "$cpu_max" "$cpu_sum"
    if [ -z "$first" ]; then first=$n; else
      for f in "$out/$kind.$first"/c_*; do
        cmp -s "$f" "$out/$kind.$n/$(basename "$f")" || { echo "DIFFER: $f at $n ranks"; exit 1; }
      done
    fi
  done
  rm -rf "$out/$kind".*
done
echo "shards identical across rank counts ($ranks); $((text_bytes / 1000000)) MB of JSON lines"
