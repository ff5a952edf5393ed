"""From each run's JSON-lines metrics to one CSV row, and scaling efficiency across rows.

Metrics contract (meshtrain's `--train.metrics` file, one JSON object per line, written by world
rank 0): step records carry `step` and `step_ms`; records without `step_ms` (validation losses)
are ignored. `tokens` (cumulative) and `tokens_per_s` are the whole job's; `tflops` and `mfu` are
per rank (model FLOP/s of the job / ranks, as MFU is defined); `memory_bytes` is one rank's.
Parallel runs add `comm_ms` (data-parallel gradient communication in the step), `comm_hidden`
(the fraction of it overlapped with backward), `tp_comm_ms` (tensor-parallel communication, on
the critical path) and `bubble` (fraction of the step a pipeline stage idles; or `bubble_ms`);
`exposed_comm_ms`, when present, overrides the exposed time derived from those. Steps that wrote
a checkpoint (`checkpoint`, `ckpt_ms` > 0) are left out of the timing. Missing values stay empty
in the CSV.
"""
import csv
import json
import math
import os
import statistics

#: The CSV's columns, in order. Configuration first, then measurements, then scaling.
COLUMNS = [
    "run", "status", "exit_code", "scaling", "ranks", "nodes", "dp", "pp", "tp", "zero",
    "micro_batch", "grad_accum", "seq_len", "steps_logged", "steps_used",
    "step_ms", "step_ms_min", "step_ms_max", "tokens_per_step", "tokens_per_s",
    "tokens_per_s_per_rank", "tflops_per_rank", "mfu", "bubble_fraction", "bubble_ms",
    "dp_comm_ms", "dp_comm_hidden", "tp_comm_ms", "comm_ms", "exposed_comm_ms", "compute_ms",
    "peak_memory_bytes",
    "baseline_run", "ideal_tokens_per_s", "speedup", "efficiency", "error",
]


def read_jsonl(path):
    """Records of a JSON-lines file; a truncated last line (a killed run) is skipped."""
    records = []
    if not os.path.exists(path):
        return records
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def is_checkpoint_step(r):
    return bool(r.get("checkpoint") or r.get("ckpt") or r.get("saved")
                or (r.get("ckpt_ms") or 0) > 0 or (r.get("checkpoint_ms") or 0) > 0)


def _median(records, key):
    values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def summarize(records, ranks, warmup, peak_tflops=None):
    """Step-time statistics of one run: medians over the steps after `warmup` (step numbers
    1..warmup are excluded) that did not write a checkpoint."""
    steps = [r for r in records if isinstance(r.get("step_ms"), (int, float))]
    used = [r for r in steps if r.get("step", 0) > warmup and not is_checkpoint_step(r)]
    out = {"steps_logged": len(steps), "steps_used": len(used)}
    if not used:
        return out
    t = statistics.median(r["step_ms"] for r in used)
    out.update(step_ms=t, step_ms_min=min(r["step_ms"] for r in used),
               step_ms_max=max(r["step_ms"] for r in used))
    # Tokens per step from the cumulative count (job-wide), else from the rate field.
    last = steps[-1]
    if last.get("tokens") and last.get("step"):
        tokens_per_step = last["tokens"] / last["step"]
    else:
        rate = _median(used, "tokens_per_s")
        tokens_per_step = rate * t / 1e3 if rate else None
    if tokens_per_step:
        out["tokens_per_step"] = tokens_per_step
        out["tokens_per_s"] = tokens_per_step / (t / 1e3)
        out["tokens_per_s_per_rank"] = out["tokens_per_s"] / ranks
    tflops = _median(used, "tflops")  # per rank
    if tflops:
        out["tflops_per_rank"] = tflops
    if peak_tflops and out.get("tflops_per_rank"):
        out["mfu"] = out["tflops_per_rank"] / peak_tflops
    else:
        mfu = _median(used, "mfu")
        if mfu:
            out["mfu"] = mfu
    bubble_ms = _median(used, "bubble_ms")
    bubble = _median(used, "bubble")
    if bubble_ms is None and bubble is not None:
        bubble_ms = bubble * t if bubble <= 1 else bubble  # a fraction, or already ms
    if bubble_ms is not None:
        out["bubble_ms"] = bubble_ms
        out["bubble_fraction"] = bubble_ms / t
    dp_comm, tp_comm = _median(used, "comm_ms"), _median(used, "tp_comm_ms")
    hidden = _median(used, "comm_hidden")
    exposed = _median(used, "exposed_comm_ms")
    if dp_comm is not None:
        out["dp_comm_ms"] = dp_comm
    if hidden is not None:
        out["dp_comm_hidden"] = hidden
    if tp_comm is not None:
        out["tp_comm_ms"] = tp_comm
    if dp_comm is not None or tp_comm is not None:
        out["comm_ms"] = (dp_comm or 0) + (tp_comm or 0)
    known = dp_comm is None or hidden is not None  # dp comm without its hidden share: unknown
    if exposed is None and known and out.get("comm_ms") is not None:
        # Per step: the dp part not overlapped, plus all of tp (blocking); then the median.
        per_step = [(r.get("comm_ms") or 0) * (1 - (r.get("comm_hidden") or 0))
                    + (r.get("tp_comm_ms") or 0) for r in used]
        exposed = statistics.median(per_step)
    if exposed is not None:
        out["exposed_comm_ms"] = exposed
    out["compute_ms"] = t - (exposed or 0) - (bubble_ms or 0)
    memory = [r["memory_bytes"] for r in steps if isinstance(r.get("memory_bytes"), (int, float))]
    if memory:
        out["peak_memory_bytes"] = max(memory)
    return out


