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

#include "deepspeed_mapper.hpp"
#include "meshtrain/core/error.hpp"

namespace meshtrain::app {

namespace ds {

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
  const bool torch_adam =
      json::find(p, "torch_adam") && boolean(p["torch_adam"], "optimizer.params.torch_adam");
  const bool w_mode = !json::find(p, "adam_w_mode") ||
                      boolean(p["adam_w_mode"], "optimizer.params.adam_w_mode");
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
    if (json::find(*doc_, "optimizer"))
      set("train.lr_schedule", "constant", "optimizer (no scheduler)");
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
    if (it.key() != "type" && it.key() != "params")
      unknown(it.key(), {"type", "params"}, "scheduler.");
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

}  // namespace ds


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
  return ds::Mapper(file, ctx).run(doc);
}

}  // namespace meshtrain::app

