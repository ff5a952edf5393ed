// GptT's Mixture-of-Experts MLP (issue 20, docs/moe.md): the MLP of every moe.layer_freq-th
// block is the expert-parallel MoE layer of src/moe/ (router -> dispatch -> all-to-all ->
// grouped expert GEMMs -> all-to-all -> combine), plus an optional shared expert every token
// goes through. Both families: GELU experts (GPT-2) or SwiGLU experts (Llama), no biases.
//
// Tensor parallelism: experts are not split over tp. Every tp rank routes all N rows of the
// micro-batch (a.ln2 is the gathered norm output under sequence parallelism) with the same
// replicated router, experts and shared expert, so their gradients are complete and equal on
// the tp ranks after the block (as for every other parameter) and no tp communication is
// needed; under SP each rank adds its own rows of the output. The ep group pairs tp ranks of
// equal coordinate (mesh/process_mesh.hpp), so each tp rank exchanges with its own peers.
//
// Router losses: per router call (one micro-batch's B T tokens, a fixed group of sequences of
// the global batch whatever the layout, as long as train.micro_batch is the same), entering the
// objective with weight grad_scale * B T = 1 / (micro-batches in the global batch): the mean
// over micro-batches, as Megatron-Core scales them. Their group is this rank alone (it routes
// whole micro-batches), so their values do not depend on dp, ep, tp or pp.
//
// Precision: the router runs in fp32 (or fp64) in every precision. A 16-bit model (bf16, fp16)
// converts ln2's rows and its 16-bit router weight to fp32 for router_forward<float>, combines
// with the fp32 weights (moe::weight_t), and adds the router's fp32 input and weight gradients
// into its 16-bit ones (one rounding each). The expert path (dispatch, all-to-alls, grouped
// GEMMs, activations, combine, shared expert) runs on 16-bit rows with fp32 accumulation, like
// the dense MLP; with fp8.experts in an FP8 block the experts' and shared expert's forward and
// input-gradient GEMMs are FP8 (GptT::expert_fp8, moe/grouped_gemm.hpp's ExpertFp8).
#include <type_traits>

#include "meshtrain/core/scratch_pool.hpp"
#include "meshtrain/comm/self_communicator.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/kernels/gelu.hpp"
#include "meshtrain/kernels/residual.hpp"
#include "meshtrain/kernels/swiglu.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/model/gpt_activations.hpp"
#include "meshtrain/moe/grouped_gemm.hpp"
#include "meshtrain/moe/moe_layer.hpp"
#include "meshtrain/moe/router.hpp"

namespace meshtrain::model {

template <class T>
struct MoeActivations {
  using R = moe::weight_t<T>;      // the router's type: fp32 for every model precision
  moe::MoeLayerState<T> layer;     // dispatch, exchanges and expert activations
  moe::RouterState<R> router;      // moe.router_fp64 = false
  moe::RouterState<double> router64;
  View1<R> weight;                 // fp64 router: its combine weights in fp32
  View1<T> shared_h, shared_act;   // shared expert [N, W_s], [N, I_s]
  int group_ranks = 1;             // ranks the forward's router statistics were summed over
};

template <class T>
std::shared_ptr<MoeActivations<T>> make_moe_activations() {
  return std::make_shared<MoeActivations<T>>();
}

namespace {

namespace k = meshtrain::kernels;

template <class T>
void ensure(View1<T>& v, const char* label, std::size_t n) {
  if (v.extent(0) != n) v = alloc<T>(label, n);
}

// dst (the router's type) = src (the model's), and back, elementwise.
template <class A, class B>
void convert(const ExecSpace& exec, View1<A> dst, View1<const B> src, std::size_t n) {
  Kokkos::parallel_for(
      "meshtrain::moe_convert", Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(n)),
      KOKKOS_LAMBDA(const std::int64_t i) { dst(i) = static_cast<A>(src(i)); });
}
// dst += src, added in fp32 and rounded to A once (a 16-bit gradient gets one rounding).
template <class A, class B>
void add_converted(const ExecSpace& exec, View1<A> dst, View1<const B> src, std::size_t n) {
  Kokkos::parallel_for(
      "meshtrain::moe_add", Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(n)),
      KOKKOS_LAMBDA(const std::int64_t i) {
        dst(i) = static_cast<A>(static_cast<float>(dst(i)) + static_cast<float>(src(i)));
      });
}
// v as the router's type A: v itself when it is of A already (the fp32 model), else its
// conversion into `scratch` (a 16-bit model's rows or router weight).
template <class A, class T>
View1<const A> router_view(const ExecSpace& exec, View1<const T> v, View1<A>& scratch,
                           const char* label) {
  if constexpr (std::is_same_v<A, T>) {
    (void)exec, (void)scratch, (void)label;
    return v;
  } else {
    ensure(scratch, label, v.extent(0));
    convert<A, T>(exec, scratch, v, v.extent(0));
    return scratch;
  }
}

