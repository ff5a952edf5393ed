#include "meshtrain/optim/sharded_adamw.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/timer.hpp"

namespace meshtrain::optim {

namespace {

constexpr std::size_t kBlock = 512;  // elements converted at a time (stack buffers)

// bf16 <-> float on the host by bit arithmetic (round to nearest even, NaN kept quiet), a block
// at a time, so the loops vectorise: a CUDA build's bf16 conversions are opaque calls, and with
// them (and errno-setting sqrtf) the offloaded step of GPT-2 124M took 2.8 s on one H200 host.
template <class G>
inline constexpr bool kIsBf16 =
#if MESHTRAIN_HAVE_BF16
    std::is_same_v<G, bf16> && sizeof(G) == 2;
#else
    false;
#endif

template <class G>
void load_block(float* __restrict out, const G* __restrict in, std::size_t n) {
  if constexpr (kIsBf16<G>) {
    std::uint16_t bits[kBlock];
    std::memcpy(bits, static_cast<const void*>(in), n * 2);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t u = static_cast<std::uint32_t>(bits[i]) << 16;
      std::memcpy(&out[i], &u, 4);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
  }
}

template <class G>
void store_block(G* __restrict out, const float* __restrict in, std::size_t n) {
  if constexpr (kIsBf16<G>) {
    std::uint16_t bits[kBlock];
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t u;
      std::memcpy(&u, &in[i], 4);
      const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
      bits[i] = static_cast<std::uint16_t>(nan ? (u >> 16) | 0x40u
                                               : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    std::memcpy(static_cast<void*>(out), bits, n * 2);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<G>(in[i]);
  }
}

// The host step of CPU offload: the arithmetic of kernels::adamw_update (fp32, bias corrections
// from double) as a plain loop over raw pointers that the compiler vectorises (this file is
// built with -fno-math-errno so that sqrtf vectorises).
inline void adamw_block(float* __restrict p, const float* __restrict g, float* __restrict m,
                        float* __restrict v, std::size_t n, float lr, float b1, float b2,
                        float eps, float wd, float bc1, float bc2, float scale) {
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    p[i] = p[i] - lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
  }
}

// 16-bit gradients and the parameter copy are converted a block at a time.
template <class G>
void adamw_host(float* p, const G* g, float* m, float* v, std::size_t n,
                const kernels::AdamWHyper& h, float decay, float scale, G* copy) {
  const float lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps;
  const float wd = h.weight_decay * decay;
  const float bc1 = static_cast<float>(1.0 - std::pow(double(h.beta1), h.step));
  const float bc2 = static_cast<float>(1.0 - std::pow(double(h.beta2), h.step));
  if constexpr (std::is_same_v<G, float>) {
    adamw_block(p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, scale);
    if (copy) std::memcpy(copy, p, n * sizeof(float));
  } else {
    float gb[kBlock];
    for (std::size_t o = 0; o < n; o += kBlock) {
      const std::size_t len = std::min(kBlock, n - o);
      load_block(gb, g + o, len);
      adamw_block(p + o, gb, m + o, v + o, len, lr, b1, b2, eps, wd, bc1, bc2, scale);
      if (copy) store_block(copy + o, p + o, len);
    }
  }
}

// A contiguous run of one range, the unit of work of the threaded host loops.
struct Task {
  std::size_t range, begin, end;
};

// The ranges cut into tasks of at most `grain` elements, dealt round-robin to `threads` threads
// (a fixed assignment, so partial sums are combined in the same order every step).
template <class R>
std::vector<Task> tasks_of(const std::vector<R>& ranges, std::size_t grain) {
  std::vector<Task> out;
  for (std::size_t r = 0; r < ranges.size(); ++r)
    for (std::size_t b = 0; b < ranges[r].length; b += grain)
      out.push_back(Task{r, b, std::min(ranges[r].length, b + grain)});
  return out;
}

template <class F>
void run_threads(int threads, std::size_t n_tasks, F&& f) {
  if (threads <= 1 || n_tasks <= 1) {
    for (std::size_t i = 0; i < n_tasks; ++i) f(0, i);
    return;
  }
  const int nt = static_cast<int>(std::min<std::size_t>(threads, n_tasks));
  std::vector<std::thread> pool;
  for (int t = 1; t < nt; ++t)
    pool.emplace_back([&, t] {
      for (std::size_t i = t; i < n_tasks; i += nt) f(t, i);
    });
  for (std::size_t i = 0; i < n_tasks; i += nt) f(0, i);
  for (auto& th : pool) th.join();
}

constexpr std::size_t kHostGrain = std::size_t(1) << 16;

}  // namespace

OptimizerFootprint sharded_adamw_footprint(std::size_t S, std::size_t n_ranges,
                                           StatePlacement placement, std::size_t E) {
  // The constructor below, allocation by allocation.
  const bool master = E != 4 || placement == StatePlacement::host;
  OptimizerFootprint f;
  if (placement == StatePlacement::device) {
    f.device_state = S * 4 * (master ? 3 : 2);
    if (n_ranges > 0) f.device_other += n_ranges * (8 + 4);  // the one-launch range table
  } else {
    f.host_state = S * 4 * 3;
    f.host_staging = S * E * (E == 4 ? 1 : 2);  // gradients down, the 16-bit copy up
  }
  f.device_other += 3 * 8;  // sum of squares, norm, clip scale: rank-0 Views of 8 bytes
  return f;
}

template <class T>
ShardedAdamWT<T>::ShardedAdamWT(std::vector<ShardPiece> pieces, std::vector<ShardRange> ranges,
                                std::size_t shard_size, const AdamWConfig& cfg,
                                StatePlacement placement, ExecSpace exec, int host_threads)
    : pieces_(std::move(pieces)),
      ranges_(std::move(ranges)),
      shard_size_(shard_size),
      cfg_(cfg),
      placement_(placement),
      exec_(exec),
      has_master_(!std::is_same_v<T, float> || placement == StatePlacement::host) {
  for (const auto& r : ranges_)
    MESHTRAIN_CHECK(r.shard + r.length <= shard_size_, "ShardedAdamW: range [", r.shard, ", ",
                    r.shard + r.length, ") outside the shard of ", shard_size_);
  if (placement_ == StatePlacement::device) {
    if (has_master_) master_ = zeros<float>("optim.shard.master", shard_size_);
    m_ = zeros<float>("optim.shard.exp_avg", shard_size_);
    v_ = zeros<float>("optim.shard.exp_avg_sq", shard_size_);
  } else {
    hmaster_ = HostView1<float>("meshtrain::optim.host.master", shard_size_);
    hm_ = HostView1<float>("meshtrain::optim.host.exp_avg", shard_size_);
    hv_ = HostView1<float>("meshtrain::optim.host.exp_avg_sq", shard_size_);
    hgrads_ = HostView1<T>("meshtrain::optim.host.grads", shard_size_);
    if constexpr (!std::is_same_v<T, float>)
      hcopy_ = HostView1<T>("meshtrain::optim.host.param_copy", shard_size_);
  }
  host_threads_ = host_threads > 0 ? host_threads
                 : kDeviceIsHost ? 1
                                 : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (placement_ == StatePlacement::device && !ranges_.empty()) {
    // The table of the one-launch update: each range by its first shard element.
    range_begin_ = alloc<std::int64_t>("optim.shard.range_begin", ranges_.size());
    range_decay_ = alloc<float>("optim.shard.range_decay", ranges_.size());
    auto hb = Kokkos::create_mirror_view(range_begin_);
    auto hd = Kokkos::create_mirror_view(range_decay_);
    for (std::size_t r = 0; r < ranges_.size(); ++r) {
      MESHTRAIN_CHECK(r == 0 || ranges_[r].shard >= ranges_[r - 1].shard + ranges_[r - 1].length,
                      "ShardedAdamW: ranges out of shard order at ", r);
      hb(r) = static_cast<std::int64_t>(ranges_[r].shard);
      hd(r) = ranges_[r].decay ? 1.0f : 0.0f;
      range_end_ = ranges_[r].shard + ranges_[r].length;
    }
    Kokkos::deep_copy(range_begin_, hb);
    Kokkos::deep_copy(range_decay_, hd);
  }
  sumsq_ = Scalar<float>("meshtrain::optim.shard.sumsq");
  norm_ = Scalar<float>("meshtrain::optim.shard.grad_norm");
  scale_ = Scalar<float>("meshtrain::optim.shard.clip_scale");
}

template <class T>
bool ShardedAdamWT<T>::one_launch(Index params_where, Index grads_where) const {
  if (range_end_ == 0) return false;
  for (const ShardRange& r : ranges_)
    if (at(r, params_where) != r.shard || at(r, grads_where) != r.shard) return false;
  return true;
}

template <class T>
void ShardedAdamWT<T>::init_master(View1<const T> params, Index where) {
  if (!has_master_) return;
  for (const auto& p : pieces_) {
    if (p.length == 0) continue;
    auto src = slice(params, at(p, where), p.length);
    if (placement_ == StatePlacement::device) {
      auto dst = slice(master_, p.shard, p.length);
      Kokkos::parallel_for(
          "meshtrain::optim_shard_init_master",
          Kokkos::RangePolicy<ExecSpace>(exec_, 0, static_cast<std::int64_t>(p.length)),
          KOKKOS_LAMBDA(const std::int64_t i) { dst(i) = static_cast<float>(src(i)); });
    } else {
      auto stage = slice(hgrads_, p.shard, p.length);  // the gradient staging buffer, reused
      Kokkos::deep_copy(exec_, stage, src);
      exec_.fence();
      for (std::size_t i = 0; i < p.length; ++i)
        hmaster_(p.shard + i) = static_cast<float>(stage(i));
    }
  }
  exec_.fence();
  if (placement_ == StatePlacement::host) Kokkos::deep_copy(hgrads_, T(0.0f));
}

template <class T>
Scalar<float> ShardedAdamWT<T>::local_sumsq(View1<const T> grads, Index where) {
  if (placement_ == StatePlacement::device) {
    // The unsharded buffer with every parameter counted (one rank, or tp = pp = 1 at ZeRO-0):
    // one reduction over the whole buffer, as AdamWT, so that this path is bit-identical to it.
    bool whole = pieces_.size() == 1 && pieces_[0].flat == 0 && pieces_[0].shard == 0 &&
                 pieces_[0].length == grads.span();
    for (const auto& r : ranges_) whole = whole && r.counted;
    if (whole) {
      kernels::sum_squares<T>(exec_, sumsq_, grads, grads.span(), false);
      return sumsq_;
    }
    bool first = true;
    for (const auto& r : ranges_) {
      if (!r.counted || r.length == 0) continue;
      kernels::sum_squares<T>(exec_, sumsq_, slice(grads, at(r, where), r.length), r.length,
                              !first);
      first = false;
    }
    if (first) Kokkos::deep_copy(exec_, sumsq_, 0.0f);
    return sumsq_;
  }
  // Offload: the gradients come down once, piece by piece; the host sums and the update reads
  // them there.
  const Timer t;
  for (const auto& p : pieces_)
    if (p.length)
      Kokkos::deep_copy(exec_, slice(hgrads_, p.shard, p.length),
                        slice(grads, at(p, where), p.length));
  exec_.fence();
  const auto tasks = tasks_of(ranges_, kHostGrain);
  std::vector<double> part(tasks.size(), 0.0);
  run_threads(host_threads_, tasks.size(), [&](int, std::size_t k) {
    const Task& tk = tasks[k];
    const ShardRange& r = ranges_[tk.range];
    if (!r.counted) return;
    // Eight independent fp32 lanes over a task of <= 64k elements (vectorisable; the lanes add
    // in double), then the tasks in a fixed order.
    const T* g = hgrads_.data() + r.shard;
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float x[kBlock];
    double s = 0;
    for (std::size_t o = tk.begin; o < tk.end; o += kBlock) {
      const std::size_t len = std::min(kBlock, tk.end - o);
      load_block(x, g + o, len);
      std::size_t i = 0;
      for (; i + 8 <= len; i += 8)
        for (int j = 0; j < 8; ++j) lane[j] += x[i + j] * x[i + j];
      for (; i < len; ++i) s += static_cast<double>(x[i]) * x[i];
    }
    for (float l : lane) s += l;
    part[k] = s;
  });
  double s = 0;
  for (double x : part) s += x;  // task order: the same on every step and thread count
  Kokkos::deep_copy(exec_, sumsq_, static_cast<float>(s));
  offload_s_.down = t.seconds();
  return sumsq_;
}

template <class T>
bool ShardedAdamWT<T>::apply(View1<T> params, Index params_where, View1<const T> grads,
                             Index grads_where, std::int64_t step, float loss_scale,
                             bool check_finite) {
  if (check_finite) {
    float sumsq = 0;
    Kokkos::deep_copy(exec_, sumsq, sumsq_);
    exec_.fence();
    if (!std::isfinite(sumsq)) {
      Kokkos::deep_copy(exec_, norm_, sumsq);
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
  if (placement_ == StatePlacement::host) {
    apply_host(params, params_where, h);
    return true;
  }
  if (one_launch(params_where, grads_where)) {
    // Parameters, gradients and state share the shard's index: one launch over the shard, each
    // element with its range's decay (the alignment gaps hold zeros, which stay zero).
    if constexpr (std::is_same_v<T, float>) {
      kernels::adamw_update_ranges<float>(exec_, params, grads, m_, v_, range_end_, h,
                                          range_begin_, range_decay_, scale_, View1<float>());
    } else {
      kernels::adamw_update_ranges<T>(exec_, master_, grads, m_, v_, range_end_, h, range_begin_,
                                      range_decay_, scale_, params);
    }
    return true;
  }
  for (const ShardRange& r : ranges_) {
    if (r.length == 0) continue;
    const float decay = r.decay ? 1.0f : 0.0f;
    auto g = slice(grads, at(r, grads_where), r.length);
    auto m = slice(m_, r.shard, r.length), v = slice(v_, r.shard, r.length);
    auto p = slice(params, at(r, params_where), r.length);
    if constexpr (std::is_same_v<T, float>) {
      kernels::adamw_update<float>(exec_, p, g, m, v, r.length, h, decay, scale_);
    } else {
      kernels::adamw_update<T>(exec_, slice(master_, r.shard, r.length), g, m, v, r.length, h,
                               decay, scale_, p);
    }
  }
  return true;
}

template <class T>
void ShardedAdamWT<T>::apply_host(View1<T> params, Index params_where,
                                  const kernels::AdamWHyper& h) {
  float scale = 1;
  Kokkos::deep_copy(exec_, scale, scale_);
  exec_.fence();
  Timer t;
  const auto tasks = tasks_of(ranges_, kHostGrain);
  run_threads(host_threads_, tasks.size(), [&](int, std::size_t k) {
    const Task& tk = tasks[k];
    const ShardRange& r = ranges_[tk.range];
    const std::size_t o = r.shard + tk.begin;
    T* copy = nullptr;
    if constexpr (!std::is_same_v<T, float>) copy = hcopy_.data() + o;
    adamw_host<T>(hmaster_.data() + o, hgrads_.data() + o, hm_.data() + o, hv_.data() + o,
                  tk.end - tk.begin, h, r.decay ? 1.0f : 0.0f, scale, copy);
  });
  offload_s_.update = t.seconds();
  t.reset();
  // Parameters up, piece by piece (asynchronous on the instance; the next use orders itself
  // after it).
  for (const auto& p : pieces_) {
    if (!p.length) continue;
    auto dst = slice(params, at(p, params_where), p.length);
    if constexpr (std::is_same_v<T, float>) {
      Kokkos::deep_copy(exec_, dst, slice(hmaster_, p.shard, p.length));
    } else {
      Kokkos::deep_copy(exec_, dst, slice(hcopy_, p.shard, p.length));
    }
  }
  offload_s_.up = t.seconds();
}

template <class T>
void ShardedAdamWT<T>::get_state(StateKind which, HostView1<float> out) const {
  MESHTRAIN_CHECK(out.extent(0) == shard_size_, "ShardedAdamW::get_state: ", out.extent(0),
                  " elements for a shard of ", shard_size_);
  get_state(which, 0, out);
}

template <class T>
void ShardedAdamWT<T>::get_state(StateKind which, std::size_t offset, HostView1<float> out) const {
  MESHTRAIN_CHECK(which != StateKind::master || has_master_,
                  "ShardedAdamW: no fp32 master copy (fp32 device parameters are the master)");
  const std::size_t n = out.extent(0);
  MESHTRAIN_CHECK(offset + n <= shard_size_, "ShardedAdamW::get_state: elements [", offset, ", ",
                  offset + n, ") of a shard of ", shard_size_);
  exec_.fence();
  if (placement_ == StatePlacement::device) {
    const View1<float>& src = which == StateKind::master ? master_
                              : which == StateKind::exp_avg ? m_ : v_;
    Kokkos::deep_copy(out, slice(src, offset, n));
  } else {
    const HostView1<float>& src = which == StateKind::master ? hmaster_
                                  : which == StateKind::exp_avg ? hm_ : hv_;
    Kokkos::deep_copy(out, slice(src, offset, n));
  }
}

template <class T>
void ShardedAdamWT<T>::set_state(StateKind which, HostView1<const float> in) {
  MESHTRAIN_CHECK(which != StateKind::master || has_master_,
                  "ShardedAdamW: no fp32 master copy (fp32 device parameters are the master)");
  MESHTRAIN_CHECK(in.extent(0) == shard_size_, "ShardedAdamW::set_state: ", in.extent(0),
                  " elements for a shard of ", shard_size_);
  exec_.fence();
  if (placement_ == StatePlacement::device) {
    View1<float> dst = which == StateKind::master ? master_ : which == StateKind::exp_avg ? m_ : v_;
    Kokkos::deep_copy(dst, in);
  } else {
    HostView1<float> dst = which == StateKind::master ? hmaster_
                           : which == StateKind::exp_avg ? hm_ : hv_;
    Kokkos::deep_copy(dst, in);
  }
}

template <class T>
typename ShardedAdamWT<T>::Bytes ShardedAdamWT<T>::bytes() const {
  Bytes b;
  b.device_state = (master_.span() + m_.span() + v_.span()) * sizeof(float);
  b.host_state = (hmaster_.span() + hm_.span() + hv_.span()) * sizeof(float);
  b.host_staging = (hgrads_.span() + hcopy_.span()) * sizeof(T);
  return b;
}

template class ShardedAdamWT<float>;
#if MESHTRAIN_HAVE_BF16
template class ShardedAdamWT<bf16>;
template class ShardedAdamWT<fp16>;
#endif

}  // namespace meshtrain::optim
