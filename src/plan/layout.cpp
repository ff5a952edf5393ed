#include "meshtrain/plan/layout.hpp"

#include "meshtrain/core/error.hpp"

namespace meshtrain::plan {

Precision parse_precision(const std::string& text) {
  if (text == "fp32") return Precision::fp32;
  if (text == "bf16") return Precision::bf16;
  if (text == "fp16") return Precision::fp16;
  throw ConfigError(cat("train.precision='", text, "' is not one of fp32, bf16, fp16"));
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

parallel::ScheduleSpec Layout::schedule_spec() const {
  parallel::ScheduleSpec s;
  s.kind = pp == 1 ? parallel::ScheduleKind::one_f_one_b : schedule;
  s.pp = pp;
  s.n_micro = n_micro;
  s.chunks = virtual_chunks;
  return s;
}

std::string Layout::name() const {
  std::string s = cat("dp ", dp, ep > 1 ? cat(" (ep ", ep, ")") : std::string(),
                      cp > 1 ? cat(" x cp ", cp, cp_all_gather ? " (all_gather)" : "") : std::string(),
                      " x pp ", pp);
  if (pp > 1) {
    s += cat(" (", parallel::schedule_name(schedule));
    if (virtual_chunks > 1) s += cat(", v ", virtual_chunks);
    s += ")";
  }
  s += cat(" x tp ", tp, sequence_parallel && tp > 1 ? " sp" : "", ", ZeRO-", zero_stage,
           offload ? " offload" : "", ", mb ", micro_batch, " x ", n_micro,
           recompute ? ", recompute" : "", recompute_mlp_act ? ", recompute MLP act" : "", ", ",
           precision_name(precision), fp8 ? cat(" + fp8 linears (", fp8_rowwise ? "rowwise" :
                                                "tensorwise", fp8_experts ? ", experts" : "", ")")
                                          : std::string());
  return s;
}

std::string Layout::short_name() const {
  std::string s = cat(dp, "x", pp, "x", tp, ep > 1 ? cat(" ep", ep) : std::string(),
                      cp > 1 ? cat(" cp", cp, cp_all_gather ? "ag" : "") : std::string(), " z",
                      zero_stage, offload ? "+off" : "", " mb", micro_batch, "x", n_micro);
  if (pp > 1) {
    s += schedule == parallel::ScheduleKind::gpipe         ? " gpipe"
         : schedule == parallel::ScheduleKind::interleaved ? cat(" int", virtual_chunks)
                                                           : " 1f1b";
  }
  if (sequence_parallel && tp > 1) s += " sp";
  if (recompute) s += " rc";
  if (recompute_mlp_act) s += " rca";
  if (fp8) s += " fp8";
  return s;
}

}  // namespace meshtrain::plan
