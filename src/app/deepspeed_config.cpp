// A DeepSpeed configuration mapped onto meshtrain's options (app/deepspeed_config.hpp). The
// key names, defaults and rules are DeepSpeed's (deepspeed/runtime/config.py, constants.py,
// zero/config.py, lr_schedules.py, fp16/loss_scaler.py and its config-json documentation).
#include "meshtrain/app/deepspeed_config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <set>
#include <sstream>

#include "meshtrain/core/error.hpp"

namespace meshtrain::app {

namespace {

// Keys DeepSpeed knows that change nothing meshtrain computes or that it has no counterpart for
// (monitoring, its own kernels and memory tricks, features of its engine).
const std::set<std::string> kNoEffectTop = {
    "wall_clock_breakdown", "memory_breakdown", "flops_profiler", "dump_state",
    "prescale_gradients", "gradient_predivide_factor", "sparse_gradients",
    "communication_data_type", "seq_parallel_communication_data_type",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "elasticity", "autotuning",
    "compile", "aio", "checkpoint", "data_efficiency", "curriculum_learning", "pipeline",
    "compression_training", "nebula", "data_types", "wandb", "csv_monitor", "comet",
    "comms_logger", "timers", "graph_harvesting", "use_data_before_expert_parallelism",
    "disable_allgather", "vocabulary_size", "eigenvalue", "progressive_layer_drop",
    "sparse_attention", "hybrid_engine", "weight_quantization", "quantize_training",
    "torch_autocast", "fp8", "monitor_config", "zero_quantized_weights",
    "zero_quantized_gradients", "gradient_accumulation_dtype", "dataloader_drop_last"};
const std::set<std::string> kZeroNoEffect = {
    "round_robin_gradients", "elastic_checkpoint", "sub_group_size", "load_from_fp32_weights",
    "ignore_unused_parameters", "legacy_stage1", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_model_persistence_threshold",
    "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "gather_16bit_weights_on_model_save", "zero_hpz_partition_size", "zero_quantized_weights",
    "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "mics_shard_size",
    "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
    "override_module_apply", "module_granularity_threshold",
    "use_all_reduce_for_fetch_params", "log_trace_cache_warnings", "zeropp_loco_param",
    "prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
    "max_live_parameters", "max_reuse_distance", "stage3_use_all_reduce_for_fetch_params",
    "stage3_module_granularity_threshold", "cpu_offload_params", "cpu_offload_use_pin_memory"};
const std::set<std::string> kOffloadNoEffect = {"pin_memory", "buffer_count", "fast_init",
                                                "nvme_path", "buffer_size", "max_in_cpu",
                                                "pipeline_read", "pipeline_write", "ratio"};
const std::set<std::string> kMapped = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "optimizer", "scheduler", "fp16", "bf16", "bfloat16", "amp", "zero_optimization",
    "gradient_clipping", "activation_checkpointing", "steps_per_print", "tensorboard"};

std::string shown(const Json& v) {
  return json::dump(v);
}

// The shortest text that reads back as x: the options carry the file's values exactly.
std::string num(double x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::general);
  return std::string(buf, r.ptr);
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The mapping of one document: typed reads that name the key and the file, and the options
// in the order they are decided.
class Mapper {
 public:
  Mapper(const std::string& file, const DsContext& ctx) : ctx_(ctx) { out_.file = file; }

  DsMapping run(const Json& doc) {
    if (!doc.is_object())
      fail("", cat("is ", shown(doc).substr(0, 40), ": a DeepSpeed configuration is a JSON object"));
    doc_ = &doc;
    batch();
    optimizer();
    scheduler();
    precision();
    zero();
    if (const Json* v = json::find(doc, "gradient_clipping")) {
      if (!is_auto(*v)) set("train.grad_clip", num(number(*v, "gradient_clipping", 0)),
                            "gradient_clipping");
    }
    activation_checkpointing();
    if (const Json* v = json::find(doc, "steps_per_print"))
      set("train.log_every", std::to_string(integer(*v, "steps_per_print", 1)), "steps_per_print");
    tensorboard();
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (kMapped.count(it.key())) continue;
      // A feature left off changes nothing here either: only the ones switched on are named.
      const bool off = it->is_null() || (it->is_boolean() && !it->get<bool>()) ||
                       (it->is_object() && json::find(*it, "enabled") &&
                        (*it)["enabled"].is_boolean() && !(*it)["enabled"].get<bool>());
      if (kNoEffectTop.count(it.key())) {
        if (!off) out_.no_effect.push_back(it.key());
      }
      else unknown(it.key(), kMapped, "");
    }
    return std::move(out_);
  }

