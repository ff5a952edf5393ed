"""Scaling plots from the CSV through gnuplot (Debian `gnuplot-nox`; on clusters usually a
module): PNG and SVG of throughput vs ideal, efficiency, memory per rank, and the step-time
breakdown, each with log2(ranks) on x. The CSV stays the source of truth; the gnuplot script and
its data files are written next to the figures so they can be re-plotted or restyled."""
import os
import shutil
import subprocess

FIGURES = ("throughput", "efficiency", "memory", "breakdown")


def series_key(r):
    label = f"pp={r['pp']} tp={r['tp']} ZeRO {r['zero']} mb {r['micro_batch']}"
    return (r["pp"], r["tp"], r["zero"], r["micro_batch"]), label


def write_data(rows, plot_dir):
    """One .dat per series (a line across rank counts) and breakdown.dat; returns the series."""
    data_dir = os.path.join(plot_dir, "data")
    os.makedirs(data_dir, exist_ok=True)
    series = {}
    for r in rows:
        if r["status"] == "ok":
            key, label = series_key(r)
            series.setdefault(key, (label, []))[1].append(r)
    files = []
    for i, (key, (label, members)) in enumerate(sorted(series.items())):
        path = os.path.join(data_dir, f"series{i}.dat")
        with open(path, "w") as f:
            f.write("# ranks tokens_per_s ideal_tokens_per_s efficiency peak_mib step_ms\n")
            for r in sorted(members, key=lambda r: r["ranks"]):
                vals = [r["ranks"], r.get("tokens_per_s"), r.get("ideal_tokens_per_s"),
                        r.get("efficiency"), (r.get("peak_memory_bytes") or 0) / 2**20 or None,
                        r.get("step_ms")]
                f.write(" ".join("NaN" if v is None else f"{v:g}" for v in vals) + "\n")
        files.append((os.path.relpath(path, plot_dir), label))
    with open(os.path.join(data_dir, "breakdown.dat"), "w") as f:
        f.write("# label compute_ms exposed_comm_ms bubble_ms\n")
        for r in sorted((r for r in rows if r["status"] == "ok"),
                        key=lambda r: (r["ranks"], r["pp"], r["tp"], r["zero"], r["micro_batch"])):
            comm = r.get("exposed_comm_ms") or 0
            bubble = r.get("bubble_ms") or 0
            compute = r.get("compute_ms") or (r["step_ms"] - comm - bubble)
            label = f"{r['ranks']}:{r['dp']},{r['pp']},{r['tp']}"
            f.write(f"\"{label}\" {compute:g} {comm:g} {bubble:g}\n")
    return files


def gnuplot_script(files, ranks, title, failed=()):
    """The gnuplot program (paths relative to the plot folder, where it runs): each figure once
    per terminal (pngcairo, svg). `ranks`: every rank count of the sweep; `failed`: those where
    no run succeeded, marked on the rank axis."""
    xt = ", ".join(f'"{n}" {n}' for n in sorted(set(ranks)))
    # Half a doubling of margin either side, so one rank count still gives a proper range.
    xr = f"set xrange [{min(ranks) / 1.41:g}:{max(ranks) * 1.41:g}]"
    common = ["set logscale x 2", xr, f"set xtics ({xt})", "set xlabel 'ranks (log2 scale)'",
              "set grid", "set key outside right top", "set pointsize 1.2"]
    common += [f"set label 'failed' at {n}, graph 0.04 center textcolor rgb 'red'"
               for n in sorted(set(failed))]
    plots = {}
    thr = [f"'{p}' using 1:2 with linespoints lw 2 title '{lab}'" for p, lab in files]
    thr += [f"'{p}' using 1:3 with lines dt 2 lc rgb 'gray40' notitle" for p, _ in files]
    plots["throughput"] = common + ["set logscale y 2", "set ylabel 'tokens/s (job)'",
                                    f"set title '{title}: throughput (dashed: ideal)'",
                                    "plot " + ", \\\n     ".join(thr)]
    eff = ["1 with lines dt 2 lc rgb 'gray40' title 'ideal'"]
    eff += [f"'{p}' using 1:4 with linespoints lw 2 title '{lab}'" for p, lab in files]
    plots["efficiency"] = common + ["set yrange [0:1.15<*]", "set ylabel 'scaling efficiency'",
                                    f"set title '{title}: efficiency'",
                                    "plot " + ", \\\n     ".join(eff)]
    mem = [f"'{p}' using 1:5 with linespoints lw 2 title '{lab}'" for p, lab in files]
    plots["memory"] = common + ["set yrange [0:*]", "set ylabel 'peak memory per rank (MiB)'",
                                f"set title '{title}: memory per rank'",
                                "plot " + ", \\\n     ".join(mem)]
    bd = os.path.join("data", "breakdown.dat")
    plots["breakdown"] = [
        "set style data histograms", "set style histogram rowstacked", "set boxwidth 0.75",
        "set style fill solid 0.85 border -1", "set grid ytics", "set key outside right top",
        "set xtics rotate by -45", "set yrange [0:*]",
        "set xlabel 'ranks:dp,pp,tp (in order of ranks, i.e. log2 spacing)'",
        "set ylabel 'median step time (ms)'",
        f"set title '{title}: step time breakdown'",
        f"plot '{bd}' using 2:xtic(1) title 'compute', '' using 3 title 'exposed comm', "
        "'' using 4 title 'bubble'"]
    out = ["# Written by perf/scaling/scaling.py plot; run in this folder: gnuplot plots.gp"]
    terminals = (("pngcairo size 960,600 noenhanced", "png"),
                 ("svg size 960,600 dynamic noenhanced", "svg"))
    for term, ext in terminals:
        for name in FIGURES:
            out += ["reset", f"set terminal {term}",
                    f"set output '{name}.{ext}'"]
            out += plots[name]
            out.append("unset output")
    return "\n".join(out) + "\n"


def plot(rows, plot_dir, title, log=print):
    """Writes the data and plots.gp, runs gnuplot when it is installed. Returns the figures."""
    os.makedirs(plot_dir, exist_ok=True)
    files = write_data(rows, plot_dir)
    if not files:
        log("plot: no successful runs, nothing to plot")
        return []
    ranks = [r["ranks"] for r in rows]
    ok = {r["ranks"] for r in rows if r["status"] == "ok"}
    failed = [r["ranks"] for r in rows if r["status"] == "failed" and r["ranks"] not in ok]
    gp = os.path.join(plot_dir, "plots.gp")
    with open(gp, "w") as f:
        f.write(gnuplot_script(files, ranks, title, failed))
    if not shutil.which("gnuplot"):
        log(f"plot: gnuplot not found (apt-get install gnuplot-nox); wrote {gp}")
        return []
    subprocess.run(["gnuplot", "plots.gp"], check=True, cwd=plot_dir)
    return [os.path.join(plot_dir, f"{n}.{e}") for n in FIGURES for e in ("png", "svg")]
