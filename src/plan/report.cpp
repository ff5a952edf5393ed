#include "meshtrain/plan/report.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/json.hpp"

namespace meshtrain::plan {

namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// The estimates are written to six significant digits, MFU to four decimals and byte counts
// whole: figures of a model, not measurements.
constexpr json::Style kReportStyle{100, 6, 2};  // one candidate per line

double four_decimals(double v) { return std::round(v * 1e4) / 1e4; }

Json candidate_object(const Candidate& c, const SearchResult& r) {
  const Layout& l = c.layout;
  Json o = Json::object();
  o["layout"] = l.name();
  o["dp"] = l.dp;
  o["pp"] = l.pp;
  o["tp"] = l.tp;
  o["cp"] = l.cp;
  o["zero_stage"] = l.zero_stage;
  o["offload"] = l.offload;
  o["micro_batch"] = l.micro_batch;
  o["grad_accum"] = l.n_micro;
  o["schedule"] = parallel::schedule_name(l.schedule);
  o["virtual_chunks"] = l.virtual_chunks;
  o["sequence_parallel"] = l.sequence_parallel;
  o["recompute"] = l.recompute;
  o["recompute_mlp_act"] = l.recompute_mlp_act;
  o["precision"] = precision_name(l.precision);  // the activations'; fp8: the linears'
  if (l.fp8)
    o["fp8"] = {{"recipe", l.fp8_rowwise ? "rowwise" : "tensorwise"},
                {"first_last_bf16", l.fp8_first_last_bf16},
                {"wgrad_bf16", l.fp8_wgrad_bf16},
                {"experts", l.fp8_experts}};
  o["memory_bytes"] = std::llround(c.memory.device());
  o["host_bytes"] = std::llround(c.memory.host());
  o["peak_stage"] = c.memory.stage;
  o["step_s"] = c.cost.step_s;
  o["tokens_per_s"] = c.cost.tokens_per_s;
  o["mfu"] = four_decimals(c.cost.mfu);
  o["bottleneck"] = c.cost.bottleneck;
  o["family"] = family(l);
  o["rule"] = rule_agreement(r, c);
  o["parts_s"] = {{"compute", c.cost.compute_s},    {"tp", c.cost.tp_comm_s},
                  {"bubble", c.cost.pp_bubble_s},   {"p2p", c.cost.pp_comm_s},
                  {"dp", c.cost.dp_comm_s},         {"zero3", c.cost.zero3_gather_s},
                  {"optimizer", c.cost.optimizer_s}, {"overhead", c.cost.overhead_s},
                  {"cp", c.cost.cp_comm_s},         {"cp_total", c.cost.cp_comm_total_s}};
  if (l.fp8) {  // parts of "compute": the GEMMs at the FP8 rate, the casts
    o["parts_s"]["fp8_gemm"] = c.cost.fp8_gemm_s;
    o["parts_s"]["fp8_cast"] = c.cost.fp8_cast_s;
  }
  return o;
}

}  // namespace