 private:
  // ---- typed reads ----
  // "zero_optimization.stage=5 does not exist (0-3) (ds_config.json, --deepspeed)"
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw ConfigError(cat(path.empty() ? "the document" : path,
                          !what.empty() && what[0] == '=' ? "" : " ", what, " (", out_.file,
                          ", --deepspeed)"));
  }
  static bool is_auto(const Json& v) { return v.is_string() && v.get<std::string>() == "auto"; }
  [[noreturn]] void no_auto(const std::string& path) const {
    fail(path, "is \"auto\", which meshtrain cannot resolve here (HF Trainer's \"auto\" is read "
               "for batch sizes, optimizer and scheduler values, gradient_clipping, fp16/bf16 "
               "enabled and reduce_bucket_size); give a value");
  }
  long integer(const Json& v, const std::string& path, long lo) const {
    if (is_auto(v)) no_auto(path);
    // DeepSpeed's own examples write bucket sizes as 5e8: an integral float is an integer.
    if (!v.is_number() || v.is_boolean() || std::floor(v.get<double>()) != v.get<double>() ||
        std::fabs(v.get<double>()) > 9e15)
      fail(path, cat("=", shown(v), " must be an integer"));
    const long x = static_cast<long>(v.get<double>());
    if (x < lo) fail(path, cat("=", x, " must be >= ", lo));
    return x;
  }
  double number(const Json& v, const std::string& path, double lo) const {
    if (is_auto(v)) no_auto(path);
    if (!v.is_number() || v.is_boolean()) fail(path, cat("=", shown(v), " must be a number"));
    const double x = v.get<double>();
    if (!(x >= lo)) fail(path, cat("=", num(x), " must be >= ", num(lo)));
    return x;
  }
  bool boolean(const Json& v, const std::string& path) const {
    if (is_auto(v)) no_auto(path);
    if (!v.is_boolean()) fail(path, cat("=", shown(v), " must be true or false"));
    return v.get<bool>();
  }
  std::string text(const Json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, cat("=", shown(v), " must be a string"));
    return v.get<std::string>();
  }
  const Json& object(const Json& v, const std::string& path) const {
    if (!v.is_object()) fail(path, cat("=", shown(v).substr(0, 40), " must be an object"));
    return v;
  }

  // ---- results ----
  void set(const std::string& key, const std::string& value, const std::string& from) {
    for (auto& o : out_.options)
      if (o.key == key) {
        o = DsOption{key, value, from};
        return;
      }
    out_.options.push_back(DsOption{key, value, from});
    if (ctx_.on_command_line(key)) {
      const auto& bv = ctx_.base->find(key)->second.value();
      std::string cmd;
      if (auto* s = boost::any_cast<std::string>(&bv)) cmd = *s;
      else if (auto* d = boost::any_cast<double>(&bv)) cmd = num(*d);
      else if (auto* i = boost::any_cast<int>(&bv)) cmd = std::to_string(*i);
      else if (auto* l = boost::any_cast<long long>(&bv)) cmd = std::to_string(*l);
      else if (auto* b = boost::any_cast<bool>(&bv)) cmd = *b ? "true" : "false";
      if (cmd != value) out_.overridden.push_back(cat(key, "=", cmd, " over ", from, " (", value, ")"));
    }
  }
  // The option's value as the run will see it: command line, this file, then the --config file
  // or the default.
  template <class T>
  T current(const std::string& key) const {
    if (!ctx_.on_command_line(key))
      if (const DsOption* o = out_.find(key)) {
        if constexpr (std::is_same_v<T, std::string>) return o->value;
        else return static_cast<T>(std::stod(o->value));
      }
    return ctx_.base->find(key)->second.template as<T>();
  }
  void unknown(const std::string& key, const std::set<std::string>& known,
               const std::string& prefix) {
    std::string best;
    std::size_t best_d = std::max<std::size_t>(2, key.size() / 4) + 1;
    for (const auto& k : known) {
      const std::size_t d = edit_distance(key, k);
      if (d < best_d) best = k, best_d = d;
    }
    out_.unknown.push_back(cat(prefix, key, best.empty() ? std::string() :
                               cat(" (did you mean ", prefix, best, "?)")));
  }
  void no_effect(const std::string& path, const std::string& why = "") {
    out_.no_effect.push_back(why.empty() ? path : cat(path, " (", why, ")"));
  }

  // ---- sections ----
  void batch();
  void optimizer();
  void scheduler();
  void precision();
  void zero();
  void activation_checkpointing();
  void tensorboard();

  const DsContext& ctx_;
  const Json* doc_ = nullptr;
  DsMapping out_;
  bool lr_from_scheduler_ = false;
  std::optional<double> optimizer_lr_;
};