def last_error(log_path):
    """The line of a run's output that explains a failure (meshtrain prints one), else its last."""
    if not os.path.exists(log_path):
        return ""
    with open(log_path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    for line in reversed(lines):
        low = line.lower()
        if "error" in low or "refuse" in low or "cannot" in low or "must" in low:
            return line[:300]
    return lines[-1][:300] if lines else ""


def collect_run(run_dir, warmup=None):
    """One CSV row (dict) for a run folder: meta.json, exit_code, metrics.jsonl, output.log.
    warmup None: the run's own (meta.json)."""
    with open(os.path.join(run_dir, "meta.json")) as f:
        meta = json.load(f)
    row = {k: meta.get(k) for k in ("run", "scaling", "ranks", "nodes", "dp", "pp", "tp", "zero",
                                     "micro_batch", "grad_accum", "seq_len")}
    rc_path = os.path.join(run_dir, "exit_code")
    rc = None
    if os.path.exists(rc_path):
        with open(rc_path) as f:
            text = f.read().strip()
        rc = int(text) if text.lstrip("-").isdigit() else None
    row["exit_code"] = rc
    records = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    if warmup is None:
        warmup = meta.get("warmup", 5)
    row.update(summarize(records, meta["ranks"], warmup, meta.get("peak_tflops")))
    if meta.get("skip"):
        row["status"], row["error"] = "skipped", meta["skip"]
    elif rc is None:
        row["status"] = "pending" if not records else "incomplete"
    elif rc != 0:
        row["status"] = "failed"
        row["error"] = last_error(os.path.join(run_dir, "output.log"))
    elif not row.get("step_ms"):
        row["status"], row["error"] = "no-data", "no timed steps after warm-up"
    else:
        row["status"] = "ok"
    return row


def add_scaling(rows):
    """Speedup and efficiency of each successful row against its group's baseline: the fastest
    run at the smallest rank count among rows of the same scaling mode, ZeRO stage and
    micro-batch. Strong scaling (fixed global batch): speedup t0/t, efficiency t0*N0/(t*N).
    Weak scaling (batch grows with ranks): efficiency t0/t, speedup (N/N0)*t0/t (scaled)."""
    groups = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault((r["scaling"], r["zero"], r["micro_batch"]), []).append(r)
    for members in groups.values():
        n0 = min(r["ranks"] for r in members)
        base = min((r for r in members if r["ranks"] == n0), key=lambda r: r["step_ms"])
        t0 = base["step_ms"]
        for r in members:
            n, t = r["ranks"], r["step_ms"]
            r["baseline_run"] = base["run"]
            if r["scaling"] == "weak":
                r["efficiency"] = t0 / t
                r["speedup"] = (n / n0) * t0 / t
            else:
                r["efficiency"] = t0 * n0 / (t * n)
                r["speedup"] = t0 / t
            if base.get("tokens_per_s"):
                r["ideal_tokens_per_s"] = base["tokens_per_s"] * n / n0
    return rows


def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return f"{v:.6g}"
    return str(v)


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([_fmt(r.get(c)) for c in COLUMNS])


def read_csv(path):
    """Rows with numbers parsed back (empty cells are None)."""
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row = {}
            for k, v in raw.items():
                if v == "":
                    row[k] = None
                    continue
                try:
                    row[k] = int(v)
                except ValueError:
                    try:
                        row[k] = float(v)
                    except ValueError:
                        row[k] = v
            rows.append(row)
    return rows


def collect(study_dir, warmup=None):
    """Rows of every run under <study>/runs, sorted by ranks, with scaling columns."""
    runs_dir = os.path.join(study_dir, "runs")
    rows = [collect_run(os.path.join(runs_dir, d), warmup) for d in sorted(os.listdir(runs_dir))
            if os.path.exists(os.path.join(runs_dir, d, "meta.json"))]
    rows.sort(key=lambda r: (r["ranks"], r["pp"], r["tp"], r["zero"], r["micro_batch"]))
    return add_scaling(rows)


def markdown_table(rows):
    """A README table of the CSV's main columns."""
    head = ["ranks", "dp,pp,tp", "ZeRO", "mb x ga", "status", "step ms", "tokens/s",
            "tokens/s/rank", "efficiency", "peak MiB/rank"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        def num(key, fmt):
            v = r.get(key)
            return fmt.format(v) if isinstance(v, (int, float)) else ""
        mem = r.get("peak_memory_bytes")
        cells = [str(r["ranks"]), f"{r['dp']},{r['pp']},{r['tp']}", str(r["zero"]),
                 f"{r['micro_batch']} x {r['grad_accum']}", r["status"], num("step_ms", "{:.1f}"),
                 num("tokens_per_s", "{:.0f}"), num("tokens_per_s_per_rank", "{:.0f}"),
                 num("efficiency", "{:.2f}"), f"{mem / 2**20:.0f}" if mem else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