std::string format_table(const SearchResult& r, const model::GptConfig& cfg, int seq_len,
                         const SearchOptions& opt, const Calibration& cal, int top) {
  std::ostringstream o;
  const long gb = opt.global_batch > 0 ? opt.global_batch : default_global_batch(opt.cluster.world);
  o << "model: " << cfg.describe() << ", seq " << seq_len << ", " << precision_name(opt.precision)
    << (opt.fp8 ? cat(" + fp8 linears (", opt.fp8_rowwise ? "rowwise" : "tensorwise", ")")
                : std::string())
    << "\ncluster: " << opt.cluster.world << " devices, " << opt.cluster.gpus_per_node
    << " per node, "
    << (opt.cluster.memory_bytes > 0 ? format_bytes(opt.cluster.memory_bytes) : std::string("unlimited"))
    << " each; global batch " << gb << " sequences (" << gb * seq_len << " tokens)\n"
    << "calibration: " << cal.machine
    << (cal.measured ? " (measured " + cal.date + ")"
                     : std::string(" (derived from documented figures, NOT measured here)"))
    << (cal.validated_layouts ? cat(", scales compute ", cal.scale_compute, " comm ",
                                    cal.scale_comm, " from ", cal.validated_layouts,
                                    " validated layouts")
                              : std::string())
    << "\nlinks: intra-node " << cal.intra.busbw_gbs << " GB/s, " << cal.intra.alpha_us
    << " us; inter-node " << cal.inter.busbw_gbs << " GB/s, " << cal.inter.alpha_us << " us\n"
    << "searched " << r.enumerated << " layouts: " << r.invalid << " invalid for the model, "
    << r.pruned_memory << " over memory, " << r.ranked.size() << " fit\n"
    << (r.too_many_micro
            ? cat("not evaluated: ", r.too_many_micro, " (dp, pp, tp, micro-batch) choices that need "
                  "more than ", opt.max_micro_batches, " micro-batches per step (global batch ",
                  opt.global_batch > 0 ? opt.global_batch : default_global_batch(opt.cluster.world),
                  " sequences; a sequence count, not tokens? larger --plan.micro_batches reach "
                  "them)\n")
            : std::string())
    << "seeds' rule for this case: " << r.scenario.rule << "\n\n";
  if (r.ranked.empty()) {
    o << "no layout fits: more devices, a smaller micro-batch or model, or more memory\n";
    return o.str();
  }
  char line[400];
  std::snprintf(line, sizeof line, "%3s  %-34s %10s %10s %12s %6s  %-22s %s\n", "#", "layout (dp x pp x tp)",
                "mem/rank", "step", "tokens/s", "MFU", "bottleneck", "rule of thumb");
  o << line;
  for (int i = 0; i < top && i < static_cast<int>(r.ranked.size()); ++i) {
    const Candidate& c = r.ranked[static_cast<std::size_t>(i)];
    std::snprintf(line, sizeof line, "%3d  %-34s %10s %8.1fms %12.0f %5.1f%%  %-22s %s: %s\n",
                  i + 1, c.layout.short_name().c_str(), format_bytes(c.memory.device()).c_str(),
                  c.cost.step_s * 1e3, c.cost.tokens_per_s, 100 * c.cost.mfu,
                  c.cost.bottleneck.c_str(), family(c.layout).c_str(),
                  rule_agreement(r, c).c_str());
    o << line;
  }
  const Candidate& b = r.ranked.front();
  o << "\n#1 in detail: " << b.layout.name() << "\n  memory (stage " << b.memory.stage
    << "): params " << format_bytes(b.memory.params) << ", grads "
    << format_bytes(b.memory.grads) << ", optimizer " << format_bytes(b.memory.optimizer)
    << ", activations " << format_bytes(b.memory.activations) << " (" << b.memory.slots
    << " slot(s)), head " << format_bytes(b.memory.head) << ", scratch "
    << format_bytes(b.memory.scratch) << ", buffers " << format_bytes(b.memory.comm_buffers)
    << ", workspace " << format_bytes(b.memory.workspace) << ", runtime "
    << format_bytes(b.memory.runtime)
    << (b.memory.host() > 0 ? ", host " + format_bytes(b.memory.host()) : std::string())
    << "\n  step: compute " << fmt("%.1f", b.cost.compute_s * 1e3) << " ms (GEMM "
    << fmt("%.1f", b.cost.gemm_s * 1e3)
    << (b.layout.fp8 ? " of which FP8 " + fmt("%.1f", b.cost.fp8_gemm_s * 1e3) + ", FP8 casts " +
                           fmt("%.1f", b.cost.fp8_cast_s * 1e3)
                     : std::string())
    << ", attention " << fmt("%.1f", b.cost.attention_s * 1e3)
    << ", memory-bound " << fmt("%.1f", b.cost.membound_s * 1e3) << "), tp "
    << fmt("%.1f", b.cost.tp_comm_s * 1e3) << ", bubble " << fmt("%.1f", b.cost.pp_bubble_s * 1e3)
    << ", p2p " << fmt("%.1f", b.cost.pp_comm_s * 1e3) << ", dp exposed "
    << fmt("%.1f", b.cost.dp_comm_s * 1e3) << " of " << fmt("%.1f", b.cost.dp_comm_total_s * 1e3)
    << (b.layout.cp > 1 ? ", cp ring exposed " + fmt("%.1f", b.cost.cp_comm_s * 1e3) + " of " +
                                fmt("%.1f", b.cost.cp_comm_total_s * 1e3)
                          : std::string())
    << ", ZeRO-3 gathers " << fmt("%.1f", b.cost.zero3_gather_s * 1e3) << ", optimizer "
    << fmt("%.1f", b.cost.optimizer_s * 1e3) << ", overhead "
    << fmt("%.1f", b.cost.overhead_s * 1e3)
    << (b.cost.contention > 1.001 ? ", x" + fmt("%.2f", b.cost.contention) + " cores shared"
                                  : std::string())
    << "\n";
  return o.str();
}

std::string candidate_json(const Candidate& c, const SearchResult& r) {
  return json::dump(candidate_object(c, r), {0, kReportStyle.significant});
}

std::string to_json(const SearchResult& r, const model::GptConfig& cfg, int seq_len,
                    const SearchOptions& opt, const Calibration& cal, int top) {
  Json o = Json::object();
  o["model"] = cfg.describe();
  o["seq_len"] = seq_len;
  o["world"] = opt.cluster.world;
  o["gpus_per_node"] = opt.cluster.gpus_per_node;
  o["memory_bytes"] = std::llround(opt.cluster.memory_bytes);
  o["global_batch"] = opt.global_batch > 0 ? opt.global_batch : default_global_batch(opt.cluster.world);
  o["calibration"] = cal.machine;
  o["calibration_measured"] = cal.measured;
  o["rule"] = r.scenario.rule;
  o["enumerated"] = r.enumerated;
  o["invalid"] = r.invalid;
  o["pruned_memory"] = r.pruned_memory;
  o["too_many_micro_batches"] = r.too_many_micro;
  Json& layouts = o["layouts"] = Json::array();
  for (int i = 0; i < top && i < static_cast<int>(r.ranked.size()); ++i)
    layouts.push_back(candidate_object(r.ranked[static_cast<std::size_t>(i)], r));
  return json::dump(o, kReportStyle) + "\n";
}

