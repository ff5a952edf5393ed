#pragma once
// Dynamic loss scaling for fp16 training (Micikevicius et al., "Mixed Precision Training",
// 2018): the loss gradient is multiplied by S so that small gradients survive fp16; a step whose
// gradients hold inf/nan is skipped and S is halved; after `window` good steps in a row S is
// doubled. S stays a power of two, so scaling and unscaling are exact.
//
// DeepSpeed's variant (deepspeed/runtime/fp16/loss_scaler.py) adds hysteresis: S is halved only
// on the `hysteresis`-th overflow, the earlier ones use up the hysteresis, which is refilled
// when S doubles (or after every good step with consecutive hysteresis). hysteresis = 1 is the
// plain rule above. A static scaler (DeepSpeed's loss_scale > 0) keeps S as it is; a step with
// inf/nan gradients is still skipped.
#include <cstdint>

namespace meshtrain::optim {

struct LossScalerConfig {
  float initial = 65536.0f;
  int window = 1000;
  float min_scale = 1.0f, max_scale = 16777216.0f;
  int hysteresis = 1;
  bool consecutive_hysteresis = false;
  bool dynamic = true;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(float initial = 65536.0f, int window = 1000,
                             float min_scale = 1.0f, float max_scale = 16777216.0f)
      : DynamicLossScaler(LossScalerConfig{initial, window, min_scale, max_scale}) {}
  explicit DynamicLossScaler(const LossScalerConfig& c)
      : c_(c), scale_(c.initial), hysteresis_(c.hysteresis) {}

  float scale() const { return scale_; }
  std::int64_t skipped() const { return skipped_; }
  int good_steps() const { return good_; }  // finite steps since the last change of S
  int hysteresis() const { return hysteresis_; }  // overflows left before S halves

  // Restore a saved state (checkpoints): the scale, the good steps of the current window, the
  // count of skipped steps and the hysteresis left (-1: full).
  void set_state(float scale, int good_steps, std::int64_t skipped, int hysteresis = -1) {
    scale_ = scale;
    good_ = good_steps;
    skipped_ = skipped;
    hysteresis_ = hysteresis < 0 ? c_.hysteresis : hysteresis;
  }

  // Record the outcome of a step: `finite` = the gradients were finite and the update applied.
  void update(bool finite) {
    if (!finite) {
      ++skipped_;
      if (!c_.dynamic) return;
      good_ = 0;
      if (hysteresis_ > 1) {
        --hysteresis_;
        return;
      }
      scale_ = scale_ * 0.5f < c_.min_scale ? c_.min_scale : scale_ * 0.5f;
      return;
    }
    if (!c_.dynamic) return;
    if (c_.consecutive_hysteresis) hysteresis_ = c_.hysteresis;
    if (++good_ >= c_.window) {
      scale_ = scale_ * 2.0f > c_.max_scale ? c_.max_scale : scale_ * 2.0f;
      good_ = 0;
      hysteresis_ = c_.hysteresis;
    }
  }

 private:
  LossScalerConfig c_;
  float scale_;
  int hysteresis_;
  int good_ = 0;
  std::int64_t skipped_ = 0;
};

}  // namespace meshtrain::optim