// DeepSpeed's _set_batch_related_parameters, with meshtrain's own values where the command line
// gives them or the file says "auto", and exact division instead of a floor and an assertion.
void Mapper::batch() {
  struct Value {
    std::optional<long> v;
    std::string from;
  };
  const Json& d = *doc_;
  const Json* tb_j = json::find(d, "train_batch_size");
  const Json* mb_j = json::find(d, "train_micro_batch_size_per_gpu");
  const Json* ga_j = json::find(d, "gradient_accumulation_steps");
  const bool tb_auto = tb_j && is_auto(*tb_j);
  auto read = [&](const Json* j, const char* key, const char* option) {
    Value r;
    if (ctx_.on_command_line(option)) {
      r.v = ctx_.base->find(option)->second.as<int>();
      r.from = cat("--", option, " on the command line");
      if (j && !is_auto(*j) && integer(*j, key, 1) != *r.v)
        out_.overridden.push_back(cat(option, "=", *r.v, " over ", key, " (", shown(*j), ")"));
    } else if (j && !is_auto(*j)) {
      r.v = integer(*j, key, 1);
      r.from = cat(key, " in ", out_.file);
    } else if ((j && is_auto(*j)) || tb_auto) {  // HF Trainer fills these from its arguments
      r.v = ctx_.base->find(option)->second.as<int>();
      r.from = cat(option, " (\"auto\": meshtrain's value)");
    }
    return r;
  };
  Value mb = read(mb_j, "train_micro_batch_size_per_gpu", "train.micro_batch");
  Value ga = read(ga_j, "gradient_accumulation_steps", "train.grad_accum");
  Value tb;
  if (tb_j && !tb_auto) {
    tb.v = integer(*tb_j, "train_batch_size", 1);
    tb.from = "train_batch_size";
  }
  if (!tb_j && !mb_j && !ga_j) return;  // the file leaves batches to meshtrain's options
  if (ctx_.dp <= 0) {  // no data-parallel size (the planner searches it): the file's values
    out_.global_batch = tb.v.value_or(0);
    out_.micro_batch = mb.v.value_or(0);
    out_.grad_accum = ga.v.value_or(0);
    return;
  }
  const long dp = ctx_.dp;
  const std::string rule = cat("DeepSpeed's rule: train_batch_size = train_micro_batch_size_per_gpu"
                               " x gradient_accumulation_steps x data-parallel ranks (dp ",
                               dp, ": ", ctx_.dp_from, ")");
  auto divide = [&](long total, long by, const char* what, const std::string& parts) {
    if (total % by != 0)
      fail("train_batch_size", cat("=", total, " is not divisible by ", parts, " = ", by,
                                   ", so ", what, " cannot be derived (", rule, ")"));
    return total / by;
  };
  if (tb.v && mb.v && ga.v) {
    if (*tb.v != *mb.v * *ga.v * dp)
      fail("train_batch_size", cat("=", *tb.v, " but micro-batch ", *mb.v, " (", mb.from,
                                   ") x accumulation ", *ga.v, " (", ga.from, ") x dp ", dp,
                                   " = ", *mb.v * *ga.v * dp, " (", rule, ")"));
  } else if (tb.v && mb.v) {
    ga.v = divide(*tb.v, *mb.v * dp, "gradient_accumulation_steps", "micro-batch x dp");
  } else if (tb.v && ga.v) {
    mb.v = divide(*tb.v, *ga.v * dp, "train_micro_batch_size_per_gpu", "accumulation x dp");
  } else if (mb.v && ga.v) {
  } else if (tb.v) {
    ga.v = 1;
    mb.v = divide(*tb.v, dp, "train_micro_batch_size_per_gpu", "dp");
  } else if (mb.v) {
    ga.v = 1;
  } else {
    fail("gradient_accumulation_steps", "is given without train_batch_size or "
                                        "train_micro_batch_size_per_gpu; DeepSpeed needs one of "
                                        "them");
  }
  out_.micro_batch = *mb.v;
  out_.grad_accum = *ga.v;
  out_.global_batch = *mb.v * *ga.v * dp;
  // (The command line's own values stand as they are.)
  if (!ctx_.on_command_line("train.micro_batch"))
    set("train.micro_batch", std::to_string(*mb.v), "train_micro_batch_size_per_gpu");
  if (!ctx_.on_command_line("train.grad_accum"))
    set("train.grad_accum", std::to_string(*ga.v), "gradient_accumulation_steps");
}

