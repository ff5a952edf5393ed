#include "meshtrain/app/option_checks.hpp"

#include <cmath>
#include <limits>
#include <sstream>

#include "meshtrain/core/error.hpp"

namespace meshtrain::app {

namespace {

template <class T>
T value(const po::variables_map& vm, const char* key) {
  return vm[key].as<T>();
}

// 16777216, not 1.67772e+07.
std::string num(double x) {
  if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 1e15)
    return std::to_string(static_cast<long long>(x));
  std::ostringstream os;
  os.precision(10);
  os << x;
  return os.str();
}

// lo <= x (or lo < x when open_lo), x <= hi (x < hi when open_hi); NaN never passes.
void in_range(const po::variables_map& vm, const char* key, double lo, double hi, bool open_lo,
              bool open_hi, const char* meaning = "") {
  if (!vm.count(key)) return;
  const boost::any& a = vm[key].value();
  double x = 0;
  if (auto* d = boost::any_cast<double>(&a)) x = *d;
  else if (auto* i = boost::any_cast<int>(&a)) x = *i;
  else if (auto* l = boost::any_cast<long>(&a)) x = static_cast<double>(*l);
  else if (auto* ll = boost::any_cast<long long>(&a)) x = static_cast<double>(*ll);
  else return;
  const bool ok = (open_lo ? x > lo : x >= lo) && (open_hi ? x < hi : x <= hi);
  if (ok) return;
  const double inf = std::numeric_limits<double>::infinity();
  std::string domain = lo == -inf ? cat(open_hi ? "< " : "<= ", num(hi))
                       : hi == inf ? cat(open_lo ? "> " : ">= ", num(lo))
                                   : cat("in ", open_lo ? "(" : "[", num(lo), ", ", num(hi),
                                         open_hi ? ")" : "]");
  throw ConfigError(cat(key, "=", num(x), " must be ", domain,
                        *meaning ? cat(" (", meaning, ")") : ""));
}

constexpr double kInf = std::numeric_limits<double>::infinity();

void at_least(const po::variables_map& vm, const char* key, double lo, const char* meaning = "") {
  in_range(vm, key, lo, kInf, false, false, meaning);
}
void above(const po::variables_map& vm, const char* key, double lo, const char* meaning = "") {
  in_range(vm, key, lo, kInf, true, false, meaning);
}

}  // namespace

void check_train_options(const po::variables_map& vm) {
  at_least(vm, "train.lr", 0);
  at_least(vm, "train.min_lr", 0);
  // Only meshtrain's cosine decays to min_lr from lr (DeepSpeed's shapes take their own ends).
  if (value<std::string>(vm, "train.lr_schedule") == "cosine" &&
      value<double>(vm, "train.min_lr") > value<double>(vm, "train.lr"))
    throw ConfigError(cat("train.min_lr=", value<double>(vm, "train.min_lr"),
                          " is larger than train.lr=", value<double>(vm, "train.lr"),
                          " (the cosine decays from lr to min_lr)"));
  at_least(vm, "train.warmup", 0);
  at_least(vm, "train.decay_steps", 0, "0 = train.steps");
  at_least(vm, "train.weight_decay", 0);
  in_range(vm, "train.beta1", 0, 1, false, true);
  in_range(vm, "train.beta2", 0, 1, false, true);
  above(vm, "train.eps", 0);
  at_least(vm, "train.grad_clip", 0, "0 = no clipping");
  at_least(vm, "train.micro_batch", 1);
  at_least(vm, "train.grad_accum", 1);
  at_least(vm, "train.seq_len", 0, "0 = model.block_size");
  at_least(vm, "train.steps", 1);
  at_least(vm, "train.eval_every", 0, "0 = at the end only");
  at_least(vm, "train.eval_batches", 1);
  at_least(vm, "train.log_every", 0, "0 = no progress lines");
  at_least(vm, "train.peak_tflops", 0, "0 = no MFU");
  above(vm, "train.loss_scale_init", 0);
  const double s = value<double>(vm, "train.loss_scale_init");
  int e = 0;
  MESHTRAIN_CONFIG_CHECK(std::frexp(s, &e) == 0.5, "train.loss_scale_init=", s,
                         " must be a power of two (scaling and unscaling stay exact)");
  at_least(vm, "train.loss_scale_window", 1);
  above(vm, "train.loss_scale_min", 0);
  at_least(vm, "train.loss_scale_hysteresis", 1);
  at_least(vm, "train.warmup_min_lr", 0);
  at_least(vm, "train.sample_tokens", 0);
  at_least(vm, "train.sample_temperature", 0, "0 = greedy");
  at_least(vm, "train.sample_top_k", 0, "0 = the whole vocabulary");
  at_least(vm, "train.max_rollbacks", 0);
  at_least(vm, "train.max_skipped_steps", 1);
  at_least(vm, "ckpt.every", 0, "0 = no periodic saves");
  at_least(vm, "ckpt.keep", 0, "0 = keep all");
  at_least(vm, "comm.timeout", 0, "0 = no watchdog");
  above(vm, "dp.bucket_mb", 0);
  at_least(vm, "pp.virtual_chunks", 1);
}

void check_plan_options(const po::variables_map& vm) {
  at_least(vm, "plan.world", 0, "0 = the ranks of this job");
  in_range(vm, "plan.world", 0, 1 << 20, false, false);
  in_range(vm, "plan.gpus_per_node", 1, 1024, false, false);
  if (vm.count("plan.memory_gib") && value<double>(vm, "plan.memory_gib") != -1)
    at_least(vm, "plan.memory_gib", 0, "-1 = the calibration's, 0 = unlimited");
  in_range(vm, "plan.global_batch", 0, 1 << 24, false, false, "sequences per step; 0 = default");
  in_range(vm, "plan.seq_len", 0, 1 << 20, false, false, "0 = model.block_size");
  above(vm, "plan.bucket_mb", 0);
  at_least(vm, "plan.top", 1);
  at_least(vm, "plan.choose", 1);
  at_least(vm, "plan.validate", 0);
  at_least(vm, "plan.validate_steps", 2, "the first step is not timed");
}

}  // namespace meshtrain::app
