#pragma once
// Dynamic loss scaling for fp16 training (Micikevicius et al., "Mixed Precision Training",
// 2018): the loss gradient is multiplied by S so that small gradients survive fp16; a step whose
// gradients hold inf/nan is skipped and S is halved; after `window` good steps in a row S is
// doubled. S stays a power of two, so scaling and unscaling are exact.
#include <cstdint>

namespace meshtrain::optim {

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(float initial = 65536.0f, int window = 1000,
                             float min_scale = 1.0f, float max_scale = 16777216.0f)
      : scale_(initial), window_(window), min_(min_scale), max_(max_scale) {}

  float scale() const { return scale_; }
  std::int64_t skipped() const { return skipped_; }
  int good_steps() const { return good_; }  // finite steps since the last change of S

  // Restore a saved state (checkpoints): the scale, the good steps of the current window and
  // the count of skipped steps.
  void set_state(float scale, int good_steps, std::int64_t skipped) {
    scale_ = scale;
    good_ = good_steps;
    skipped_ = skipped;
  }

  // Record the outcome of a step: `finite` = the gradients were finite and the update applied.
  void update(bool finite) {
    if (!finite) {
      scale_ = scale_ * 0.5f < min_ ? min_ : scale_ * 0.5f;
      good_ = 0;
      ++skipped_;
      return;
    }
    if (++good_ >= window_) {
      scale_ = scale_ * 2.0f > max_ ? max_ : scale_ * 2.0f;
      good_ = 0;
    }
  }

 private:
  float scale_;
  int window_;
  float min_, max_;
  int good_ = 0;
  std::int64_t skipped_ = 0;
};

}  // namespace meshtrain::optim
