#include "meshtrain/train/divergence.hpp"

#include <algorithm>
#include <sstream>

#include "meshtrain/core/error.hpp"

namespace meshtrain::train {

OnNonFinite parse_on_nonfinite(const std::string& s) {
  if (s == "stop") return OnNonFinite::stop;
  if (s == "skip") return OnNonFinite::skip;
  if (s == "rollback") return OnNonFinite::rollback;
  throw ConfigError(cat("train.on_nonfinite='", s, "' is not one of stop, skip, rollback"));
}

const char* on_nonfinite_name(OnNonFinite p) {
  switch (p) {
    case OnNonFinite::stop: return "stop";
    case OnNonFinite::skip: return "skip";
    case OnNonFinite::rollback: return "rollback";
  }
  return "?";
}

DivergenceAction DivergenceGuard::on_step(std::int64_t step, const StepHealth& h) {
  reason_.clear();
  if (h.loss_finite && h.grads_finite) {
    skips_ = 0;
    return DivergenceAction::proceed;
  }
  const std::string what =
      !h.loss_finite ? (h.grads_finite ? "non-finite loss" : "non-finite loss and gradients")
                     : "non-finite gradients";
  const std::string at = cat(what, " at step ", step + 1);
  auto too_many_skips = [&](const char* why) {
    reason_ = cat(at, ": ", skips_, " consecutive steps without an update (", why,
                  "; train.max_skipped_steps=", cfg_.max_skipped_steps, ")");
    return DivergenceAction::stop;
  };
  // Loss scaling owns overflowing gradients as long as the loss itself is finite.
  if (loss_scaling_ && h.loss_finite) {
    if (++skips_ >= cfg_.max_skipped_steps) return too_many_skips("inf/nan gradients under loss scaling");
    reason_ = cat(at, ": update skipped by loss scaling");
    return DivergenceAction::skip;
  }
  switch (cfg_.on_nonfinite) {
    case OnNonFinite::stop:
      reason_ = at;
      return DivergenceAction::stop;
    case OnNonFinite::skip:
      if (++skips_ >= cfg_.max_skipped_steps) return too_many_skips("train.on_nonfinite=skip");
      reason_ = cat(at, ": update skipped (train.on_nonfinite=skip)");
      return DivergenceAction::skip;
    case OnNonFinite::rollback:
      if (rollbacks_ >= cfg_.max_rollbacks) {
        reason_ = cat(at, " after ", rollbacks_, " rollback(s) (train.max_rollbacks=",
                      cfg_.max_rollbacks, ")");
        return DivergenceAction::stop;
      }
      ++rollbacks_;
      skips_ = 0;
      reason_ = cat(at, ": rollback ", rollbacks_, " of at most ", cfg_.max_rollbacks);
      return DivergenceAction::rollback;
  }
  return DivergenceAction::stop;
}

std::string format_batches(const std::vector<std::int64_t>& b) {
  std::string s;
  for (std::int64_t x : b) s += cat(s.empty() ? "" : ",", x);
  return s;
}

std::vector<std::int64_t> parse_batches(const std::string& s) {
  std::vector<std::int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    std::size_t pos = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    MESHTRAIN_CONFIG_CHECK(pos == item.size() && v >= 0, "skipped batch list '", s,
                           "' (checkpoint attribute extra.train.skipped_batches) is malformed");
    out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace meshtrain::train
