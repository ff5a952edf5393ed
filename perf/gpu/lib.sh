# Helpers shared by the one-call GPU scripts (perf/gpu/*.sh, perf/archive/gpu-rounds/gpu_round*.sh),
# sourced after the bundle's env.sh. The caller sets: what (comma-separated parts), out (the
# log folder), sum (its summary file) and status=0.
#   has PART            true when PART was asked for
#   note TEXT...        a line on stdout and in the summary
#   run NAME SECS CMD   CMD's output to OUT/NAME.log, cut off after SECS; "== NAME: rc R (T s)"
#                       in the summary; a nonzero rc sets status=1 and is returned
has() { [[ ",$what," == *",$1,"* ]]; }
note() { echo "$*" | tee -a "$sum"; }
run() {
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS rc=0
  timeout -k 5 "$secs" "$@" > "$out/$name.log" 2>&1 || rc=$?
  [ $rc -eq 0 ] || status=1
  note "== $name: rc $rc ($((SECONDS - t0)) s)"
  return $rc
}
