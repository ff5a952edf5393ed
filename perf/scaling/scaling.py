#!/usr/bin/env python3
"""Scaling studies of meshtrain: run a sweep (ranks x layouts x micro-batch x ZeRO stage), collect
each run's JSON-lines metrics into one CSV with strong/weak scaling efficiency, and plot it.

  scaling.py run   STUDY [sweep options]   runs here through jobs/local.sh, then collect + plot
  scaling.py slurm STUDY [sweep options]   writes Slurm job arrays and STUDY/slurm/submit.sh
  scaling.py collect STUDY [--warmup N]    runs -> STUDY/scaling.csv (+ scaling.md table)
  scaling.py plot  STUDY                   STUDY/scaling.csv -> STUDY/plots/*.png, *.svg
  scaling.py plan  STUDY [sweep options]   lists the runs without running anything

Example (perf/README.md, "Scaling studies"):
  perf/scaling/scaling.py run /tmp/scaling-cpu --ranks 1,2,4,8 --layouts '*x1x1' \\
      --config inputs/cpu-bench.ini --micro-batch 4 --steps 12 --warmup 4
Python 3 standard library only; plots need gnuplot.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import metrics  # noqa: E402
import plots  # noqa: E402
import sweep  # noqa: E402


def int_list(text):
    return [int(x) for x in text.split(",") if x]


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 2)[2])
    p.add_argument("command", choices=["run", "slurm", "collect", "plot", "plan"])
    p.add_argument("study", help="study folder (runs/, scaling.csv, plots/)")
    g = p.add_argument_group("sweep")
    g.add_argument("--ranks", type=int_list, default=[1, 2, 4, 8], help="rank counts: 1,2,4,8")
    g.add_argument("--layouts", default="*x1x1",
                   help="DPxPPxTP templates, '*' fills the ranks: '*x1x1,*x2x1,*x1x2' (default "
                        "pure data parallelism); layouts whose product is not a rank count drop")
    g.add_argument("--micro-batch", type=int_list, default=[8], help="micro-batch sizes: 4,8")
    g.add_argument("--zero", type=int_list, default=[0], help="ZeRO stages: 0,1,2,3")
    g.add_argument("--scaling", choices=["weak", "strong"], default="weak",
                   help="weak: batch grows with ranks; strong: fixed --global-batch")
    g.add_argument("--global-batch", type=int, default=64, help="strong scaling: sequences/step")
    g.add_argument("--grad-accum", type=int, default=1, help="weak scaling: micro-batches per rank")
    g.add_argument("--seq-len", type=int, default=0, help="tokens per sequence (0: the config's)")
    g.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    g.add_argument("--warmup", type=int, default=None,
                   help="first steps left out of the timing (default 5; collect: each run's)")
    g.add_argument("--config", help="meshtrain INI file (model, data)")
    g.add_argument("--extra", default="", help="more meshtrain options, one shell-quoted string")
    g.add_argument("--pp-schedule", help="--pp.schedule for runs with pp > 1 (e.g. 1f1b)")
    g.add_argument("--peak-tflops", type=float, default=0, help="per-device peak for MFU")
    g.add_argument("--force", action="store_true", help="rerun runs that have an exit code")
    loc = p.add_argument_group("run (local, mpirun through jobs/local.sh)")
    loc.add_argument("--exe", help="meshtrain executable (default: build/cpu/src/meshtrain)")
    loc.add_argument("--launcher", help="launcher taking '-n N subcommand args' (jobs/local.sh)")
    loc.add_argument("--timeout", type=float, default=900, help="seconds per run")
    loc.add_argument("--cwd", help="working directory of the runs (default: the checkout)")
    sl = p.add_argument_group("slurm (job arrays of jobs/slurm-sweep.sh)")
    sl.add_argument("--slurm", choices=["gpu", "cpu"], default="gpu", help="GPU or CPU nodes")
    sl.add_argument("--per-node", type=int, default=0,
                    help="ranks per node: GPUs per node (gpu) or tasks per node (cpu)")
    sl.add_argument("--array-parallel", type=int, default=0, help="at most this many tasks at once")
    sl.add_argument("--sbatch-flags", default="", help="more sbatch options (--account, --time)")
    p.add_argument("--title", help="plot title (default: the study folder's name)")
    return p


def do_collect(study, warmup):
    rows = metrics.collect(study, warmup)
    csv_path = os.path.join(study, "scaling.csv")
    metrics.write_csv(rows, csv_path)
    with open(os.path.join(study, "scaling.md"), "w") as f:
        f.write(metrics.markdown_table(rows))
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"collect: {len(rows)} runs ({ok} ok) -> {csv_path}")
    return rows


def do_plot(study, title):
    rows = metrics.read_csv(os.path.join(study, "scaling.csv"))
    figures = plots.plot(rows, os.path.join(study, "plots"), title or os.path.basename(study))
    if figures:
        print(f"plot: {len(figures)} figures in {os.path.join(study, 'plots')}")


def main(argv=None):
    opts = parser().parse_args(argv)
    study = os.path.abspath(opts.study)
    if opts.command in ("run", "slurm", "plan"):
        if opts.command == "slurm" and not opts.per_node:
            opts.per_node = 4 if opts.slurm == "gpu" else 1
        runs = sweep.plan(opts)
        if not runs:
            sys.exit("scaling.py: the sweep is empty (check --ranks against --layouts)")
        if opts.command == "plan":
            for r in runs:
                print(f"{r['run']}: ranks {r['ranks']} nodes {r['nodes']} grad_accum "
                      f"{r['grad_accum']}" + (f"  SKIP: {r['skip']}" if r["skip"] else ""))
            return
        os.makedirs(study, exist_ok=True)
        if opts.command == "slurm":
            path = sweep.write_slurm(study, runs, opts)
            print(f"slurm: {len(runs)} runs; submit with {path}; then "
                  f"{sys.argv[0]} collect {opts.study} && {sys.argv[0]} plot {opts.study}")
            return
        sweep.run_local(study, runs, opts)
    if opts.command != "plot":
        do_collect(study, opts.warmup)
    if opts.command in ("run", "plot"):
        do_plot(study, opts.title)


if __name__ == "__main__":
    main()