std::string layout_ini(const Layout& l, int seq_len, const std::string& model_section) {
  std::ostringstream o;
  o << "# written by `meshtrain plan` for " << l.name() << "\n" << model_section << "[mesh]\ndp = "
    << l.dp << "\npp = " << l.pp << "\ntp = " << l.tp << "\nep = " << l.ep
    << (l.cp > 1 ? "\ncp = " + std::to_string(l.cp) : std::string())
    << (l.cp > 1 && l.cp_all_gather ? "\n[cp]\ncomm = all_gather" : "") << "\n[pp]\nschedule = "
    << parallel::schedule_name(l.schedule) << "\nvirtual_chunks = " << l.virtual_chunks
    << "\n[tp]\nsequence_parallel = " << (l.sequence_parallel ? "true" : "false")
    << "\n[zero]\nstage = " << l.zero_stage << "\noffload_optimizer = "
    << (l.offload ? "cpu" : "none") << "\n[dp]\nbucket_mb = "
    << fmt("%.6g", static_cast<double>(l.bucket_bytes) / 1048576.0) << "\n[train]\nmicro_batch = "
    << l.micro_batch << "\ngrad_accum = " << l.n_micro << "\nseq_len = " << seq_len
    << "\nrecompute = " << (l.recompute ? "true" : "false")
    << (l.recompute_mlp_act ? "\nrecompute_mlp_act = true" : "") << "\nprecision = "
    << (l.fp8 ? "fp8" : precision_name(l.precision)) << "\n";
  if (l.fp8)  // train runs fp8 on bf16 activations (fp32 on a CPU build), as planned
    o << "[fp8]\nrecipe = " << (l.fp8_rowwise ? "rowwise" : "tensorwise")
      << "\nfirst_last_bf16 = " << l.fp8_first_last_bf16
      << "\nwgrad_bf16 = " << (l.fp8_wgrad_bf16 ? "true" : "false")
      << "\nexperts = " << (l.fp8_experts ? "true" : "false") << "\n";
  return o.str();
}

std::string slurm_script(const Candidate& c, const SearchOptions& opt, const Calibration& cal,
                         const std::string& config_path, const std::string& jobs_dir) {
  const Layout& l = c.layout;
  const int G = std::max(1, opt.cluster.gpus_per_node);
  const long world = l.world();
  const long nodes = (world + G - 1) / G;
  const int per_node = static_cast<int>(std::min<long>(world, G));
  const bool gpu = cal.device == "gpu";
  namespace fs = std::filesystem;
  const std::string script = !gpu ? "slurm-cpu.sh" : nodes > 1 ? "slurm-multinode.sh" : "slurm-gpu.sh";
  std::ostringstream o;
  o << "#!/usr/bin/env bash\n# Written by `meshtrain plan`: " << l.name() << "\n# predicted "
    << format_bytes(c.memory.device()) << " per rank, "
    << fmt("%.1f", c.cost.step_s * 1e3) << " ms per step, "
    << fmt("%.0f", c.cost.tokens_per_s) << " tokens/s (calibration: " << cal.machine
    << (cal.measured ? "" : ", not measured") << ")\n";
  if (!jobs_dir.empty() && fs::exists(fs::path(jobs_dir) / script)) {
    // The project's scripts carry requeue, checkpoint and site settings: submit through them.
    o << "# Submits through the project's " << jobs_dir << "/" << script << ".\nset -euo pipefail\n"
      << "sbatch --nodes=" << nodes << (gpu ? " --gpus-per-node=" + std::to_string(per_node) : std::string())
      << " --ntasks-per-node=" << per_node << " " << jobs_dir << "/" << script << " --dp " << l.dp
      << " --pp " << l.pp << " --tp " << l.tp << " --config " << config_path << " \"$@\"\n";
    return o.str();
  }
  o << "#SBATCH --job-name=meshtrain\n#SBATCH --nodes=" << nodes << "\n#SBATCH --ntasks-per-node="
    << per_node << "\n";
  if (gpu) o << "#SBATCH --gpus-per-node=" << per_node << "\n#SBATCH --exclusive\n";
  o << "#SBATCH --time=02:00:00\n#SBATCH --output=%x-%j.out\nset -euo pipefail\n"
    << "srun --mpi=pmix meshtrain train --config " << config_path << " --mesh.dp " << l.dp
    << " --mesh.pp " << l.pp << " --mesh.tp " << l.tp << " \"$@\"\n";
  return o.str();
}

}  // namespace meshtrain::plan
