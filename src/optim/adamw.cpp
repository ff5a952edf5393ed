#include "meshtrain/optim/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "meshtrain/core/error.hpp"

namespace meshtrain::optim {

LrSchedule parse_lr_schedule(const std::string& t) {
  if (t == "cosine") return LrSchedule::cosine;
  if (t == "constant") return LrSchedule::constant;
  if (t == "ds_warmup") return LrSchedule::ds_warmup;
  if (t == "ds_warmup_decay") return LrSchedule::ds_warmup_decay;
  if (t == "ds_warmup_cosine") return LrSchedule::ds_warmup_cosine;
  throw ConfigError(cat("train.lr_schedule='", t, "' is not one of cosine, constant, ds_warmup, "
                        "ds_warmup_decay, ds_warmup_cosine"));
}

WarmupType parse_warmup_type(const std::string& t) {
  if (t == "linear") return WarmupType::linear;
  if (t == "log") return WarmupType::log;
  throw ConfigError(cat("train.warmup_type='", t, "' is not one of linear, log"));
}

const char* lr_schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::cosine: return "cosine";
    case LrSchedule::constant: return "constant";
    case LrSchedule::ds_warmup: return "ds_warmup";
    case LrSchedule::ds_warmup_decay: return "ds_warmup_decay";
    case LrSchedule::ds_warmup_cosine: return "ds_warmup_cosine";
  }
  return "?";
}

namespace {

// DeepSpeed's schedulers: the engine calls scheduler.step() after each optimizer step, so the
// rate of step s was set by the scheduler's iteration i = s - 1 (i = -1: the constructor's rate,
// warmup_min_lr for WarmupLR and WarmupDecayLR, 0 for WarmupCosineLR). Warmup lasts
// W = max(2, warmup_num_steps) iterations; its fraction is i / W (linear) or log(i + 1) / log(W).
double deepspeed_lr(const AdamWConfig& c, std::int64_t step) {
  const double lo = c.warmup_min_lr, hi = c.lr;
  const std::int64_t i = step - 1;
  if (i < 0) return c.schedule == LrSchedule::ds_warmup_cosine ? 0.0 : lo;
  const std::int64_t W = std::max<std::int64_t>(2, c.warmup_steps);
  if (i < W) {
    const double f = c.warmup_type == WarmupType::log
                         ? std::log(static_cast<double>(i + 1)) / std::log(static_cast<double>(W))
                         : static_cast<double>(i) / static_cast<double>(W);
    return lo + (hi - lo) * f;
  }
  const double T = static_cast<double>(c.decay_steps);
  switch (c.schedule) {
    case LrSchedule::ds_warmup_decay:
      return lo + (hi - lo) * std::max(0.0, (T - static_cast<double>(i)) /
                                                std::max(1.0, T - static_cast<double>(W)));
    case LrSchedule::ds_warmup_cosine: {
      // Ratios of lr in DeepSpeed (cos_min_ratio = min_lr / lr), the same rates here.
      const double done = static_cast<double>(i - W + 1) / (T - static_cast<double>(W));
      const double ratio_lo = hi > 0 ? c.min_lr / hi : 0.0;
      const double ratio = ratio_lo + (1.0 - ratio_lo) * (1.0 + std::cos(M_PI * done)) / 2.0;
      return hi * std::max(0.0, ratio);
    }
    default:
      return hi;
  }
}

}  // namespace

float lr_at(const AdamWConfig& c, std::int64_t step) {
  switch (c.schedule) {
    case LrSchedule::constant: return c.lr;
    case LrSchedule::ds_warmup:
    case LrSchedule::ds_warmup_decay:
    case LrSchedule::ds_warmup_cosine: return static_cast<float>(deepspeed_lr(c, step));
    case LrSchedule::cosine: break;
  }
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return c.lr * static_cast<float>(step + 1) / static_cast<float>(c.warmup_steps);
  if (c.decay_steps <= 0) return c.lr;
  if (step >= c.decay_steps) return c.min_lr;
  const double span = static_cast<double>(c.decay_steps - c.warmup_steps);
  const double progress = span > 0 ? (step - c.warmup_steps) / span : 1.0;
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * progress));  // 1 -> 0
  return static_cast<float>(c.min_lr + coeff * (c.lr - c.min_lr));
}

