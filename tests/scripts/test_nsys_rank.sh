#!/usr/bin/env bash
# jobs/nsys-rank.sh with a fake nsys: each rank profiles into its own report, capturing between
# cudaProfilerStart and cudaProfilerStop, and `--help` reaches meshtrain without a profile.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
cat > "$work/bin/nsys" <<'SH'
#!/bin/sh
echo "nsys $*"
SH
cat > "$work/bin/meshtrain" <<'SH'
#!/bin/sh
echo "meshtrain $*"
SH
chmod +x "$work/bin/nsys" "$work/bin/meshtrain"
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$(cd "$work" && SLURM_PROCID=3 MESHTRAIN_NSYS="$work/bin/nsys" MESHTRAIN_NSYS_EXE="$work/bin/meshtrain" \
  MESHTRAIN_NSYS_ARGS="--trace=cuda,nvtx,mpi" "$src/jobs/nsys-rank.sh" train --profile.steps 2:3)
case $out in
  "nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop --trace=cuda,nvtx,osrt --force-overwrite=true --output=nsys/rank_3 --trace=cuda,nvtx,mpi $work/bin/meshtrain train --profile.steps 2:3") ;;
  *) fail "unexpected nsys call: $out" ;;
esac
[ -d "$work/nsys" ] || fail "the report folder was not made"
out=$(MESHTRAIN_NSYS="$work/bin/nsys" MESHTRAIN_NSYS_EXE="$work/bin/meshtrain" "$src/jobs/nsys-rank.sh" train --help)
[ "$out" = "meshtrain train --help" ] || fail "--help went through nsys: $out"
echo "nsys-rank.sh: ok"