void Mapper::optimizer() {
  const Json* o = json::find(*doc_, "optimizer");
  if (!o) return;
  object(*o, "optimizer");
  const Json* type_j = json::find(*o, "type");
  if (!type_j) fail("optimizer", "has no \"type\" (meshtrain trains with Adam or AdamW)");
  std::string type = text(*type_j, "optimizer.type");
  std::string lower = type;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (lower != "adamw" && lower != "adam")
    fail("optimizer.type", cat("='", type, "' is not an optimizer meshtrain has (Adam, AdamW)"));
  for (auto it = o->begin(); it != o->end(); ++it)
    if (it.key() != "type" && it.key() != "params") {
      if (it.key() == "legacy_fusion") no_effect("optimizer.legacy_fusion");
      else if (it.key() == "adam_w_mode")  // often written here; DeepSpeed reads it in params
        no_effect("optimizer.adam_w_mode", "DeepSpeed reads it from optimizer.params");
      else unknown(it.key(), {"type", "params"}, "optimizer.");
    }
  static const Json kEmpty = Json::object();
  const Json* pj = json::find(*o, "params");
  const Json& p = pj ? object(*pj, "optimizer.params") : kEmpty;
  // DeepSpeed builds FusedAdam / DeepSpeedCPUAdam, whose defaults these are (torch's AdamW,
  // with torch_adam, decays by 0.01).
  const bool torch_adam = json::find(p, "torch_adam") && boolean(p["torch_adam"], "optimizer.params.torch_adam");
  const bool w_mode = json::find(p, "adam_w_mode") ? boolean(p["adam_w_mode"], "optimizer.params.adam_w_mode")
                                                   : true;
  const std::string P = "optimizer.params.";
  auto param = [&](const char* key, double dflt, double lo, const char* option) {
    const Json* v = json::find(p, key);
    if (v && is_auto(*v)) return;
    const double x = v ? number(*v, P + key, lo) : dflt;
    set(option, num(x), P + key);
    if (std::string(key) == "lr") optimizer_lr_ = x;
  };
  param("lr", 1e-3, 0, "train.lr");
  if (const Json* b = json::find(p, "betas"); !b || !is_auto(*b)) {
    double b1 = 0.9, b2 = 0.999;
    if (b) {
      if (!b->is_array() || b->size() != 2)
        fail(P + "betas", cat("=", shown(*b), " must be a list of two numbers [beta1, beta2]"));
      b1 = number((*b)[0], P + "betas[0]", 0);
      b2 = number((*b)[1], P + "betas[1]", 0);
    }
    set("train.beta1", num(b1), P + "betas");
    set("train.beta2", num(b2), P + "betas");
  }
  param("eps", 1e-8, 0, "train.eps");
  param("weight_decay", torch_adam && lower == "adamw" ? 0.01 : 0.0, 0, "train.weight_decay");
  if (!w_mode && current<double>("train.weight_decay") != 0)
    fail(P + "adam_w_mode", "=false is Adam with L2 regularisation, which meshtrain does not "
                            "have (its AdamW decays the weights decoupled); set adam_w_mode true "
                            "or weight_decay 0");
  for (auto it = p.begin(); it != p.end(); ++it) {
    const std::string& k = it.key();
    if (k == "lr" || k == "betas" || k == "eps" || k == "weight_decay" || k == "adam_w_mode" ||
        k == "torch_adam")
      continue;
    if (k == "bias_correction") {
      if (!boolean(*it, P + k)) fail(P + k, "=false: meshtrain's AdamW always corrects the bias");
    } else if (k == "amsgrad" || k == "maximize") {
      if (boolean(*it, P + k)) fail(P + k, "=true is not built in meshtrain's AdamW");
    } else if (k == "fused" || k == "foreach" || k == "capturable" || k == "set_grad_none" ||
               k == "differentiable") {
      no_effect(P + k, "an implementation choice of torch");
    } else {
      unknown(k, {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam",
                  "bias_correction", "amsgrad"}, P);
    }
  }
}

