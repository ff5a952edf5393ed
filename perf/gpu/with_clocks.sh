#!/usr/bin/env bash
# Run a command while nvidia-smi samples GPU 0's SM clock, power and clock-event reasons every
# 20 ms, then print what the GPU ran at while it was busy: is a kernel slower in one program's
# step than in another's because the clocks differ (power cap, temperature)?
#   perf/gpu/with_clocks.sh LABEL CSV CMD [ARGS...]
# Prints "clocks LABEL: ..." lines over the samples with utilization >= 90 %.
set -uo pipefail
label=$1 csv=$2; shift 2
nvidia-smi -i 0 --query-gpu=timestamp,utilization.gpu,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 20 > "$csv" 2>&1 &
smi=$!
rc=0
"$@" || rc=$?
kill "$smi" 2>/dev/null
wait "$smi" 2>/dev/null
python3 - "$label" "$csv" <<'PY'
import statistics, sys
label, path = sys.argv[1], sys.argv[2]
busy = []
for line in open(path):
    f = [x.strip() for x in line.split(",")]
    try:
        util, sm, power, temp = int(f[1]), float(f[2]), float(f[3]), float(f[4])
        reasons = int(f[5], 16)
    except (ValueError, IndexError):
        continue
    if util >= 90:
        busy.append((sm, power, temp, reasons))
if not busy:
    print(f"clocks {label}: no busy samples in {path}")
    raise SystemExit
med = lambda i: statistics.median(b[i] for b in busy)
# nvmlClocksEventReasons: 0x4 software power cap, 0x20 software thermal, 0x40 hardware thermal
# slowdown, 0x80 hardware power brake.
share = lambda bit: sum(1 for b in busy if b[3] & bit) / len(busy)
print(f"clocks {label}: {len(busy)} busy samples; SM clock median {med(0):.0f} MHz "
      f"(min {min(b[0] for b in busy):.0f}); power median {med(1):.0f} W; temperature median "
      f"{med(2):.0f} C; power-capped {share(0x4):.0%}, thermal {share(0x20 | 0x40):.0%} of them")
PY
exit $rc