moe::MoeLayerConfig layer_config(const GptConfig& c, const moe::ExpertFp8& fp8) {
  moe::MoeLayerConfig m;
  m.fp8 = fp8;
  m.router.experts = c.moe.experts;
  m.router.top_k = c.moe.top_k;
  m.router.score = moe::parse_router_score(c.moe.router_score);
  m.router.aux_loss_coeff = c.moe.aux_loss_coeff;
  m.router.z_loss_coeff = c.moe.z_loss_coeff;
  m.router.capacity_factor = c.moe.capacity_factor;
  m.hidden = c.n_embd;
  m.ffn = c.expert_width();
  m.activation = c.mlp == Mlp::swiglu ? moe::ExpertActivation::swiglu : moe::ExpertActivation::gelu;
  return m;
}

// The group's losses (identical on its ranks), this rank's counts (summed over ranks later).
void record(MoeLayerStats& s, const moe::RouterStats& r) {
  ++s.calls;
  s.aux += r.aux_loss;
  s.z += r.z_loss;
  s.tokens += r.local_tokens;
  s.dropped += r.local_dropped;
  if (s.load.size() != r.local_load.size()) s.load.assign(r.local_load.size(), 0.0);
  for (std::size_t e = 0; e < r.local_load.size(); ++e) s.load[e] += r.local_load[e];
}

}  // namespace

template <class T>
moe::ExpertFp8 GptT<T>::expert_fp8(int l) {
  return {layout_.fp8.fp8_experts(l, cfg_.n_layer), &expert_fp8_workspace_};
}

template <class T>
void GptT<T>::reset_moe_stats() {
  for (auto& s : moe_stats_) {
    const std::size_t E = s.load.size();
    s = MoeLayerStats{};
    s.load.assign(E, 0.0);
  }
}

template <class T>
void GptT<T>::moe_mlp_forward(int l, BlockActivations<T>& a, View1<const T> res2, View1<T> out) {
  {
    using R = moe::weight_t<T>;  // the router's type (fp32 for a 16-bit model)
    const int N = N_, Nl = Nl_, C = cfg_.n_embd, E = cfg_.moe.experts, K = cfg_.moe.top_k;
    const moe::MoeLayerConfig mc = layer_config(cfg_, expert_fp8(l));
    const MoeTensors<T>& w = moe_params_[static_cast<std::size_t>(l)];
    MoeActivations<T>& m = *a.moe;
    comm::Communicator& ep = layout_.ep ? *layout_.ep : *self_;
    // The router's statistics: over the global batch's micro-batch (every data-parallel rank's
    // micro-batch of this index, moe.aux_loss_scope=global) when training, so the balancing
    // loss is the same whatever dp, ep, tp or pp; over this rank's micro-batch otherwise
    // (local scope; evaluation and generation, which train nothing and may run on one rank).
    const bool global = cfg_.moe.aux_loss_scope == "global" && moe_loss_weight_ != 0.0f &&
                        layout_.batch_group != nullptr;
    comm::Communicator& group = global ? *layout_.batch_group : *self_;
    m.group_ranks = group.size();
    const Timer clock;
    // The router (fp32, or fp64 for layout comparisons without top-k tie flips).
    View1<const int> expert;
    View1<const R> weight;
    const moe::RouterStats* stats = nullptr;
    if (cfg_.moe.router_fp64) {
      ensure(moe_x64_, "moe.x64", std::size_t(N) * C);
      ensure(moe_w64_, "moe.w64", std::size_t(C) * E);
      convert<double, T>(exec_, moe_x64_, a.ln2, std::size_t(N) * C);
      convert<double, T>(exec_, moe_w64_, w.router, std::size_t(C) * E);
      View1<const double> bias64;
      if (cfg_.moe.expert_bias) {
        ensure(moe_bias64_, "moe.bias64", std::size_t(E));
        convert<double, float>(exec_, moe_bias64_, moe_bias_[static_cast<std::size_t>(l)],
                               std::size_t(E));
        bias64 = moe_bias64_;
      }
      moe::router_forward<double>(exec_, mc.router, moe_x64_, moe_w64_, bias64, N, C, group,
                                  m.router64);
      ensure(m.weight, "moe.weight", std::size_t(N) * K);
      convert<R, double>(exec_, m.weight, m.router64.weight, std::size_t(N) * K);
      expert = m.router64.expert;
      weight = m.weight;
      stats = &m.router64.stats;
    } else {
      const View1<const R> x = router_view<R, T>(exec_, a.ln2, moe_x32_, "moe.x32");
      const View1<const R> wr = router_view<R, T>(exec_, w.router, moe_w32_, "moe.w32");
      // The expert bias is fp32 state, R is fp32 in every model this file instantiates.
      moe::router_forward<R>(exec_, mc.router, x, wr,
                             View1<const R>(moe_bias_[static_cast<std::size_t>(l)]), N, C,
                             group, m.router);
      expert = m.router.expert;
      weight = m.router.weight;
      stats = &m.router.stats;
    }
    moe::MoeParams<T> p{w.router, {}, w.w_in, w.w_out, w.in_stride, w.out_stride};
    const double a2a0 = m.layer.a2a_seconds;
    moe::moe_experts_forward<T>(exec_, mc, p, expert, weight, a.ln2, N, ep, m.layer, moe_y_);
    // The shared expert: y += mlp(ln2) over every row (one group of N rows).
    const int S = cfg_.moe.shared_ffn;
    if (S > 0) {
      const int W = mc.activation == moe::ExpertActivation::swiglu ? 2 * S : S;
      const std::vector<std::int64_t> all{0, N};
      ensure(m.shared_h, "moe.shared_h", std::size_t(N) * W);
      ensure(m.shared_act, "moe.shared_act", std::size_t(N) * S);
      moe::grouped_linear_forward<T>(exec_, all, a.ln2, w.shared_in, m.shared_h, C, W, 0, mc.fp8);
      if (mc.activation == moe::ExpertActivation::gelu)
        k::gelu_forward<T>(exec_, m.shared_act, m.shared_h, std::size_t(N) * S);
      else
        k::swiglu_forward<T>(exec_, m.shared_act, m.shared_h, N, S);
      moe::grouped_linear_forward<T>(exec_, all, m.shared_act, w.shared_out, moe_dx_, S, C, 0,
                                      mc.fp8);
      k::accumulate<T>(exec_, moe_y_, moe_dx_, std::size_t(N) * C);
    }
    // This rank's rows (all of them without sequence parallelism) onto the residual.
    k::residual_forward<T>(exec_, out, res2, tp_.split_rows(moe_y_), std::size_t(Nl) * C);
    if (!recomputing_ && moe_loss_weight_ != 0.0f) {
      MoeLayerStats& s = moe_stats_[static_cast<std::size_t>(l)];
      record(s, *stats);
      s.expert_seconds += clock.seconds();
      s.a2a_seconds += m.layer.a2a_seconds - a2a0;
    }
  }
}

