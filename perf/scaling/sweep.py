"""The runs of a sweep (ranks x layouts x micro-batch x ZeRO stage), their meshtrain arguments,
and the two ways to run them: one after another here through jobs/local.sh (mpirun), or as Slurm
job arrays of jobs/slurm-sweep.sh. Each run is a folder <study>/runs/<id>/ holding meta.json,
`args` (the Slurm script's arguments, one per line), and after it ran: output.log, exit_code,
metrics.jsonl."""
import json
import os
import shlex
import subprocess
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))


def parse_layout(text):
    """'DPxPPxTP' with '*' for "whatever fills the ranks" (default dp): '*x1x1' is pure data
    parallelism, '*x2x2' adds 2 pipeline stages and 2-way tensor parallelism."""
    parts = text.lower().split("x")
    if len(parts) != 3:
        raise ValueError(f"layout '{text}': use DPxPPxTP, e.g. *x1x1 or 2x2x2")
    return tuple(p if p == "*" else int(p) for p in parts)


def layouts_for(ranks, templates):
    """(dp, pp, tp) triples for `ranks` from the templates, those whose product is ranks."""
    out = []
    for tpl in templates:
        fixed = 1
        for p in tpl:
            if p != "*":
                fixed *= p
        if "*" in tpl:
            if ranks % fixed:
                continue
            layout = tuple(ranks // fixed if p == "*" else p for p in tpl)
        else:
            layout = tpl
        if layout[0] * layout[1] * layout[2] == ranks and layout not in out:
            out.append(layout)
    return out


def plan(opts):
    """Runs as dicts (the future meta.json): one per ranks x layout x micro-batch x ZeRO stage.
    Weak scaling keeps the work per rank: global batch = micro_batch x grad_accum x ranks, so a
    DP rank runs grad_accum x pp x tp micro-batches. Strong scaling fixes the global batch
    (--global-batch sequences): a DP rank runs global_batch / (dp x micro_batch) micro-batches."""
    templates = [parse_layout(t) for t in opts.layouts.split(",")]
    runs = []
    for ranks in opts.ranks:
        for dp, pp, tp in layouts_for(ranks, templates):
            for mb in opts.micro_batch:
                for zero in opts.zero:
                    skip = ""
                    if opts.scaling == "weak":
                        ga = opts.grad_accum * pp * tp
                    else:
                        per_dp = opts.global_batch // dp if opts.global_batch % dp == 0 else 0
                        ga = per_dp // mb if per_dp and per_dp % mb == 0 else 0
                        if not ga:
                            skip = (f"global batch {opts.global_batch} is not a multiple of "
                                    f"dp x micro_batch = {dp} x {mb}")
                    run_id = f"n{ranks:03d}_dp{dp}_pp{pp}_tp{tp}_mb{mb}_z{zero}"
                    nodes = 1
                    if opts.per_node:
                        nodes = -(-ranks // opts.per_node)
                        if ranks > opts.per_node and ranks % opts.per_node:
                            skip = skip or f"{ranks} ranks do not fill nodes of {opts.per_node}"
                    runs.append(dict(run=run_id, scaling=opts.scaling, ranks=ranks, nodes=nodes,
                                     dp=dp, pp=pp, tp=tp, zero=zero, micro_batch=mb,
                                     grad_accum=ga, seq_len=opts.seq_len or None,
                                     steps=opts.steps,
                                     warmup=5 if opts.warmup is None else opts.warmup,
                                     peak_tflops=opts.peak_tflops or None, skip=skip))
    return runs


def meshtrain_args(run, run_dir, opts):
    """`train` options of one run (the mesh comes separately: --mesh.* locally, --dp/--pp/--tp
    for the Slurm script). Timing runs: every step logged, no evaluation, no export, no sample."""
    args = ["--train.micro_batch", str(run["micro_batch"]),
            "--train.grad_accum", str(run["grad_accum"]),
            "--train.steps", str(run["steps"]), "--train.log_every", "1",
            "--train.eval_every", "0", "--data.val", "", "--train.save", "false",
            "--train.sample_tokens", "0",
            "--train.out_dir", os.path.join(run_dir, "out"),
            "--train.metrics", os.path.join(run_dir, "metrics.jsonl")]
    if opts.config:
        args = ["--config", opts.config] + args
    if run["seq_len"]:
        args += ["--train.seq_len", str(run["seq_len"])]
    if run["peak_tflops"]:
        args += ["--train.peak_tflops", str(run["peak_tflops"])]
    if run["zero"]:  # stage 0 is the default: a build without ZeRO options still runs it
        args += ["--zero.stage", str(run["zero"])]
    if run["pp"] > 1 and opts.pp_schedule:
        args += ["--pp.schedule", opts.pp_schedule]
    return args + shlex.split(opts.extra or "")


def write_runs(study, runs, opts):
    """Creates <study>/runs/<id>/ with meta.json and args; keeps the results of finished runs
    unless --force. Returns the run folders."""
    dirs = []
    for run in runs:
        d = os.path.join(study, "runs", run["run"])
        os.makedirs(d, exist_ok=True)
        if opts.force:
            for name in ("exit_code", "metrics.jsonl", "output.log"):
                if os.path.exists(os.path.join(d, name)):
                    os.remove(os.path.join(d, name))
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(run, f, indent=1)
        args = ["--ranks", str(run["ranks"]), "--dp", str(run["dp"]), "--pp", str(run["pp"]),
                "--tp", str(run["tp"]), "train"] + meshtrain_args(run, d, opts)
        with open(os.path.join(d, "args"), "w") as f:
            f.write("".join(a + "\n" for a in args))
        dirs.append(d)
    return dirs


def run_local(study, runs, opts, log=print):
    """Runs each run through jobs/local.sh (mpirun -np N --oversubscribe), one after another.
    A failing or timed-out run is recorded (exit_code, output.log) and the sweep goes on."""
    launcher = opts.launcher or os.path.join(REPO, "jobs", "local.sh")
    env = dict(os.environ)
    if opts.exe:
        env["MESHTRAIN_EXE"] = os.path.abspath(opts.exe)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    for run, d in zip(runs, write_runs(study, runs, opts)):
        if run["skip"]:
            log(f"{run['run']}: skipped ({run['skip']})")
            continue
        if os.path.exists(os.path.join(d, "exit_code")) and not opts.force:
            log(f"{run['run']}: done before (exit code kept; --force reruns)")
            continue
        cmd = [launcher, "-n", str(run["ranks"]), "train", "--mesh.dp", str(run["dp"]),
               "--mesh.pp", str(run["pp"]), "--mesh.tp", str(run["tp"])]
        cmd += meshtrain_args(run, d, opts)
        with open(os.path.join(d, "cmd.txt"), "w") as f:
            f.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
        start = time.time()
        with open(os.path.join(d, "output.log"), "w") as out:
            try:
                rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    cwd=opts.cwd or REPO, timeout=opts.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = 124
                out.write(f"\nscaling.py: error: timed out after {opts.timeout} s\n")
        with open(os.path.join(d, "exit_code"), "w") as f:
            f.write(f"{rc}\n")
        log(f"{run['run']}: exit {rc} in {time.time() - start:.0f} s")


def write_slurm(study, runs, opts):
    """One array list per node count and a submit script with one sbatch line per list."""
    dirs = write_runs(study, runs, opts)
    slurm_dir = os.path.join(study, "slurm")
    os.makedirs(slurm_dir, exist_ok=True)
    by_nodes = {}
    for run, d in zip(runs, dirs):
        if not run["skip"]:
            by_nodes.setdefault(run["nodes"], []).append(os.path.abspath(d))
    script = os.path.join(REPO, "jobs", "slurm-sweep.sh")
    lines = ["#!/usr/bin/env bash",
             f"# Submits the sweep '{os.path.basename(study)}': one job array per node count.",
             "# Run from the meshtrain checkout; afterwards: scaling.py collect, then plot.",
             "set -euo pipefail"]
    per_node = opts.per_node
    for nodes, members in sorted(by_nodes.items()):
        lst = os.path.join(slurm_dir, f"array_{nodes}n.list")
        with open(lst, "w") as f:
            f.write("".join(m + "\n" for m in members))
        array = f"0-{len(members) - 1}" + (f"%{opts.array_parallel}" if opts.array_parallel else "")
        res = (f"--gpus-per-node={per_node} --ntasks-per-node={per_node}" if opts.slurm == "gpu"
               else f"--ntasks-per-node={per_node}")
        extra = f" {opts.sbatch_flags}" if opts.sbatch_flags else ""
        job = f"{os.path.basename(study)}-{nodes}n"
        lines.append(f"sbatch --job-name={job} --nodes={nodes} {res} --array={array}{extra} "
                     f"{shlex.quote(script)} {opts.slurm} {shlex.quote(lst)}")
    path = os.path.join(slurm_dir, "submit.sh")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(path, 0o755)
    return path
