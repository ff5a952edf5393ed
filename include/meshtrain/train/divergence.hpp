#pragma once
// What the trainer does when a step is not finite (issue 17). A pure policy, tested without MPI:
// the trainer feeds it each step's health, agreed over every rank (so every rank takes the same
// decision at the same step), and executes the action.
//
//   stop (default)  end the run with exit 1 naming the step; nothing is saved, exported or
//                   rotated away from the non-finite state (the last checkpoint stays `latest`)
//   skip            leave the step's update out (the optimizer already skipped it: its finite
//                   check runs for every precision) and go on with the next batch
//   rollback        restore the last checkpoint and train on, leaving the batch that diverged
//                   out of the data order; at most max_rollbacks times
// Under dynamic loss scaling a step with inf/nan gradients and a finite loss is the scaler's
// business (it halves the scale), but max_skipped_steps of them in a row stop the run: the
// scale cannot recover what the model has lost.
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/io/dataset.hpp"

namespace meshtrain::train {

enum class OnNonFinite { stop, skip, rollback };
OnNonFinite parse_on_nonfinite(const std::string& s);  // ConfigError naming train.on_nonfinite
const char* on_nonfinite_name(OnNonFinite p);

struct DivergenceConfig {
  OnNonFinite on_nonfinite = OnNonFinite::stop;
  int max_rollbacks = 3;       // rollback: restores per run
  int max_skipped_steps = 50;  // consecutive steps without an update (loss scaling or skip)
};

// One step, as every rank agrees it was.
struct StepHealth {
  bool loss_finite = true;
  bool grads_finite = true;  // false: the optimizer found inf/nan gradients and skipped the update
};

enum class DivergenceAction { proceed, skip, rollback, stop };

class DivergenceGuard {
 public:
  DivergenceGuard() = default;
  DivergenceGuard(const DivergenceConfig& cfg, bool loss_scaling)
      : cfg_(cfg), loss_scaling_(loss_scaling) {}

  // `step` is 0-based. reason() explains any action other than proceed.
  DivergenceAction on_step(std::int64_t step, const StepHealth& h);
  const std::string& reason() const { return reason_; }
  int rollbacks() const { return rollbacks_; }
  int consecutive_skips() const { return skips_; }
  const DivergenceConfig& config() const { return cfg_; }

 private:
  DivergenceConfig cfg_;
  bool loss_scaling_ = false;
  int rollbacks_ = 0, skips_ = 0;
  std::string reason_;
};

// Which data batch a step reads, given the batches a rollback left out, is the data order's:
// io::batch_of_step (io/dataset.hpp), named here for the policy's callers.
using io::batch_of_step;

// "3,17,42" and back, for the checkpoint attribute extra.train.skipped_batches.
std::string format_batches(const std::vector<std::int64_t>& b);
std::vector<std::int64_t> parse_batches(const std::string& s);  // ConfigError on bad text

}  // namespace meshtrain::train