template <class T>
void GptT<T>::moe_mlp_backward(int l, BlockActivations<T>& a, View1<const T> dfull, View1<T> dx) {
  {
    using R = moe::weight_t<T>;  // the router's type (fp32 for a 16-bit model)
    const int N = N_, C = cfg_.n_embd, E = cfg_.moe.experts, K = cfg_.moe.top_k;
    const moe::MoeLayerConfig mc = layer_config(cfg_, expert_fp8(l));
    const MoeTensors<T>& w = moe_params_[static_cast<std::size_t>(l)];
    const MoeTensors<T>& g = moe_grads_[static_cast<std::size_t>(l)];
    MoeActivations<T>& m = *a.moe;
    comm::Communicator& ep = layout_.ep ? *layout_.ep : *self_;
    const Timer clock;
    // d(ln2) of every row lands in dln_ (the full-row scratch), then this rank's rows in dx.
    View1<T> dln = dln_;
    const bool fp64 = cfg_.moe.router_fp64;
    moe::MoeParams<T> p{w.router, {}, w.w_in, w.w_out, w.in_stride, w.out_stride};
    moe::MoeGrads<T> gr{g.router, g.w_in, g.w_out};
    View1<R> dweight = pooled<R>("moe.dweight", std::size_t(N) * K);
    const double a2a0 = m.layer.a2a_seconds;
    moe::moe_experts_backward<T>(exec_, mc, p, m.layer, fp64 ? View1<const R>(m.weight)
                                                              : View1<const R>(m.router.weight),
                                 dfull, ep, dln, dweight, gr);
    // dJ / dL_aux: the tokens of the group's micro-batch over those of the global batch (the
    // objective is CE + the mean over the global batch's micro-batches of aux + z). Each rank
    // adds its own tokens' part of the gradient; the data-parallel reduction sums them.
    const double loss_scale = static_cast<double>(moe_loss_weight_) * m.group_ranks;
    if (fp64) {
      ensure(moe_dx64_, "moe.dx64", std::size_t(N) * C);
      ensure(moe_dw64_, "moe.dw64", std::size_t(C) * E);
      Kokkos::deep_copy(exec_, moe_dx64_, 0.0);
      Kokkos::deep_copy(exec_, moe_dw64_, 0.0);
      auto dweight64 = pooled<double>("moe.dweight64", std::size_t(N) * K);
      convert<double, R>(exec_, dweight64, dweight, std::size_t(N) * K);
      // The forward's fp64 copies of x and the router weight: recomputed, the recompute pass
      // just wrote them; otherwise a later block may have: convert again.
      convert<double, T>(exec_, moe_x64_, a.ln2, std::size_t(N) * C);
      convert<double, T>(exec_, moe_w64_, w.router, std::size_t(C) * E);
      moe::router_backward<double>(exec_, mc.router, m.router64, dweight64, moe_x64_, moe_w64_,
                                   moe_dx64_, moe_dw64_, C, loss_scale);
      add_converted<T, double>(exec_, dln, moe_dx64_, std::size_t(N) * C);
      add_converted<T, double>(exec_, g.router, moe_dw64_, std::size_t(C) * E);
    } else if constexpr (std::is_same_v<T, R>) {
      moe::router_backward<T>(exec_, mc.router, m.router, dweight, a.ln2, w.router, dln, g.router,
                              C, loss_scale);
    } else {
      // A 16-bit model's fp32 router: x and the router weight converted again (a later block may
      // have reused the scratch), the gradients in fp32, then added to the 16-bit ones.
      const View1<const R> x = router_view<R, T>(exec_, a.ln2, moe_x32_, "moe.x32");
      const View1<const R> wr = router_view<R, T>(exec_, w.router, moe_w32_, "moe.w32");
      ensure(moe_dx32_, "moe.dx32", std::size_t(N) * C);
      ensure(moe_dw32_, "moe.dw32", std::size_t(C) * E);
      Kokkos::deep_copy(exec_, moe_dx32_, 0.0f);
      Kokkos::deep_copy(exec_, moe_dw32_, 0.0f);
      moe::router_backward<R>(exec_, mc.router, m.router, dweight, x, wr, moe_dx32_, moe_dw32_, C,
                              loss_scale);
      add_converted<T, R>(exec_, dln, moe_dx32_, std::size_t(N) * C);
      add_converted<T, R>(exec_, g.router, moe_dw32_, std::size_t(C) * E);
    }
    const int S = cfg_.moe.shared_ffn;
    if (S > 0) {
      const int W = mc.activation == moe::ExpertActivation::swiglu ? 2 * S : S;
      const std::vector<std::int64_t> all{0, N};
      auto dact = pooled<T>("moe.shared_dact", std::size_t(N) * S);
      auto dh = pooled<T>("moe.shared_dh", std::size_t(N) * W);
      moe::grouped_linear_backward<T>(exec_, all, dfull, m.shared_act, w.shared_out, dact,
                                      g.shared_out, S, C, 0, mc.fp8);
      if (mc.activation == moe::ExpertActivation::gelu)
        k::gelu_backward<T>(exec_, dh, m.shared_h, dact, std::size_t(N) * S);
      else
        k::swiglu_backward<T>(exec_, dh, m.shared_h, dact, N, S);
      moe::grouped_linear_backward<T>(exec_, all, dh, a.ln2, w.shared_in, moe_dx_, g.shared_in,
                                      C, W, 0, mc.fp8);
      k::accumulate<T>(exec_, dln, moe_dx_, std::size_t(N) * C);
    }
    // Sequence parallelism: this rank's rows (otherwise dx is dln).
    if (tp_.sequence_parallel()) Kokkos::deep_copy(exec_, dx, tp_.split_rows(dln));
    exec_.fence();  // the scratch above is freed on return
    MoeLayerStats& s = moe_stats_[static_cast<std::size_t>(l)];
    s.expert_seconds += clock.seconds();
    s.a2a_seconds += m.layer.a2a_seconds - a2a0;
  }
}

template <class T>
void GptT<T>::update_expert_bias(int l, const std::vector<double>& load, double rate) {
  View1<float> bias = moe_bias_[static_cast<std::size_t>(l)];
  MESHTRAIN_CHECK(bias.span() == load.size(), "update_expert_bias: block ", l, " holds ",
                  bias.span(), " expert biases, given the load of ", load.size());
  moe::update_expert_bias<float>(exec_, bias, load, rate);
}

#define MESHTRAIN_INSTANTIATE_MOE_BLOCK(T)                                                       \
  template std::shared_ptr<MoeActivations<T>> make_moe_activations<T>();                         \
  template void GptT<T>::reset_moe_stats();                                                      \
  template void GptT<T>::update_expert_bias(int, const std::vector<double>&, double);            \
  template void GptT<T>::moe_mlp_forward(int, BlockActivations<T>&, View1<const T>, View1<T>);   \
  template void GptT<T>::moe_mlp_backward(int, BlockActivations<T>&, View1<const T>, View1<T>);
MESHTRAIN_INSTANTIATE_MOE_BLOCK(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_MOE_BLOCK(bf16)
MESHTRAIN_INSTANTIATE_MOE_BLOCK(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_MOE_BLOCK

}  // namespace meshtrain::model
