#!/usr/bin/env python3
"""Reads TensorBoard event files without TensorFlow, TensorBoard or protobuf: the TFRecord framing
(length, masked CRC-32C of the length, data, masked CRC-32C of the data) and the protocol-buffer
wire format of Event and Summary (tensorflow/core/util/event.proto, framework/summary.proto),
decoded by hand, so it checks meshtrain's writer (libprotobuf) independently.

  read_tfevents.py DIR                 print every scalar as JSON lines {"step", "tag", "value"}
  read_tfevents.py DIR --metrics FILE  also check them against meshtrain's metrics.jsonl
"""
import argparse
import glob
import json
import math
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    with open(path, "rb") as f:
        blob = f.read()
    at = 0
    while at < len(blob):
        if len(blob) - at < 12:
            raise ValueError(f"{path}: truncated record header at byte {at}")
        head = blob[at:at + 8]
        (n,) = struct.unpack("<Q", head)
        (hc,) = struct.unpack("<I", blob[at + 8:at + 12])
        if hc != masked(head):
            raise ValueError(f"{path}: bad length CRC at byte {at}")
        data = blob[at + 12:at + 12 + n]
        (dc,) = struct.unpack("<I", blob[at + 12 + n:at + 16 + n])
        if len(data) != n or dc != masked(data):
            raise ValueError(f"{path}: bad data CRC at byte {at}")
        yield data
        at += 16 + n


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf):
    """(field number, wire type, value) of a message: ints, bytes, or the raw 4/8 bytes."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt}")
        yield num, wt, v


def events(path):
    for data in records(path):
        ev = {"scalars": {}}
        for num, wt, v in fields(data):
            if num == 1 and wt == 1:
                ev["wall_time"] = struct.unpack("<d", v)[0]
            elif num == 2 and wt == 0:
                ev["step"] = v
            elif num == 3 and wt == 2:
                ev["file_version"] = v.decode()
            elif num == 5 and wt == 2:  # Summary: repeated Value value = 1
                for snum, swt, sv in fields(v):
                    if snum != 1:
                        continue
                    tag, val = None, None
                    for vnum, vwt, vv in fields(sv):
                        if vnum == 1:
                            tag = vv.decode()
                        elif vnum == 2 and vwt == 5:
                            val = struct.unpack("<f", vv)[0]
                    ev["scalars"][tag] = val
        ev.setdefault("step", 0)
        yield ev


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check(evs, metrics_path):
    recs = [json.loads(line) for line in open(metrics_path)]
    steps = {r["step"]: r for r in recs if "loss" in r}
    vals = {r["step"]: r["val_loss"] for r in recs if "val_loss" in r}
    seen = {}
    for e in evs:
        for tag, v in e["scalars"].items():
            seen.setdefault(tag, {})[e["step"]] = v
    for tag, key in [("train/loss", "loss"), ("train/lr", "lr"), ("train/grad_norm", "grad_norm"),
                     ("perf/tokens_per_s", "tokens_per_s"), ("perf/step_ms", "step_ms")]:
        got = seen.get(tag, {})
        if sorted(got) != sorted(steps):
            raise ValueError(f"{tag}: steps {sorted(got)}, metrics have {sorted(steps)}")
        for s, r in steps.items():
            want = r[key]
            if want is None:
                if not math.isnan(got[s]):
                    raise ValueError(f"{tag} at step {s}: {got[s]}, metrics: null")
            # metrics.jsonl keeps 6 significant digits, the event file a float32
            elif abs(got[s] - f32(want)) > 1e-5 * abs(want) + 1e-30:
                raise ValueError(f"{tag} at step {s}: {got[s]}, metrics: {want}")
    mem = seen.get("memory/gib", {})
    for s, r in steps.items():
        if abs(mem[s] - f32(r["memory_bytes"] / 2**30)) > 1e-6 * max(1.0, mem[s]):
            raise ValueError(f"memory/gib at step {s}: {mem[s]}")
    for s, v in vals.items():
        if not abs(seen.get("eval/loss", {}).get(s, float("nan")) - f32(v)) <= 1e-5 * abs(v):
            raise ValueError(f"eval/loss at step {s}: {seen.get('eval/loss', {}).get(s)}, "
                             f"metrics: {v}")
    if any(r.get("ranks", 1) > 1 for r in steps.values()):
        for tag in ("comm/dp_hidden", "comm/dp_exposed_share", "comm/tp_share"):
            if sorted(seen.get(tag, {})) != sorted(steps):
                raise ValueError(f"{tag} missing on a parallel run")
    return seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--metrics")
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.dir, "events.out.tfevents.*")))
    if len(files) != 1:
        sys.exit(f"{a.dir}: {len(files)} event files, expected 1")
    evs = list(events(files[0]))
    if evs[0].get("file_version") != "brain.Event:2":
        sys.exit(f"{files[0]}: the first record is not file_version brain.Event:2: {evs[0]}")
    if a.metrics:
        seen = check(evs[1:], a.metrics)
        print(f"{files[0]}: {len(evs)} records, {len(seen)} tags agree with {a.metrics}")
    else:
        for e in evs[1:]:
            for tag, v in e["scalars"].items():
                print(json.dumps({"step": e["step"], "tag": tag, "value": v}))


if __name__ == "__main__":
    main()
