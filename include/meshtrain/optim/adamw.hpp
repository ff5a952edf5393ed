#pragma once
// AdamW over flat fp32 buffers: global gradient norm, clipping, the decoupled-weight-decay
// update, and the learning-rate schedule (meshtrain's linear warmup and cosine decay to min_lr,
// a constant rate, or one of DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR). Decay applies
// to the ranges the caller marks (the registry's 2-D weights and embeddings,
// ParameterRegistry::decay_ranges), not to biases and norms.
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/core/view.hpp"
#include "meshtrain/kernels/adamw.hpp"
#include "meshtrain/core/decay_range.hpp"

namespace meshtrain::optim {

// The shape of the learning rate over the steps (train.lr_schedule). The ds_* shapes are
// DeepSpeed's schedulers (deepspeed/runtime/lr_schedules.py) as its engine steps them: once after
// every optimizer step, so step 0 runs at the rate the scheduler set when it was built.
enum class LrSchedule {
  cosine,            // meshtrain: linear warmup to lr, cosine to min_lr at decay_steps
  constant,          // lr at every step (DeepSpeed's engine without a scheduler)
  ds_warmup,         // WarmupLR: warmup_min_lr -> lr over max(2, warmup) steps, then lr
  ds_warmup_decay,   // WarmupDecayLR: WarmupLR's warmup, then linear to warmup_min_lr at
                     // decay_steps
  ds_warmup_cosine,  // WarmupCosineLR: warmup_min_lr -> lr, then cosine to min_lr at decay_steps
};
enum class WarmupType { linear, log };  // DeepSpeed's warmup_type (its default: log)
LrSchedule parse_lr_schedule(const std::string& text);  // ConfigError naming train.lr_schedule
WarmupType parse_warmup_type(const std::string& text);  // ConfigError naming train.warmup_type
const char* lr_schedule_name(LrSchedule s);

struct AdamWConfig {
  float lr = 6e-4f;
  float min_lr = 6e-5f;
  int warmup_steps = 0;
  std::int64_t decay_steps = 0;  // cosine from lr to min_lr over [warmup, decay_steps]; 0: constant
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;  // max global L2 norm; <= 0 disables clipping
  LrSchedule schedule = LrSchedule::cosine;
  WarmupType warmup_type = WarmupType::linear;  // ds_* schedules only
  float warmup_min_lr = 0.0f;                   // ds_* schedules: the rate warmup starts from
};

// Learning rate of 0-based step `step` under c.schedule. cosine: linear warmup over
// warmup_steps (reaching lr at the end of warmup), then cosine decay to min_lr at decay_steps,
// constant min_lr after. The ds_* shapes follow DeepSpeed's formulas in double precision.
float lr_at(const AdamWConfig& c, std::int64_t step);

// T is the model's compute type. For T = float the model's parameters are the master weights;
// otherwise the optimizer keeps fp32 master weights (initialised from the model's parameters by
// init_master) and writes the rounded copy back into the model's buffer after each update.
template <class T>
class AdamWT {
 public:
  // `ranges` cover the parameters of a flat buffer of `size` elements in increasing order
  // (gaps between them hold zeros, which the update keeps zero).
  AdamWT(const std::vector<DecayRange>& ranges, std::size_t size, const AdamWConfig& cfg,
         ExecSpace exec = ExecSpace{});

  // Mixed precision only: master = float(params). Call once after the model is initialised.
  void init_master(View1<const T> params);

  // One update with the gradients in `grads` (0-based step index, for the schedule and bias
  // correction). Computes the global norm into grad_norm() (device scalar; no host sync).
  // With loss scaling the gradients carry the factor loss_scale: the norm and the update remove
  // it. check_finite reads the sum of squares back to the host (the one synchronisation loss
  // scaling needs) and skips the update when it is not finite. Returns whether it was applied.
  bool step(View1<T> params, View1<const T> grads, std::int64_t step, float loss_scale = 1.0f,
            bool check_finite = false);
  View1<float> master() const { return master_; }

  Scalar<float> grad_norm() const { return norm_; }
  View1<float> exp_avg() const { return m_; }
  View1<float> exp_avg_sq() const { return v_; }
  const AdamWConfig& config() const { return cfg_; }

  const std::vector<DecayRange>& ranges() const { return ranges_; }

 private:
  AdamWConfig cfg_;
  ExecSpace exec_;
  std::vector<DecayRange> ranges_;
  // The ranges on the device, for the one-launch update (kernels::adamw_update_ranges).
  View1<std::int64_t> range_begin_;
  View1<float> range_decay_;
  View1<float> master_;  // empty for T = float
  View1<float> m_, v_;
  Scalar<float> sumsq_, norm_, scale_;
};

using AdamW = AdamWT<float>;

}  // namespace meshtrain::optim
