#!/usr/bin/env python3
"""Figures of perf/cpu/ckpt_async.sh and perf/gpu/ckpt_async.sh from the runs' metrics files.

    ckpt_async_summary.py DIR ROUNDS [TAG]

reads DIR/metrics[_TAG]_{true,false}_{1..ROUNDS}.jsonl (--ckpt.async true / false) and prints
the training thread's time per save (`ckpt_ms` of the save steps) of both, and the step time of
the asynchronous run's steps that ran while a background write was in flight (`ckpt_writing`)
against its steps that did not and the synchronous run's (first step and save steps left out).
"""
import json
import statistics
import sys

out, rounds = sys.argv[1], int(sys.argv[2])
tag = f"_{sys.argv[3]}" if len(sys.argv) > 3 else ""


def load(mode):
    recs = []
    for r in range(1, rounds + 1):
        with open(f"{out}/metrics{tag}_{mode}_{r}.jsonl") as f:
            recs += [json.loads(line) for line in f if '"step_ms"' in line]
    return recs


def saves(recs):
    return [x["ckpt_ms"] for x in recs if x.get("checkpoint")]


def plain(recs, writing):
    return [x["step_ms"] for x in recs
            if x["step"] > 1 and not x.get("checkpoint") and bool(x.get("ckpt_writing")) == writing]


med = statistics.median
a, s = load("true"), load("false")
blk_a, blk_s = saves(a), saves(s)
ov, free_a, free_s = plain(a, True), plain(a, False), plain(s, False)
print(f"saves: {len(blk_a)} async, {len(blk_s)} sync")
if blk_a and blk_s:
    print(f"training-thread time per save: async {med(blk_a):.0f} ms (each: "
          f"{', '.join(f'{x:.0f}' for x in blk_a)}), sync {med(blk_s):.0f} ms (each: "
          f"{', '.join(f'{x:.0f}' for x in blk_s)}); ratio {med(blk_a) / med(blk_s):.3f} "
          f"(target <= 0.10)")
if ov and free_a:
    print(f"step time: {len(ov)} steps during a background write {med(ov):.1f} ms, "
          f"{len(free_a)} steps without {med(free_a):.1f} ms (same run), {len(free_s)} steps of "
          f"the synchronous run {med(free_s):.1f} ms; overlapped / without "
          f"{med(ov) / med(free_a):.3f} (target <= 1.05)")
else:
    print(f"step time: {len(ov)} overlapped steps, {len(free_a)} without: not enough of both")
