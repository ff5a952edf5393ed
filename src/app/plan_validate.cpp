// `meshtrain plan --plan.validate K`: the top K layouts trained for a few steps on this job's
// ranks, predicted vs measured, and the calibration's scale factors refitted from them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "meshtrain/app/plan_cmd.hpp"
#include "meshtrain/app/plan_run.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/io/dataset.hpp"
#include "meshtrain/io/token_shard.hpp"

namespace meshtrain::app {

namespace {

// Random tokens in a shard of this rank's own (every rank reads the same values).
std::string random_shard(int rank, int vocab) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / cat("meshtrain_plan_tokens_", ::getpid(), "_", rank);
  fs::create_directories(dir);
  std::vector<std::uint16_t> t(1 << 17);
  std::uint64_t s = 0x9e3779b97f4a7c15ull;
  for (auto& x : t) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = static_cast<std::uint16_t>(s % static_cast<std::uint64_t>(std::min(vocab, 65535)));
  }
  io::write_shard((dir / "data_000000.bin").string(), t);
  return (dir / "data_*.bin").string();
}

}  // namespace

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<ValidationRow> validate_layouts(MPI_Comm world, const model::GptConfig& cfg,
                                            int seq_len, const std::vector<plan::Candidate>& c,
                                            const plan::SearchOptions& opt,
                                            const plan::Calibration& cal, int steps,
                                            const std::string& data) {
  (void)opt;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  const std::string pattern = data.empty() ? random_shard(rank, cfg.vocab_size) : data;
  const io::TokenDataset ds(pattern, seq_len);
  ds.check_vocab(cfg.vocab_size);
  std::vector<ValidationRow> rows;
  double mem_worst = 0;
  std::vector<double> apes, apes_corr;
  const bool probe = cal.device == "cpu" && cal.probe_alone_s > 0;
  if (rank == 0)
    std::printf("\nvalidation on this job (%d steps each, the first not timed)%s:\n"
                "%-34s %10s %10s %8s %10s %8s %11s %11s %8s\n",
                steps, probe ? "; 'load-corr.' = prediction x (speed at calibration / speed now)" : "",
                "layout", "predicted", "measured", "error", "load-corr.", "error", "pred. mem",
                "measured", "error");
  for (const auto& cand : c) {
    double load = 1;
    if (probe) {
      const MachineProbe now = probe_machine(world);
      load = now.alone_s / cal.probe_alone_s;  // the model owns the ranks' interference
    }
    const LayoutRun run = run_layout(world, cfg, seq_len, cand.layout, ds, std::max(steps, 2));
    double peak = run.peak_bytes, worst = 0;
    MPI_Allreduce(&peak, &worst, 1, MPI_DOUBLE, MPI_MAX, world);
    ValidationRow row;
    row.predicted = cand;
    row.measured_step_s = run.median_step(1);
    row.measured_memory = worst;
    row.load_factor = load;
    rows.push_back(row);
    // The tracker sees Kokkos allocations only: compare without the runtime overhead.
    const double pmem = cand.memory.total() - cand.memory.runtime;
    const double m = row.measured_step_s, p = cand.cost.step_s, pc = p * load;
    const double se = (p - m) / m, sc = (pc - m) / m, me = (pmem - worst) / worst;
    apes.push_back(std::fabs(se));
    apes_corr.push_back(std::fabs(sc));
    mem_worst = std::max(mem_worst, std::fabs(me));
    if (rank == 0)
      std::printf("%-34s %8.1fms %8.1fms %+7.1f%% %8.1fms %+7.1f%% %11s %11s %+7.2f%%\n",
                  cand.layout.short_name().c_str(), p * 1e3, m * 1e3, 100 * se, pc * 1e3,
                  100 * sc, plan::format_bytes(pmem).c_str(), plan::format_bytes(worst).c_str(),
                  100 * me);
  }
  if (rank == 0 && !apes.empty()) {
    std::printf("step time: median absolute percentage error %.1f%% (load-corrected %.1f%%); "
                "memory: largest error %.2f%%\n",
                100 * median_of(apes), 100 * median_of(apes_corr), 100 * mem_worst);
  }
  return rows;
}

void refit_scales(const std::vector<ValidationRow>& rows, plan::Calibration& cal) {
  if (rows.empty()) return;
  // Split each prediction into what scale_compute and scale_comm multiply (already applied),
  // divide the current scales out, and fit measured = a X + b Y.
  double sxx = 0, sxy = 0, syy = 0, sxm = 0, sym = 0;
  for (const auto& r : rows) {
    // The parts the two scales multiply, with the current scales divided out, times the load
    // factor (shared cores, other jobs) that the model does not own.
    const auto& c = r.predicted.cost;
    const double k = r.load_factor * c.contention;  // the factors the scales do not own
    const double X = k * (c.compute_s + c.optimizer_s + c.pp_bubble_s + c.overhead_s) /
                     cal.scale_compute;
    const double Y = k * (c.tp_comm_s + c.pp_comm_s + c.dp_comm_s + c.zero3_gather_s) /
                     cal.scale_comm;
    const double m = r.measured_step_s;
    sxx += X * X, sxy += X * Y, syy += Y * Y, sxm += X * m, sym += Y * m;
  }
  const double det = sxx * syy - sxy * sxy;
  double a = 0, b = 0;
  if (det > 1e-12 * sxx * syy && syy > 0) {
    a = (sxm * syy - sym * sxy) / det;
    b = (sym * sxx - sxm * sxy) / det;
  }
  if (!(a > 0 && b > 0)) {  // not separable: one factor for both
    a = b = (sxm + sym) / (sxx + 2 * sxy + syy);
  }
  auto clamp = [](double v, double old) { return std::clamp(v, 0.2 * old, 5.0 * old); };
  cal.scale_compute = clamp(a, cal.scale_compute);
  cal.scale_comm = clamp(b, cal.scale_comm);
  cal.validated_layouts += static_cast<int>(rows.size());
}

}  // namespace meshtrain::app
