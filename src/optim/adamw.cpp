#include "meshtrain/optim/adamw.hpp"

#include <cmath>
#include <type_traits>

#include "meshtrain/core/error.hpp"

namespace meshtrain::optim {

float lr_at(const AdamWConfig& c, std::int64_t step) {
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
