// The mapper of app/deepspeed_config.cpp and deepspeed_sections.cpp: one document's typed
// reads (each naming the key and the file) and the options in the order they are decided.
// Internal to the app layer.
#pragma once
#include <optional>
#include <set>
#include <string>

#include "meshtrain/app/deepspeed_config.hpp"
#include "meshtrain/core/error.hpp"

namespace meshtrain::app::ds {

// Keys DeepSpeed knows that meshtrain has no use for, and the top-level keys it maps.
extern const std::set<std::string> kNoEffectTop, kZeroNoEffect, kOffloadNoEffect, kMapped;

std::string shown(const Json& v);
std::string num(double x);  // the shortest text that reads back as x
std::size_t edit_distance(const std::string& a, const std::string& b);

class Mapper {
 public:
  Mapper(const std::string& file, const DsContext& ctx) : ctx_(ctx) { out_.file = file; }

  DsMapping run(const Json& doc) {
    if (!doc.is_object())
      fail("", cat("is ", shown(doc).substr(0, 40),
                   ": a DeepSpeed configuration is a JSON object"));
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
      if (cmd != value)
        out_.overridden.push_back(cat(key, "=", cmd, " over ", from, " (", value, ")"));
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


}  // namespace meshtrain::app::ds