void Mapper::scheduler() {
  const Json* s = json::find(*doc_, "scheduler");
  if (!s) {
    // DeepSpeed's engine without a scheduler keeps the optimizer's rate; a file without an
    // optimizer either leaves the schedule to meshtrain's options.
    if (json::find(*doc_, "optimizer")) set("train.lr_schedule", "constant", "optimizer (no scheduler)");
    return;
  }
  object(*s, "scheduler");
  const Json* type_j = json::find(*s, "type");
  if (!type_j) fail("scheduler", "has no \"type\"");
  const std::string type = text(*type_j, "scheduler.type");
  const bool cosine = type == "WarmupCosineLR";
  if (type != "WarmupLR" && type != "WarmupDecayLR" && !cosine)
    fail("scheduler.type", cat("='", type, "' is not one meshtrain has (WarmupLR, WarmupDecayLR, "
                               "WarmupCosineLR; OneCycle and LRRangeTest are not built)"));
  for (auto it = s->begin(); it != s->end(); ++it)
    if (it.key() != "type" && it.key() != "params") unknown(it.key(), {"type", "params"}, "scheduler.");
  static const Json kEmpty = Json::object();
  const Json* pj = json::find(*s, "params");
  const Json& p = pj ? object(*pj, "scheduler.params") : kEmpty;
  const std::string P = "scheduler.params.";
  set("train.lr_schedule", type == "WarmupLR" ? "ds_warmup" : type == "WarmupDecayLR"
                                                                  ? "ds_warmup_decay"
                                                                  : "ds_warmup_cosine",
      "scheduler.type");
  std::set<std::string> known = {"warmup_num_steps", "warmup_type", "last_batch_iteration"};
  if (const Json* v = json::find(p, "warmup_num_steps"); !v || !is_auto(*v))
    set("train.warmup", std::to_string(v ? integer(*v, P + "warmup_num_steps", 0) : 1000),
        P + "warmup_num_steps");
  std::string wt = "log";  // DeepSpeed's default
  if (const Json* v = json::find(p, "warmup_type")) {
    wt = text(*v, P + "warmup_type");
    if (wt != "log" && wt != "linear")
      fail(P + "warmup_type", cat("='", wt, "' is not one of log, linear"));
  }
  set("train.warmup_type", wt, P + "warmup_type");
  if (const Json* v = json::find(p, "last_batch_iteration"))
    if (integer(*v, P + "last_batch_iteration", -1) != -1)
      no_effect(P + "last_batch_iteration", "train.resume continues a schedule");
  if (type != "WarmupLR") {
    known.insert("total_num_steps");
    const Json* v = json::find(p, "total_num_steps");
    if (!v) fail(P + "total_num_steps", cat("is missing; ", type, " needs it"));
    if (!is_auto(*v))  // "auto": train.decay_steps (0 = train.steps), HF Trainer's total
      set("train.decay_steps", std::to_string(integer(*v, P + "total_num_steps", 1)),
          P + "total_num_steps");
  }
  if (!cosine) {
    known.insert({"warmup_min_lr", "warmup_max_lr"});
    const Json* lo = json::find(p, "warmup_min_lr");
    // HF Trainer resolves warmup_min_lr "auto" to 0.
    set("train.warmup_min_lr", num(lo && !is_auto(*lo) ? number(*lo, P + "warmup_min_lr", 0) : 0.0),
        P + "warmup_min_lr");
    const Json* hi = json::find(p, "warmup_max_lr");
    if (!hi || !is_auto(*hi)) {  // the scheduler sets the rate: the optimizer's lr is unused
      const double x = hi ? number(*hi, P + "warmup_max_lr", 0) : 0.001;
      if (optimizer_lr_ && *optimizer_lr_ != x)
        no_effect("optimizer.params.lr", cat(type, "'s warmup_max_lr sets the learning rate"));
      set("train.lr", num(x), P + "warmup_max_lr");
      lr_from_scheduler_ = true;
    }
  } else {
    known.insert({"warmup_min_ratio", "cos_min_ratio"});
    const double lr = current<double>("train.lr");
    const Json* wr = json::find(p, "warmup_min_ratio");
    const Json* cr = json::find(p, "cos_min_ratio");
    const double w = wr ? number(*wr, P + "warmup_min_ratio", 0) : 0.0;
    const double c = cr ? number(*cr, P + "cos_min_ratio", 0) : 1e-4;
    // Rates, not ratios, in meshtrain: of the run's lr (the command line's, if it gives one).
    set("train.warmup_min_lr", num(w * lr), P + "warmup_min_ratio");
    set("train.min_lr", num(c * lr), P + "cos_min_ratio");
  }
  for (auto it = p.begin(); it != p.end(); ++it)
    if (!known.count(it.key())) unknown(it.key(), known, P);
}

