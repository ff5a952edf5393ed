// `meshtrain plan`: the planner's command line (plan/ holds the models and the search).
#include "meshtrain/app/plan_cmd.hpp"

#include <cstdio>
#include <fstream>
#include <iostream>

#include "meshtrain/app/bench_cmd.hpp"
#include "meshtrain/app/deepspeed_config.hpp"
#include "meshtrain/app/option_checks.hpp"
#include "meshtrain/app/options.hpp"
#include "meshtrain/app/train_cmd.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/plan/report.hpp"

namespace meshtrain::app {

po::options_description plan_options() {
  po::options_description d;
  d.add(config::generic_options()).add(model_options());
  po::options_description p("Planner [plan]");
  p.add_options()
      ("plan.world", po::value<int>()->default_value(0),
       "devices (ranks) to plan for; 0 = the ranks of this job")
      ("plan.gpus_per_node", po::value<int>()->default_value(8),
       "devices per node (tensor parallelism stays within a node)")
      ("plan.memory_gib", po::value<double>()->default_value(-1),
       "memory per device in GiB; -1 = the calibration's, 0 = unlimited")
      ("plan.calibration", po::value<std::string>()->default_value("inputs/plan/h200.json"),
       "calibration file (JSON) from `meshtrain bench`; inputs/plan/ ships cpu and h200")
      ("plan.calibration_out", po::value<std::string>()->default_value(""),
       "where --plan.validate writes the refitted calibration; default: plan.calibration")
      ("plan.global_batch", po::value<long>()->default_value(0),
       "sequences per optimizer step; 0 = max(512, world)")
      ("plan.seq_len", po::value<int>()->default_value(0), "tokens per sequence; 0 = block_size")
      ("plan.precision", po::value<std::string>()->default_value(""),
       "fp32, bf16, fp16, or fp8 (the blocks' linears in FP8 under the fp8.* recipe, the rest in "
       "bf16; fp32 with a CPU calibration, as train's CPU build); default: the calibration's")
      ("plan.micro_batches", po::value<std::string>()->default_value("1,2,4,8,16,32"),
       "micro-batch sizes to consider")
      ("plan.zero", po::value<std::string>()->default_value("0,1,2,3"), "ZeRO stages to consider")
      ("plan.bucket_mb", po::value<double>()->default_value(25.0), "dp.bucket_mb of the layouts")
      ("plan.top", po::value<int>()->default_value(10), "layouts to print")
      ("plan.json", po::value<std::string>()->default_value(""),
       "write the ranking as JSON to this file ('-': standard output instead of the table)")
      ("plan.choose", po::value<int>()->default_value(1),
       "which ranked layout --plan.emit_config / --plan.emit_slurm write (1 = the fastest)")
      ("plan.emit_config", po::value<std::string>()->default_value(""),
       "write the chosen layout as an INI file for `meshtrain train --config`")
      ("plan.emit_slurm", po::value<std::string>()->default_value(""),
       "write a Slurm job script for the chosen layout (uses jobs/slurm-*.sh when present)")
      ("plan.jobs_dir", po::value<std::string>()->default_value("jobs"),
       "folder of the project's Slurm scripts, for --plan.emit_slurm")
      ("plan.validate", po::value<int>()->default_value(0),
       "run the top K layouts on this job's ranks, compare, refit the calibration's scales")
      ("plan.validate_pick", po::value<std::string>()->default_value("top"),
       "which K layouts --plan.validate runs: top (the fastest) or spread (evenly over the "
       "ranking, to test the model across kinds of layouts)")
      ("plan.validate_steps", po::value<int>()->default_value(4),
       "steps per validated layout (the first is not timed)")
      ("plan.data", po::value<std::string>()->default_value(""),
       "token shards for --plan.validate; default: random tokens");
  d.add(p).add(fp8_options()).add(log_options()).add(deepspeed_options());
  return d;
}

namespace {

// The block description where it is not GPT-2's defaults (every GPT-2 configuration stays as
// it was written before the Llama family existed).
std::string block_section(const model::GptConfig& c) {
  const model::GptConfig d;
  if (c.key() == [&] {
        model::GptConfig g = d;
        g.n_layer = c.n_layer, g.n_head = c.n_head, g.n_embd = c.n_embd;
        g.vocab_size = c.vocab_size, g.vocab_pad = c.vocab_pad, g.block_size = c.block_size;
        return g.key();
      }())
    return "";
  return cat("family = ", model::family_name(c.family), "\nnorm = ", model::norm_name(c.norm),
             "\npositions = ", model::positions_name(c.positions), "\nmlp = ",
             model::mlp_name(c.mlp), "\nn_kv_head = ", c.n_kv_head, "\nhead_dim = ", c.head_dim,
             "\nintermediate_size = ", c.intermediate_size, "\nbias = ", c.bias ? "true" : "false",
             c.qkv_bias ? "\nqkv_bias = true" : "",
             c.sliding_window > 0 ? cat("\nsliding_window = ", c.sliding_window) : std::string(),
             "\ntied_head = ", c.tied_head ? "true" : "false", "\nnorm_eps = ", c.norm_eps,
             "\nrope_theta = ", c.rope.theta, "\nrope_scaling = ",
             c.rope.llama3_scaling ? "llama3" : "none", "\nrope_factor = ", c.rope.factor,
             "\nrope_low_freq_factor = ", c.rope.low_freq_factor, "\nrope_high_freq_factor = ",
             c.rope.high_freq_factor, "\nrope_original_max_position = ",
             c.rope.original_max_position_embeddings, "\n");
}

// The Mixture-of-Experts options of a MoE model (empty for a dense one).
std::string moe_section(const model::GptConfig& c) {
  if (!c.moe.enabled()) return "";
  const auto& m = c.moe;
  return cat("[moe]\nexperts = ", m.experts, "\ntop_k = ", m.top_k, "\nlayer_freq = ", m.layer_freq,
             "\nffn_hidden_size = ", m.ffn, "\nshared_expert_size = ", m.shared_ffn,
             "\nrouter_score = ", m.router_score, "\nrouter_fp64 = ",
             m.router_fp64 ? "true" : "false",
             m.expert_bias ? cat("\nexpert_bias = true\nexpert_bias_rate = ", m.expert_bias_rate)
                           : std::string(),
             "\naux_loss_coeff = ", m.aux_loss_coeff, "\naux_loss_scope = ", m.aux_loss_scope,
             "\nz_loss_coeff = ", m.z_loss_coeff, "\n",
             m.capacity_factor > 0 ? cat("capacity_factor = ", m.capacity_factor, "\n")
                                   : std::string());
}

std::string model_section(const po::variables_map& vm, const model::GptConfig& c) {
  const std::string init = vm["model.init_from"].as<std::string>();
  if (!init.empty()) return cat("[model]\ninit_from = ", init, "\n");
  return cat("[model]\npreset = ", vm["model.preset"].as<std::string>(), "\nn_layer = ",
             c.n_layer, "\nn_head = ", c.n_head, "\nn_embd = ", c.n_embd, "\nvocab_size = ",
             c.vocab_size, "\nvocab_pad = ", c.vocab_pad, "\nblock_size = ", c.block_size, "\n",
             block_section(c), moe_section(c));
}

void write_file(const std::string& path, const std::string& text, const char* option) {
  std::ofstream out(path);
  MESHTRAIN_CONFIG_CHECK(out.good(), "cannot write '", path, "' (", option, ")");
  out << text;
}

}  // namespace

namespace {

// --deepspeed for the planner: the file's global batch, micro-batch, ZeRO stage, precision and
// bucket size narrow the search; its optimizer and schedule do not change a layout's memory or
// time. "auto" batch values are train's defaults.
DsContext plan_context(const po::variables_map& base) {
  static const po::variables_map train_defaults = config::parse({}, train_options()).vm;
  DsContext c;
  c.base = &train_defaults;
  c.dp = 0;
  c.n_embd = model_config(base).n_embd;
  const std::string prec = base["plan.precision"].as<std::string>();
  c.grad_bytes = prec == "bf16" || prec == "fp16" ? 2 : 4;
  return c;
}

std::vector<std::pair<std::string, std::string>> plan_layer(const DsMapping& m,
                                                            const po::variables_map&) {
  std::vector<std::pair<std::string, std::string>> kv;
  if (m.global_batch > 0) kv.emplace_back("plan.global_batch", std::to_string(m.global_batch));
  if (m.micro_batch > 0) kv.emplace_back("plan.micro_batches", std::to_string(m.micro_batch));
  for (const auto& [from, to] : std::vector<std::pair<const char*, const char*>>{
           {"zero.stage", "plan.zero"}, {"train.precision", "plan.precision"},
           {"dp.bucket_mb", "plan.bucket_mb"}})
    if (const DsOption* o = m.find(from)) kv.emplace_back(to, o->value);
  return kv;
}

}  // namespace

int cmd_plan(Runtime& rt, const std::vector<std::string>& args) {
  const auto desc = plan_options();
  const DsParsed ds = parse_with_deepspeed(args, desc, plan_context, plan_layer);
  const config::Parsed& p = ds.parsed;
  logging::set_context(log_context(p.vm, rt.rank()));
  if (ds.used() && !ds.mapping.warning().empty()) logging::warn(ds.mapping.warning());
  const auto& vm = p.vm;
  check_plan_options(vm);
  const model::GptConfig cfg = model_config(vm);
  int seq = vm["plan.seq_len"].as<int>();
  if (seq == 0) seq = cfg.block_size;
  const std::string cal_path = vm["plan.calibration"].as<std::string>();
  plan::Calibration cal = plan::load_calibration(cal_path);

  plan::SearchOptions opt;
  opt.cluster.world = vm["plan.world"].as<int>();
  if (opt.cluster.world == 0) opt.cluster.world = rt.size();
  MESHTRAIN_CONFIG_CHECK(opt.cluster.world > 0, "plan.world=", opt.cluster.world,
                         " must be positive");
  opt.cluster.gpus_per_node = vm["plan.gpus_per_node"].as<int>();
  MESHTRAIN_CONFIG_CHECK(opt.cluster.gpus_per_node > 0, "plan.gpus_per_node must be positive");
  double mem = vm["plan.memory_gib"].as<double>();
  if (mem < 0) mem = cal.device_memory_gib;
  opt.cluster.memory_bytes = mem * 1024.0 * 1024 * 1024;
  opt.global_batch = vm["plan.global_batch"].as<long>();
  MESHTRAIN_CONFIG_CHECK(opt.global_batch >= 0, "plan.global_batch must not be negative");
  const std::string prec = vm["plan.precision"].as<std::string>();
  const model::Fp8Recipe recipe = fp8_recipe(vm, cfg, "plan.precision");
  opt.fp8 = recipe.enabled;
  if (opt.fp8) {
    opt.fp8_rowwise = recipe.scaling == kernels::Fp8Scaling::rowwise;
    opt.fp8_wgrad_bf16 = recipe.wgrad_bf16;
    opt.fp8_first_last_bf16 = recipe.first_last_bf16;
    opt.fp8_experts = recipe.experts;
  }
  opt.precision = plan::parse_precision(
      opt.fp8 ? (cal.precision == "fp32" ? "fp32" : "bf16") : prec.empty() ? cal.precision : prec);
  opt.micro_batches = parse_int_list(vm["plan.micro_batches"].as<std::string>(), "plan.micro_batches");
  opt.zero_stages = parse_int_list(vm["plan.zero"].as<std::string>(), "plan.zero", 0);
  for (int z : opt.zero_stages)
    MESHTRAIN_CONFIG_CHECK(z <= 3, "plan.zero: ZeRO stage ", z, " does not exist (0-3)");
  opt.bucket_bytes = static_cast<std::size_t>(vm["plan.bucket_mb"].as<double>() * 1048576.0);
  const int top = vm["plan.top"].as<int>();

  const plan::SearchResult r = plan::search(cfg, seq, opt, cal);
  const std::string json = vm["plan.json"].as<std::string>();
  if (rt.rank() == 0) {
    if (json != "-") std::cout << plan::format_table(r, cfg, seq, opt, cal, top) << std::flush;
    const std::string js = plan::to_json(r, cfg, seq, opt, cal, top);
    if (json == "-") std::cout << js << std::flush;
    else if (!json.empty()) write_file(json, js, "plan.json");
  }
  const int choose = vm["plan.choose"].as<int>();
  const std::string ini = vm["plan.emit_config"].as<std::string>();
  const std::string slurm = vm["plan.emit_slurm"].as<std::string>();
  if (!ini.empty() || !slurm.empty()) {
    MESHTRAIN_CONFIG_CHECK(choose >= 1 && choose <= static_cast<int>(r.ranked.size()),
                           "plan.choose=", choose, " but ", r.ranked.size(), " layouts fit");
    const plan::Candidate& c = r.ranked[static_cast<std::size_t>(choose - 1)];
    if (rt.rank() == 0) {
      const std::string cfg_path = ini.empty() ? "meshtrain-plan.ini" : ini;
      write_file(cfg_path, plan::layout_ini(c.layout, seq, model_section(vm, cfg)),
                 "plan.emit_config");
      logging::info("wrote ", cfg_path, " (", c.layout.name(), ")");
      if (!slurm.empty()) {
        write_file(slurm,
                   plan::slurm_script(c, opt, cal, cfg_path, vm["plan.jobs_dir"].as<std::string>()),
                   "plan.emit_slurm");
        logging::info("wrote ", slurm);
      }
    }
  }
  const int k = vm["plan.validate"].as<int>();
  if (k > 0) {
    MESHTRAIN_CONFIG_CHECK(opt.cluster.world == rt.size(), "plan.validate runs the layouts on ",
                           "this job: plan.world=", opt.cluster.world, " but the job has ",
                           rt.size(), " ranks");
    const std::string pick = vm["plan.validate_pick"].as<std::string>();
    MESHTRAIN_CONFIG_CHECK(pick == "top" || pick == "spread", "plan.validate_pick='", pick,
                           "' is not top or spread");
    std::vector<plan::Candidate> chosen;
    const std::size_t n = r.ranked.size(), kk = std::min<std::size_t>(k, n);
    for (std::size_t i = 0; i < kk; ++i)
      chosen.push_back(r.ranked[pick == "top" || kk == 1 ? i : i * (n - 1) / (kk - 1)]);
    const auto rows = validate_layouts(rt.world(), cfg, seq, chosen, opt, cal,
                                       vm["plan.validate_steps"].as<int>(),
                                       vm["plan.data"].as<std::string>());
    refit_scales(rows, cal);
    std::string out = vm["plan.calibration_out"].as<std::string>();
    if (out.empty()) out = cal_path;
    if (rt.rank() == 0) {
      plan::save_calibration(out, cal);
      logging::info("calibration scales now compute ", cal.scale_compute, ", comm ",
                    cal.scale_comm, " (", cal.validated_layouts, " layouts); wrote ", out);
    }
  }
  return kExitOk;
}

}  // namespace meshtrain::app
