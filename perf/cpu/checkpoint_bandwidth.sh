#!/usr/bin/env bash
# Parallel HDF5 checkpoint bandwidth next to dd on the same disk, measured in the same run.
#
#   cmake --preset cpu && cmake --build build/cpu --target bench_checkpoint   # builds nothing itself
#   perf/cpu/checkpoint_bandwidth.sh [build-dir=build/cpu] [dir=/tmp/meshtrain_ckpt_bench] [scale=1]
#                                [reps=3] [ranks="1 2 4"] [io="automatic collective"]
#   BENCH_ARGS="--tp 2" perf/cpu/checkpoint_bandwidth.sh ...   # extra bench_checkpoint options
#
# For each rank count and data-transfer mode, perf/bench/bench_checkpoint saves and loads a GPT-2 124M
# checkpoint (model + AdamW moments, 1.49 GB; --scale shrinks it) in `dir`, each rank holding its
# data-parallel partition. dd writes and reads a file of the same size in the same directory
# before and after (median of all dd runs):
#   write: dd if=/dev/zero bs=16M conv=fdatasync (data on the disk before dd exits);
#   read cold: after `dd iflag=nocache count=0`, which drops the file's pages from this
#     machine's page cache (no root needed; a hypervisor's or a controller's cache may still
#     serve the data), and the checkpoint's cold read after posix_fadvise(DONTNEED) alike;
#   read direct: iflag=direct (O_DIRECT, no page cache at all);
#   read warm: again at once, from the page cache.
# Figures are GB/s = 1e9 bytes per second; meshtrain's include its checksums, fsync and commit.
# MPIEXEC (default mpiexec) and MPIFLAGS (default --oversubscribe) set the launcher.
set -euo pipefail

build="${1:-build/cpu}"
dir="${2:-/tmp/meshtrain_ckpt_bench}"
scale="${3:-1}"
reps="${4:-3}"
ranks="${5:-1 2 4}"
ios="${6:-automatic collective}"
bench="$build/perf/bench/bench_checkpoint"
[[ -x "$bench" ]] || { echo "checkpoint_bandwidth.sh: $bench not found; build it first" >&2; exit 2; }
if [[ "$(id -u)" == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpiexec="${MPIEXEC:-mpiexec}"
read -r -a mpiflags <<< "${MPIFLAGS:---oversubscribe}"

mkdir -p "$dir"
ddfile="$dir/dd.bin"
log="$(mktemp)"
trap 'rm -f "$log" "$ddfile"' EXIT

echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== disk of $dir: $(df -h "$dir" | tail -1 | awk '{print $1", "$2" total, "$4" free"}')"

bench_run() {  # ranks io
  "$mpiexec" -n "$1" "${mpiflags[@]}" "$bench" --dir "$dir/ckpt" --scale "$scale" --reps "$reps" \
    --io "$2" ${BENCH_ARGS:-} | tee -a "$log" | sed 's/^/   /'
}
secs() { awk '/copied/ {print $(NF-3)}'; }
dd_round() {  # one write, cold, direct and warm read of $count x 16 MiB
  local w c d h
  w=$(dd if=/dev/zero of="$ddfile" bs=16M count="$count" conv=fdatasync 2>&1 | secs)
  dd if="$ddfile" iflag=nocache count=0 status=none
  c=$(dd if="$ddfile" of=/dev/null bs=16M 2>&1 | secs)
  d=$(dd if="$ddfile" of=/dev/null bs=16M iflag=direct 2>&1 | secs)
  h=$(dd if="$ddfile" of=/dev/null bs=16M 2>&1 | secs)
  echo "DD write_s=$w read_cold_s=$c read_direct_s=$d read_warm_s=$h" | tee -a "$log" | sed 's/^/   /'
  rm -f "$ddfile"
}

first=1
for n in $ranks; do
  for io in $ios; do
    echo "-- bench_checkpoint, $n rank(s), --io $io"
    bench_run "$n" "$io"
    if ((first)); then
      bytes=$(sed -n 's/^RESULT .* bytes=\([0-9]*\).*/\1/p' "$log" | head -1)
      count=$(( (bytes + 16777215) / 16777216 ))
      echo "-- dd, $count x 16 MiB ($((count * 16777216)) bytes), $reps rounds"
      for ((r = 0; r < reps; ++r)); do dd_round; done
      first=0
    fi
  done
done
echo "-- dd again, $reps rounds"
for ((r = 0; r < reps; ++r)); do dd_round; done

# Summary: GB/s; dd the median of its rounds; meshtrain as a share of dd.
awk -v ddbytes="$((count * 16777216))" '
  function med(a, n,   i, j, t) {
    for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return a[int((n + 1) / 2)]
  }
  function val(k,   i, p) { for (i = 1; i <= NF; ++i) { split($i, p, "="); if (p[1] == k) return p[2] } }
  /^DD / { ++nd; w[nd] = val("write_s"); c[nd] = val("read_cold_s"); d[nd] = val("read_direct_s"); h[nd] = val("read_warm_s") }
  /^RESULT / { ++nr; io[nr] = val("io"); rk[nr] = val("ranks"); by[nr] = val("bytes")
               rw[nr] = val("write_s"); rc[nr] = val("read_cold_s"); rh[nr] = val("read_warm_s")
               rn[nr] = val("read_cold_noverify_s") }
  END {
    dw = ddbytes / med(w, nd) / 1e9; dc = ddbytes / med(c, nd) / 1e9
    dd_ = ddbytes / med(d, nd) / 1e9; dh = ddbytes / med(h, nd) / 1e9
    printf "\n%-32s %12s %15s %15s %15s\n", "GB/s (share of dd)", "write", "read cold", "read warm", "cold, no verify"
    printf "%-32s %5.2f %6s %8.2f %6s %8.2f %6s %8.2f %6s  (dd O_DIRECT read %.2f)\n", \
      "dd, same size, same disk", dw, "", dc, "", dh, "", dc, "", dd_
    for (i = 1; i <= nr; ++i) {
      b = by[i] / 1e9
      printf "%-32s %5.2f (%3.0f%%) %8.2f (%3.0f%%) %8.2f (%3.0f%%) %8.2f (%3.0f%%)\n", \
        sprintf("meshtrain %d rank%s, %s", rk[i], rk[i] > 1 ? "s" : "", io[i]), \
        b / rw[i], 100 * b / rw[i] / dw, b / rc[i], 100 * b / rc[i] / dc, \
        b / rh[i], 100 * b / rh[i] / dh, b / rn[i], 100 * b / rn[i] / dc
    }
  }' "$log"