template <class T>
AdamWT<T>::AdamWT(const std::vector<DecayRange>& ranges, std::size_t size, const AdamWConfig& cfg,
                  ExecSpace exec)
    : cfg_(cfg), exec_(exec) {
  // Merge consecutive ranges with the same decay flag: the alignment gaps between them hold
  // zeros in params and grads, which AdamW leaves at zero.
  for (const auto& p : ranges) {
    MESHTRAIN_CHECK(p.offset + p.length <= size, "AdamW: range [", p.offset, ", ",
                    p.offset + p.length, ") outside a buffer of ", size);
    if (!ranges_.empty() && ranges_.back().decay == p.decay) {
      ranges_.back().length = p.offset + p.length - ranges_.back().offset;
    } else {
      ranges_.push_back(p);
    }
  }
  range_begin_ = alloc<std::int64_t>("optim.range_begin", ranges_.size());
  range_decay_ = alloc<float>("optim.range_decay", ranges_.size());
  {
    auto hb = Kokkos::create_mirror_view(range_begin_);
    auto hd = Kokkos::create_mirror_view(range_decay_);
    for (std::size_t r = 0; r < ranges_.size(); ++r) {
      hb(r) = static_cast<std::int64_t>(ranges_[r].offset);
      hd(r) = ranges_[r].decay ? 1.0f : 0.0f;
    }
    Kokkos::deep_copy(range_begin_, hb);
    Kokkos::deep_copy(range_decay_, hd);
  }
  if constexpr (!std::is_same_v<T, float>) master_ = zeros<float>("optim.master", size);
  m_ = zeros<float>("optim.exp_avg", size);
  v_ = zeros<float>("optim.exp_avg_sq", size);
  sumsq_ = Scalar<float>("meshtrain::optim.sumsq");
  norm_ = Scalar<float>("meshtrain::optim.grad_norm");
  scale_ = Scalar<float>("meshtrain::optim.clip_scale");
}

template <class T>
void AdamWT<T>::init_master(View1<const T> params) {
  if constexpr (!std::is_same_v<T, float>) {
    auto master = master_;
    Kokkos::parallel_for(
        "meshtrain::optim_init_master",
        Kokkos::RangePolicy<ExecSpace>(exec_, 0, static_cast<std::int64_t>(params.span())),
        KOKKOS_LAMBDA(const std::int64_t i) { master(i) = static_cast<float>(params(i)); });
  }
}

template <class T>
bool AdamWT<T>::step(View1<T> params, View1<const T> grads, std::int64_t step, float loss_scale,
                     bool check_finite) {
  kernels::sum_squares<T>(exec_, sumsq_, grads, grads.span(), false);
  if (check_finite) {
    float sumsq = 0;
    Kokkos::deep_copy(exec_, sumsq, sumsq_);
    exec_.fence();
    if (!std::isfinite(sumsq)) {
      Kokkos::deep_copy(exec_, norm_, sumsq);  // report the non-finite norm
      return false;
    }
  }
  kernels::clip_scale(exec_, scale_, norm_, sumsq_, cfg_.grad_clip, 1.0f / loss_scale);
  kernels::AdamWHyper h;
  h.lr = lr_at(cfg_, step);
  h.beta1 = cfg_.beta1;
  h.beta2 = cfg_.beta2;
  h.eps = cfg_.eps;
  h.weight_decay = cfg_.weight_decay;
  h.step = static_cast<int>(step + 1);
  // One launch over the whole buffer (the alignment gaps between parameters hold zeros, which
  // the update leaves at zero).
  const std::size_t n = m_.extent(0);
  if constexpr (std::is_same_v<T, float>)
    kernels::adamw_update_ranges<float>(exec_, params, grads, m_, v_, n, h, range_begin_,
                                        range_decay_, scale_, View1<float>());
  else
    kernels::adamw_update_ranges<T>(exec_, master_, grads, m_, v_, n, h, range_begin_,
                                    range_decay_, scale_, params);
  return true;
}

template class AdamWT<float>;
#if MESHTRAIN_HAVE_BF16
template class AdamWT<bf16>;
template class AdamWT<fp16>;
#endif

}  // namespace meshtrain::optim