void Mapper::precision() {
  auto enabled = [&](const char* section) -> std::optional<bool> {  // nullopt: absent or "auto"
    const Json* s = json::find(*doc_, section);
    if (!s) return std::nullopt;
    object(*s, section);
    const Json* e = json::find(*s, "enabled");
    if (!e || is_auto(*e)) return e ? std::nullopt : std::optional<bool>(false);
    return boolean(*e, cat(section, ".enabled"));
  };
  const char* bf_name = json::find(*doc_, "bf16") ? "bf16" : "bfloat16";
  const std::optional<bool> fp16 = enabled("fp16"), bf16 = enabled(bf_name);
  if (const Json* amp = json::find(*doc_, "amp")) {
    object(*amp, "amp");
    if (const Json* e = json::find(*amp, "enabled"); e && boolean(*e, "amp.enabled"))
      fail("amp.enabled", "=true: Apex AMP is not built; use fp16 or bf16");
  }
  if (fp16.value_or(false) && bf16.value_or(false))
    fail("fp16.enabled", cat("and ", bf_name, ".enabled are both true; DeepSpeed and meshtrain "
                             "train in one of them"));
  if (bf16.value_or(false)) set("train.precision", "bf16", cat(bf_name, ".enabled"));
  if (const Json* b = json::find(*doc_, bf_name))
    for (auto it = b->begin(); it != b->end(); ++it)
      if (it.key() != "enabled") no_effect(cat(bf_name, ".", it.key()));
  const Json* f = json::find(*doc_, "fp16");
  if (!f) return;
  if (fp16.value_or(false)) set("train.precision", "fp16", "fp16.enabled");
  const Json* e = json::find(*f, "enabled");
  const bool maybe = fp16.value_or(false) || (e && is_auto(*e));  // "auto": fp16 if meshtrain's is
  const std::string P = "fp16.";
  for (auto it = f->begin(); it != f->end(); ++it) {
    const std::string& k = it.key();
    if (k == "enabled") continue;
    if (!maybe) {
      no_effect(P + k, "fp16 is off");
      continue;
    }
    if (k == "loss_scale") {
      const double s = number(*it, P + k, 0);
      if (s > 0) {
        set("train.loss_scaling", "static", P + k);
        set("train.loss_scale_init", num(s), P + k);
      }
    } else if (k == "initial_scale_power") {
      const long pw = integer(*it, P + k, 0);
      if (pw > 100) fail(P + k, cat("=", pw, " puts the loss scale 2^", pw, " beyond fp32"));
      set("train.loss_scale_init", num(std::ldexp(1.0, static_cast<int>(pw))), P + k);
    } else if (k == "loss_scale_window") {
      set("train.loss_scale_window", std::to_string(integer(*it, P + k, 1)), P + k);
    } else if (k == "hysteresis") {
      set("train.loss_scale_hysteresis", std::to_string(integer(*it, P + k, 1)), P + k);
    } else if (k == "consecutive_hysteresis") {
      set("train.loss_scale_consecutive_hysteresis", boolean(*it, P + k) ? "true" : "false", P + k);
    } else if (k == "min_loss_scale") {
      if (number(*it, P + k, 0) <= 0) fail(P + k, "must be > 0");
      set("train.loss_scale_min", num(it->get<double>()), P + k);
    } else if (k == "auto_cast" || k == "fp16_master_weights_and_grads") {
      if (boolean(*it, P + k))
        no_effect(P + k, k == "auto_cast" ? "meshtrain casts every layer"
                                          : "meshtrain keeps fp32 master weights");
    } else {
      unknown(k, {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
                  "hysteresis", "consecutive_hysteresis", "min_loss_scale", "auto_cast",
                  "fp16_master_weights_and_grads"}, P);
    }
  }
  // DeepSpeed's documented default; meshtrain's own is 1 (halve on every overflow).
  if (maybe && !json::find(*f, "hysteresis") && !json::find(*f, "loss_scale"))
    set("train.loss_scale_hysteresis", "2", "fp16.hysteresis (DeepSpeed's default)");
}

