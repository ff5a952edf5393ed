"""The scaling driver (perf/scaling) on synthetic JSON-lines metrics: step-time medians without
warm-up and checkpoint steps, derived throughput columns, empty cells for missing fields, strong
and weak scaling efficiency, failed runs recorded (not fatal), and the Slurm array it writes.
    python3 tests/scripts/test_scaling.py SOURCE_DIR"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # keep the source tree clean (tests run in it)

SRC = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else ".")
DRIVER = os.path.join(SRC, "perf", "scaling", "scaling.py")
sys.path.insert(0, os.path.join(SRC, "perf", "scaling"))
import metrics  # noqa: E402
import plots  # noqa: E402


def step_records(times, tokens_per_step=1024, flops_per_token=6e6, extra=None, ranks=1):
    """meshtrain-like step records for steps 1..len(times), plus a validation record."""
    out = []
    for i, t in enumerate(times, start=1):
        rate = tokens_per_step / (t / 1e3)
        r = {"step": i, "loss": 5.0, "step_ms": t, "tokens_per_s": rate,
             "tflops": flops_per_token * rate / 1e12 / ranks, "mfu": 0, "memory_bytes": 1000 + i,
             "tokens": i * tokens_per_step}
        r.update((extra or {}).get(i, {}))
        out.append(r)
    out.append({"step": len(times), "val_loss": 4.0})
    return out


def write_run(study, run, records=None, rc=None, log=None):
    d = os.path.join(study, "runs", run["run"])
    os.makedirs(d, exist_ok=True)
    meta = dict(scaling="weak", nodes=1, dp=run["ranks"], pp=1, tp=1, zero=0, micro_batch=8,
                grad_accum=1, seq_len=128, warmup=2, peak_tflops=None, skip="")
    meta.update(run)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    if records is not None:
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))
    if rc is not None:
        with open(os.path.join(d, "exit_code"), "w") as f:
            f.write(f"{rc}\n")
    if log is not None:
        with open(os.path.join(d, "output.log"), "w") as f:
            f.write(log)


class Summary(unittest.TestCase):
    def test_median_skips_warmup_checkpoint_and_validation(self):
        # Steps 1-2 are warm-up, step 6 wrote a checkpoint: left are 10, 12, 11, 13, 14, 12.
        recs = step_records([900, 300, 10, 12, 11, 500, 13, 14, 12],
                            extra={6: {"ckpt_ms": 480.0}}, ranks=2)
        s = metrics.summarize(recs, ranks=2, warmup=2)
        self.assertEqual(s["steps_logged"], 9)
        self.assertEqual(s["steps_used"], 6)
        self.assertAlmostEqual(s["step_ms"], 12.0)
        self.assertEqual((s["step_ms_min"], s["step_ms_max"]), (10, 14))
        self.assertAlmostEqual(s["tokens_per_step"], 1024)
        self.assertAlmostEqual(s["tokens_per_s"], 1024 / 0.012)
        self.assertAlmostEqual(s["tokens_per_s_per_rank"], 1024 / 0.012 / 2)
        self.assertAlmostEqual(s["tflops_per_rank"], 6e6 * 1024 / 0.012 / 2 / 1e12)  # median
        self.assertEqual(s["peak_memory_bytes"], 1009)
        for missing in ("mfu", "bubble_ms", "comm_ms", "tp_comm_ms", "exposed_comm_ms"):
            self.assertNotIn(missing, s)  # -> empty CSV cells
        self.assertAlmostEqual(s["compute_ms"], 12.0)

    def test_breakdown_fields(self):
        # meshtrain's parallel fields: dp comm with its hidden fraction, tp comm, bubble fraction.
        extra = {i: {"bubble": 0.25, "comm_ms": 4.0, "comm_hidden": 0.75, "tp_comm_ms": 2.0}
                 for i in range(1, 6)}
        s = metrics.summarize(step_records([20] * 5, extra=extra, ranks=4), ranks=4, warmup=1,
                              peak_tflops=100)
        self.assertAlmostEqual(s["bubble_ms"], 5.0)
        self.assertAlmostEqual(s["bubble_fraction"], 0.25)
        self.assertAlmostEqual(s["dp_comm_ms"], 4.0)
        self.assertAlmostEqual(s["tp_comm_ms"], 2.0)
        self.assertAlmostEqual(s["comm_ms"], 6.0)
        self.assertAlmostEqual(s["exposed_comm_ms"], 4.0 * 0.25 + 2.0)
        self.assertAlmostEqual(s["compute_ms"], 20 - 3 - 5)
        self.assertAlmostEqual(s["tflops_per_rank"], 6e6 * 1024 / 0.02 / 4 / 1e12)
        self.assertAlmostEqual(s["mfu"], s["tflops_per_rank"] / 100)
        # An explicit exposed time wins; dp comm without its hidden share leaves exposed unknown.
        extra = {i: {"comm_ms": 4.0, "exposed_comm_ms": 1.5} for i in range(1, 6)}
        s = metrics.summarize(step_records([20] * 5, extra=extra), ranks=2, warmup=1)
        self.assertAlmostEqual(s["exposed_comm_ms"], 1.5)
        extra = {i: {"comm_ms": 4.0} for i in range(1, 6)}
        s = metrics.summarize(step_records([20] * 5, extra=extra), ranks=2, warmup=1)
        self.assertNotIn("exposed_comm_ms", s)

    def test_no_steps_after_warmup(self):
        s = metrics.summarize(step_records([10, 10]), ranks=1, warmup=5)
        self.assertEqual(s, {"steps_logged": 2, "steps_used": 0})

    def test_truncated_last_line(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "m.jsonl")
            with open(p, "w") as f:
                f.write(json.dumps({"step": 1, "step_ms": 3}) + "\n{\"step\": 2, \"st")
            self.assertEqual(len(metrics.read_jsonl(p)), 1)


class Study(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.study = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def rows(self):
        return {r["run"]: r for r in metrics.collect(self.study)}

    def test_weak_scaling(self):
        # Weak: tokens per step grow with ranks; efficiency t(N0)/t(N).
        for n, t in ((1, 100.0), (2, 110.0), (4, 125.0), (8, 160.0)):
            write_run(self.study, {"run": f"w{n}", "ranks": n},
                      step_records([999, 999] + [t] * 5, tokens_per_step=1024 * n), rc=0)
        rows = self.rows()
        for n, t in ((1, 100.0), (2, 110.0), (4, 125.0), (8, 160.0)):
            r = rows[f"w{n}"]
            self.assertEqual(r["status"], "ok")
            self.assertEqual(r["baseline_run"], "w1")
            self.assertAlmostEqual(r["efficiency"], 100.0 / t)
            self.assertAlmostEqual(r["speedup"], n * 100.0 / t)
            self.assertAlmostEqual(r["ideal_tokens_per_s"], n * 1024 / 0.1)
            # Scaled speedup = throughput ratio.
            self.assertAlmostEqual(r["speedup"], r["tokens_per_s"] / rows["w1"]["tokens_per_s"])

    def test_strong_scaling_with_failed_and_pending_runs(self):
        for n, t in ((2, 100.0), (4, 55.0), (8, 32.0)):
            write_run(self.study, {"run": f"s{n}", "ranks": n, "scaling": "strong"},
                      step_records([999, 999] + [t] * 5), rc=0)
        # A slower layout at the smallest rank count does not become the baseline.
        write_run(self.study, {"run": "s2pp", "ranks": 2, "scaling": "strong", "dp": 1, "pp": 2},
                  step_records([999, 999] + [140.0] * 5), rc=0)
        write_run(self.study, {"run": "s16", "ranks": 16, "scaling": "strong"}, rc=2,
                  log="step 1\nmeshtrain train: error: tp=16 does not divide n_head=4\n")
        write_run(self.study, {"run": "s32", "ranks": 32, "scaling": "strong"})  # not run yet
        rows = self.rows()
        for n, t in ((2, 100.0), (4, 55.0), (8, 32.0)):
            r = rows[f"s{n}"]
            self.assertEqual(r["baseline_run"], "s2")
            self.assertAlmostEqual(r["speedup"], 100.0 / t)
            self.assertAlmostEqual(r["efficiency"], 100.0 * 2 / (t * n))
        self.assertAlmostEqual(rows["s2pp"]["efficiency"], 100.0 / 140.0)
        failed = rows["s16"]
        self.assertEqual(failed["status"], "failed")
        self.assertEqual(failed["exit_code"], 2)
        self.assertIn("tp=16 does not divide", failed["error"])
        self.assertNotIn("efficiency", failed)
        self.assertEqual(rows["s32"]["status"], "pending")

        # CSV round trip: missing values are empty cells, numbers come back as numbers.
        csv_path = os.path.join(self.study, "scaling.csv")
        metrics.write_csv(list(rows.values()), csv_path)
        with open(csv_path) as f:
            header = f.readline().strip().split(",")
        self.assertEqual(header, metrics.COLUMNS)
        back = {r["run"]: r for r in metrics.read_csv(csv_path)}
        self.assertIsNone(back["s16"]["step_ms"])
        self.assertIsNone(back["s4"]["bubble_ms"])
        self.assertAlmostEqual(back["s8"]["efficiency"], 100.0 * 2 / (32 * 8), places=5)
        table = metrics.markdown_table(list(back.values()))
        self.assertIn("| 16 | 16,1,1 | 0 | 8 x 1 | failed |", table)

        script = plots.gnuplot_script([("data/series0.dat", "pp=1")], [2, 4, 8], "t")
        for name in plots.FIGURES:
            self.assertIn(f"set output '{name}.png'", script)
            self.assertIn(f"set output '{name}.svg'", script)
        self.assertIn("set logscale x 2", script)


FAKE_LAUNCHER = r'''#!{python}
# jobs/local.sh stand-in: -n N train ARGS; writes meshtrain-like metrics, fails at 4 ranks.
import json, sys
n = int(sys.argv[2]); args = sys.argv[4:]
opt = lambda k: args[args.index(k) + 1]
if n == 4:
    print("meshtrain train: error: this build trains on one rank"); sys.exit(2)
steps, mb = int(opt("--train.steps")), int(opt("--train.micro_batch"))
assert opt("--mesh.dp") == str(n) and opt("--train.log_every") == "1"
with open(opt("--train.metrics"), "w") as f:
    for s in range(1, steps + 1):
        t = 50.0 if s <= 2 else 10.0 * (1 + 0.1 * (n - 1))
        f.write(json.dumps({{"step": s, "step_ms": t, "tokens": s * mb * 64 * n,
                            "tokens_per_s": mb * 64 * n / t * 1e3, "memory_bytes": 5 << 20}}) + "\n")
'''


class Driver(unittest.TestCase):
    def test_local_sweep_records_failures(self):
        with tempfile.TemporaryDirectory() as tmp:
            launcher = os.path.join(tmp, "launch")
            with open(launcher, "w") as f:
                f.write(FAKE_LAUNCHER.format(python=sys.executable))
            os.chmod(launcher, 0o755)
            study = os.path.join(tmp, "study")
            subprocess.run([sys.executable, DRIVER, "run", study, "--ranks", "1,2,4,8",
                            "--micro-batch", "2", "--steps", "6", "--warmup", "2",
                            "--launcher", launcher, "--cwd", tmp],
                           check=True, stdout=subprocess.PIPE, env=dict(os.environ, PATH="/usr/bin:/bin"))
            rows = {r["ranks"]: r for r in metrics.read_csv(os.path.join(study, "scaling.csv"))}
            self.assertEqual([rows[n]["status"] for n in (1, 2, 4, 8)],
                             ["ok", "ok", "failed", "ok"])
            self.assertIn("trains on one rank", rows[4]["error"])
            self.assertAlmostEqual(rows[8]["step_ms"], 17.0)
            self.assertAlmostEqual(rows[8]["efficiency"], 10.0 / 17.0, places=5)
            self.assertEqual(rows[2]["steps_used"], 4)
            self.assertTrue(os.path.exists(os.path.join(study, "scaling.md")))

    def test_slurm_arrays(self):
        with tempfile.TemporaryDirectory() as tmp:
            study = os.path.join(tmp, "gpu-study")
            subprocess.run([sys.executable, DRIVER, "slurm", study, "--ranks", "1,2,4,8,16",
                            "--per-node", "4", "--layouts", "*x1x1,*x1x4", "--zero", "1",
                            "--config", "inputs/gpt2-124m.ini", "--array-parallel", "2"],
                           check=True, stdout=subprocess.PIPE)
            lists = {}
            for nodes in (1, 2, 4):
                with open(os.path.join(study, "slurm", f"array_{nodes}n.list")) as f:
                    lists[nodes] = [os.path.basename(p) for p in f.read().split()]
            self.assertEqual(lists[1], ["n001_dp1_pp1_tp1_mb8_z1", "n002_dp2_pp1_tp1_mb8_z1",
                                        "n004_dp4_pp1_tp1_mb8_z1", "n004_dp1_pp1_tp4_mb8_z1"])
            self.assertEqual(len(lists[2]), 2)
            self.assertEqual(len(lists[4]), 2)
            with open(os.path.join(study, "slurm", "submit.sh")) as f:
                submit = f.read()
            self.assertIn("--nodes=2 --gpus-per-node=4 --ntasks-per-node=4 --array=0-1%2 ", submit)
            self.assertIn("jobs/slurm-sweep.sh gpu ", submit)
            run = os.path.join(study, "runs", "n008_dp2_pp1_tp4_mb8_z1")
            with open(os.path.join(run, "args")) as f:
                args = f.read().split("\n")
            self.assertEqual(args[:9], ["--ranks", "8", "--dp", "2", "--pp", "1", "--tp", "4", "train"])
            for a in ("--zero.stage", "--config", os.path.join(run, "metrics.jsonl")):
                self.assertIn(a, args)
            self.assertEqual(args[args.index("--train.grad_accum") + 1], "4")  # weak: x pp x tp


if __name__ == "__main__":
    unittest.main(verbosity=2)