void Mapper::zero() {
  const Json* z = json::find(*doc_, "zero_optimization");
  if (!z) return;
  if (z->is_boolean()) {  // DeepSpeed's legacy form: true is stage 1
    set("zero.stage", z->get<bool>() ? "1" : "0", "zero_optimization");
    return;
  }
  object(*z, "zero_optimization");
  const std::string P = "zero_optimization.";
  std::optional<long> reduce, gather;
  for (auto it = z->begin(); it != z->end(); ++it) {
    const std::string& k = it.key();
    if (k == "stage") {
      const long s = integer(*it, P + k, 0);
      if (s > 3) fail(P + k, cat("=", s, " does not exist (0-3)"));
      set("zero.stage", std::to_string(s), P + k);
    } else if (k == "offload_optimizer" || k == "offload_param") {
      if (it->is_null()) continue;
      object(*it, P + k);
      std::string device = "none";
      for (auto o = it->begin(); o != it->end(); ++o) {
        if (o.key() == "device") device = text(*o, P + k + ".device");
        else if (kOffloadNoEffect.count(o.key())) no_effect(P + k + "." + o.key());
        else unknown(o.key(), {"device", "pin_memory", "buffer_count", "nvme_path"}, P + k + ".");
      }
      if (device != "none" && device != "cpu" && device != "nvme")
        fail(P + k + ".device", cat("='", device, "' is not one of none, cpu, nvme"));
      if (k == "offload_param" && device != "none")
        fail(P + k + ".device", cat("='", device, "': meshtrain cannot offload parameters; remove "
                                    "offload_param (`meshtrain plan` tells whether the model "
                                    "fits without it)"));
      if (device == "nvme")
        fail(P + k + ".device", "='nvme': meshtrain offloads the optimizer to host memory only "
                                "(device cpu)");
      set("zero.offload_optimizer", device, P + k + ".device");
    } else if (k == "cpu_offload") {  // legacy
      if (boolean(*it, P + k)) set("zero.offload_optimizer", "cpu", P + k);
    } else if (k == "overlap_comm") {
      set("dp.overlap", boolean(*it, P + k) ? "true" : "false", P + k);
    } else if (k == "reduce_bucket_size" || k == "allgather_bucket_size") {
      const long n = is_auto(*it) && k == "reduce_bucket_size" && ctx_.n_embd > 0
                         ? static_cast<long>(ctx_.n_embd) * ctx_.n_embd  // HF Trainer: hidden^2
                         : integer(*it, P + k, 1);
      (k == "reduce_bucket_size" ? reduce : gather) = n;
    } else if (k == "contiguous_gradients" || k == "reduce_scatter" ||
               k == "allgather_partitions") {
      // What meshtrain always does: gradients in one flat buffer, reduce-scattered at ZeRO
      // 2/3, updated pieces all-gathered.
      if (!boolean(*it, P + k)) no_effect(P + k + "=false", "meshtrain always does it");
    } else if (kZeroNoEffect.count(k)) {
      no_effect(P + k);
    } else {
      std::set<std::string> known(kZeroNoEffect);
      known.insert({"stage", "offload_optimizer", "offload_param", "overlap_comm",
                    "reduce_bucket_size", "allgather_bucket_size", "contiguous_gradients",
                    "reduce_scatter", "allgather_partitions", "cpu_offload"});
      unknown(k, known, P);
    }
  }
  // One bucket size in meshtrain: its parameter all-gathers (ZeRO 1/2) follow the reduction's.
  const std::optional<long> bucket = reduce ? reduce : gather;
  if (bucket) {
    const double mb = static_cast<double>(*bucket) * ctx_.grad_bytes / 1048576.0;
    set("dp.bucket_mb", num(mb), P + (reduce ? "reduce_bucket_size" : "allgather_bucket_size"));
  }
  if (reduce && gather && *reduce != *gather)
    no_effect(P + "allgather_bucket_size", "meshtrain gathers in its reduction buckets, "
                                           "dp.bucket_mb");
}

void Mapper::activation_checkpointing() {
  const Json* a = json::find(*doc_, "activation_checkpointing");
  if (!a) return;
  object(*a, "activation_checkpointing");
  // The section configures the checkpointing a DeepSpeed model calls; meshtrain checkpoints
  // every block.
  set("train.recompute", "true", "activation_checkpointing");
  const std::string P = "activation_checkpointing.";
  for (auto it = a->begin(); it != a->end(); ++it) {
    const std::string& k = it.key();
    if (k == "partition_activations") {
      // Each tp rank keeps 1/tp of the checkpointed activations: sequence parallelism's split.
      if (boolean(*it, P + k)) set("tp.sequence_parallel", "true", P + k);
    } else if (k == "cpu_checkpointing") {
      if (boolean(*it, P + k))
        fail(P + k, "=true: meshtrain keeps checkpointed activations on the device");
    } else if (k == "contiguous_memory_optimization" || k == "number_checkpoints" ||
               k == "synchronize_checkpoint_boundary" || k == "profile") {
      if (!it->is_null() && (!it->is_boolean() || it->get<bool>())) no_effect(P + k);
    } else {
      unknown(k, {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                  "number_checkpoints", "synchronize_checkpoint_boundary", "profile"}, P);
    }
  }
}

void Mapper::tensorboard() {
  const Json* t = json::find(*doc_, "tensorboard");
  if (!t) return;
  object(*t, "tensorboard");
  const Json* e = json::find(*t, "enabled");
  std::string path, job = "DeepSpeedJobName";  // DeepSpeed's defaults
  for (auto it = t->begin(); it != t->end(); ++it) {
    if (it.key() == "output_path") path = text(*it, "tensorboard.output_path");
    else if (it.key() == "job_name") job = text(*it, "tensorboard.job_name");
    else if (it.key() != "enabled") unknown(it.key(), {"enabled", "output_path", "job_name"}, "tensorboard.");
  }
  if (!e || !boolean(*e, "tensorboard.enabled")) return;
  if (path.empty()) path = "runs";
  if (path.back() != '/') path += '/';
  set("train.tensorboard", path + job, "tensorboard");
}

}  // namespace

const DsOption* DsMapping::find(const std::string& key) const {
  for (const auto& o : options)
    if (o.key == key) return &o;
  return nullptr;
}

std::string DsMapping::warning() const {
  if (no_effect.empty() && unknown.empty()) return "";
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  std::string w = cat(file, " (--deepspeed): ");
  if (!no_effect.empty()) w += cat("no effect in meshtrain: ", join(no_effect));
  if (!unknown.empty())
    w += cat(no_effect.empty() ? "" : "; ", "not DeepSpeed keys, ignored: ", join(unknown));
  return w;
}

std::string DsMapping::note() const {
  if (overridden.empty()) return "";
  std::string s = cat(file, " (--deepspeed): the command line sets ");
  for (std::size_t i = 0; i < overridden.size(); ++i) s += (i ? "; " : "") + overridden[i];
  return s;
}

DsMapping map_deepspeed(const Json& doc, const std::string& file, const DsContext& ctx) {
  MESHTRAIN_CHECK(ctx.base && ctx.on_command_line, "map_deepspeed needs the base options");
  return Mapper(file, ctx).run(doc);
}

}  // namespace meshtrain::app
