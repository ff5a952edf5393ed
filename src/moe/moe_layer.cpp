// The expert-parallel MoE layer (moe_layer.hpp). Rows travel in three orders:
//   local:        this rank's dispatch order, by global expert (so the rows for ep rank q,
//                 which holds experts q E_l .. (q+1) E_l - 1, are one contiguous block);
//   source-major: as received, by source rank, then by local expert within each source;
//   expert-major: by local expert, then by source (each expert's rows contiguous for its GEMM).
// A chunk is the rows of one (source s, local expert j) pair; regroup() moves whole chunks
// between the last two orders, one team per chunk.
#include "meshtrain/core/scratch_pool.hpp"
#include "meshtrain/moe/moe_layer.hpp"

#include "common.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/kernels/gelu.hpp"
#include "meshtrain/kernels/swiglu.hpp"
#include "meshtrain/moe/grouped_gemm.hpp"

namespace meshtrain::moe {

namespace {

using detail::Index;
using detail::Member;
using detail::Team;

// Per-expert row counts [E] -> [ep, E_l] rows that rank s sends for each of my local experts.
// The counts go first, so that the token exchange can size its buffers.
std::vector<std::int64_t> exchange_chunk_counts(const ExecSpace& exec, comm::Communicator& ep,
                                                const std::vector<std::int64_t>& counts) {
  if (ep.size() == 1) return counts;  // mine are all there is
  const std::size_t E = counts.size();
  HostView1<std::int64_t> hs("meshtrain::moe::counts_send", E), hr("meshtrain::moe::counts_recv", E);
  for (std::size_t e = 0; e < E; ++e) hs(e) = counts[e];
  if (ep.needs_host_memory()) {
    ep.all_to_all(hs, hr);
  } else {
    auto ds = pooled<std::int64_t>("moe::counts_send", E),
         dr = pooled<std::int64_t>("moe::counts_recv", E);
    Kokkos::deep_copy(exec, ds, hs);
    ep.all_to_all(ds, dr);
    Kokkos::deep_copy(exec, hr, dr);
    exec.fence();
  }
  return std::vector<std::int64_t>(hr.data(), hr.data() + E);
}

// dst rows of chunk c = src rows of chunk c, chunks starting at from(c) and to(c). First the
// source row of every destination row (a scan over the ep x E_local chunks per row), then one
// flat copy over all elements: a team per chunk (the first form) gave a GPU only ep x E_local
// blocks to copy every row with, 80 % of a bf16 MoE step on an H200 (perf/archive/journal.md).
template <class T>
void regroup(const ExecSpace& exec, View1<const T> src, View1<T> dst, View1<std::int64_t> from,
             View1<std::int64_t> to, View1<std::int64_t> count, int H) {
  const Index C = static_cast<Index>(count.extent(0));
  const Index R = static_cast<Index>(dst.extent(0)) / H;
  if (R == 0) return;
  View1<std::int64_t> src_row = pooled<std::int64_t>("moe::regroup_src_row", std::size_t(R));
  Kokkos::parallel_for(
      "meshtrain::moe::regroup_rows", detail::Range(exec, 0, R), KOKKOS_LAMBDA(Index b) {
        for (Index c = 0; c < C; ++c)
          if (b >= to(c) && b < to(c) + count(c)) {
            src_row(b) = from(c) + (b - to(c));
            return;
          }
        src_row(b) = -1;  // not in any chunk: left as it is
      });
  Kokkos::parallel_for(
      "meshtrain::moe::regroup", detail::Range(exec, 0, R * H), KOKKOS_LAMBDA(Index i) {
        const Index b = i / H, r = src_row(b);
        if (r >= 0) dst(i) = src(r * H + (i - b * H));
      });
}

// Host time of the exchanges (exact for MPI, whose calls return when done; launch time for
// NCCL), added to MoeLayerState::a2a_seconds.
struct A2aTimer {
  explicit A2aTimer(double& acc) : acc_(acc) {}
  ~A2aTimer() { acc_ += t_.seconds(); }
  double& acc_;
  Timer t_;
};

std::vector<std::size_t> scaled(const std::vector<std::size_t>& rows, int H) {
  std::vector<std::size_t> v(rows);
  for (auto& x : v) x *= static_cast<std::size_t>(H);
  return v;
}

void check_ep_memory(const comm::Communicator& ep, const char* fn) {
  MESHTRAIN_CHECK(ep.needs_host_memory() == kDeviceIsHost || ep.size() == 1, fn,
                  ": the ep communicator's backend (", comm::backend_name(ep.backend()),
                  ") cannot take this build's device memory; use comm.backend=nccl on GPUs");
}

}  // namespace

void MoeLayerConfig::validate(int ep) const {
  router.validate();
  MESHTRAIN_CONFIG_CHECK(hidden > 0 && ffn > 0, "moe: model.n_embd=", hidden,
                         " and moe.ffn_hidden_size=", ffn, " must be positive");
  MESHTRAIN_CONFIG_CHECK(ep >= 1 && router.experts % ep == 0, "moe.experts=", router.experts,
                         " is not divisible by mesh.ep=", ep);
}

template <class T>
void moe_experts_forward(const ExecSpace& exec, const MoeLayerConfig& cfg, const MoeParams<T>& p,
                         View1<const int> expert, View1<const weight_t<T>> weight,
                         View1<const T> x, int N, comm::Communicator& ep, MoeLayerState<T>& st,
                         View1<T> y) {
  const char* fn = "moe::moe_experts_forward";
  const int P = ep.size(), E = cfg.router.experts, H = cfg.hidden, I = cfg.ffn;
  cfg.validate(P);
  check_ep_memory(ep, fn);
  const int El = E / P, W = cfg.in_width();
  const std::size_t sin = p.in_stride ? p.in_stride : std::size_t(H) * W;
  const std::size_t sout = p.out_stride ? p.out_stride : std::size_t(I) * H;
  detail::check_extent(p.w_in, std::size_t(El - 1) * sin + std::size_t(H) * W, fn, "w_in");
  detail::check_extent(p.w_out, std::size_t(El - 1) * sout + std::size_t(I) * H, fn, "w_out");
  detail::check_extent(y, std::size_t(N) * H, fn, "y");

  plan_dispatch(exec, expert, N, cfg.router.top_k, E, st.plan);
  const std::int64_t M = st.plan.rows;
  detail::ensure(st.xp, "moe::xp", std::size_t(M) * H);
  dispatch_forward<T>(exec, st.plan, x, st.xp, H);

  // Counts first, then the tokens.
  {
    A2aTimer t(st.a2a_seconds);
    st.chunk_rows = exchange_chunk_counts(exec, ep, st.plan.counts);
  }
  st.send_rows.assign(P, 0);
  st.recv_rows.assign(P, 0);
  for (int q = 0; q < P; ++q)
    for (int j = 0; j < El; ++j) {
      st.send_rows[q] += static_cast<std::size_t>(st.plan.counts[q * El + j]);
      st.recv_rows[q] += static_cast<std::size_t>(st.chunk_rows[q * El + j]);
    }
  // Chunk starts in both orders, and the rows of each local expert.
  const int C = P * El;
  HostView1<std::int64_t> hs("meshtrain::moe::source_major", C), he("meshtrain::moe::expert_major", C),
      hc("meshtrain::moe::chunk_count", C);
  st.expert_offsets.assign(std::size_t(El) + 1, 0);
  std::int64_t at = 0;
  for (int c = 0; c < C; ++c) {
    hs(c) = at;
    at += st.chunk_rows[c];
    hc(c) = st.chunk_rows[c];
  }
  const std::int64_t R = at;
  at = 0;
  for (int j = 0; j < El; ++j) {
    for (int s = 0; s < P; ++s) {
      he(s * El + j) = at;
      at += st.chunk_rows[s * El + j];
    }
    st.expert_offsets[j + 1] = at;
  }
  // One ep rank: the local order is already by expert, and the exchanges would be copies.
  const bool alone = P == 1;
  if (!alone) {
    detail::ensure(st.source_major, "moe::source_major", std::size_t(C));
    detail::ensure(st.expert_major, "moe::expert_major", std::size_t(C));
    detail::ensure(st.chunk_count, "moe::chunk_count", std::size_t(C));
    Kokkos::deep_copy(exec, st.source_major, hs);
    Kokkos::deep_copy(exec, st.expert_major, he);
    Kokkos::deep_copy(exec, st.chunk_count, hc);
  }
  if (alone) {
    st.xr = st.xe = st.xp;
  } else {
    detail::ensure(st.xr, "moe::xr", std::size_t(R) * H);
    detail::ensure(st.xe, "moe::xe", std::size_t(R) * H);
    { A2aTimer t(st.a2a_seconds); ep.all_to_allv(st.xp, scaled(st.send_rows, H), st.xr, scaled(st.recv_rows, H)); }
    regroup<T>(exec, st.xr, st.xe, st.source_major, st.expert_major, st.chunk_count, H);
  }

  // The experts: h = xe @ w_in, act = gelu(h) or swiglu(h), ye = act @ w_out.
  detail::ensure(st.h, "moe::expert_pre_act", std::size_t(R) * W);
  detail::ensure(st.act, "moe::expert_act", std::size_t(R) * I);
  detail::ensure(st.ye, "moe::ye", std::size_t(R) * H);
  grouped_linear_forward<T>(exec, st.expert_offsets, st.xe, p.w_in, st.h, H, W, sin, cfg.fp8);
  if (cfg.activation == ExpertActivation::gelu)
    kernels::gelu_forward<T>(exec, st.act, st.h, std::size_t(R) * I);
  else
    kernels::swiglu_forward<T>(exec, st.act, st.h, static_cast<int>(R), I);
  grouped_linear_forward<T>(exec, st.expert_offsets, st.act, p.w_out, st.ye, I, H, sout,
                            cfg.fp8);

  // Back to the sources, and combined with the router weights.
  if (alone) {
    st.yr = st.yp = st.ye;
  } else {
    detail::ensure(st.yr, "moe::yr", std::size_t(R) * H);
    detail::ensure(st.yp, "moe::yp", std::size_t(M) * H);
    regroup<T>(exec, st.ye, st.yr, st.expert_major, st.source_major, st.chunk_count, H);
    { A2aTimer t(st.a2a_seconds); ep.all_to_allv(st.yr, scaled(st.recv_rows, H), st.yp, scaled(st.send_rows, H)); }
  }
  combine_forward<T>(exec, st.plan, st.yp, weight, y, H);
  if (!alone) exec.fence();  // the host copies of the chunk tables are freed on return
}

template <class T>
void moe_forward(const ExecSpace& exec, const MoeLayerConfig& cfg, const MoeParams<T>& p,
                 View1<const T> x, int N, comm::Communicator& ep,
                 comm::Communicator& router_group, MoeLayerState<T>& st, View1<T> y) {
  cfg.validate(ep.size());
  router_forward<T>(exec, cfg.router, x, p.router, p.bias, N, cfg.hidden, router_group,
                    st.router);
  moe_experts_forward<T>(exec, cfg, p, st.router.expert, st.router.weight, x, N, ep, st, y);
}

template <class T>
void moe_experts_backward(const ExecSpace& exec, const MoeLayerConfig& cfg, const MoeParams<T>& p,
                          MoeLayerState<T>& st, View1<const weight_t<T>> weight,
                          View1<const T> dy, comm::Communicator& ep, View1<T> dx,
                          View1<weight_t<T>> dweight, const MoeGrads<T>& g) {
  const char* fn = "moe::moe_experts_backward";
  const int H = cfg.hidden, I = cfg.ffn, W = cfg.in_width(), N = st.plan.tokens;
  const std::int64_t M = st.plan.rows, R = st.expert_offsets.back();
  const std::size_t sin = p.in_stride ? p.in_stride : std::size_t(H) * W;
  const std::size_t sout = p.out_stride ? p.out_stride : std::size_t(I) * H;
  detail::check_extent(dy, std::size_t(N) * H, fn, "dy");
  detail::check_extent(dx, std::size_t(N) * H, fn, "dx");
  detail::check_extent(dweight, std::size_t(N) * cfg.router.top_k, fn, "dweight");
  // Combine: gradients of the expert outputs (local order) and of the router weights.
  auto dyp = pooled<T>("moe::dyp", std::size_t(M) * H);
  combine_backward<T>(exec, st.plan, dy, st.yp, weight, dyp, dweight, H);

  // To the experts along the forward path.
  // One ep rank: no exchange and no regroup (as in the forward pass).
  const bool alone = ep.size() == 1;
  View1<T> dyr = dyp, dye = dyp;
  if (!alone) {
    dyr = pooled<T>("moe::dyr", std::size_t(R) * H);
    dye = pooled<T>("moe::dye", std::size_t(R) * H);
    { A2aTimer t(st.a2a_seconds); ep.all_to_allv(dyp, scaled(st.send_rows, H), dyr, scaled(st.recv_rows, H)); }
    regroup<T>(exec, dyr, dye, st.source_major, st.expert_major, st.chunk_count, H);
  }

  // The experts, last layer first. dact and dh reuse the forward's buffers' shapes.
  auto dact = pooled<T>("moe::dact", std::size_t(R) * I);
  auto dh = pooled<T>("moe::dh", std::size_t(R) * W);
  grouped_linear_backward<T>(exec, st.expert_offsets, dye, st.act, p.w_out, dact, g.w_out, I, H,
                             sout, cfg.fp8);
  if (cfg.activation == ExpertActivation::gelu)
    kernels::gelu_backward<T>(exec, dh, st.h, dact, std::size_t(R) * I);
  else
    kernels::swiglu_backward<T>(exec, dh, st.h, dact, static_cast<int>(R), I);
  auto dxe = pooled<T>("moe::dxe", std::size_t(R) * H);
  grouped_linear_backward<T>(exec, st.expert_offsets, dh, st.xe, p.w_in, dxe, g.w_in, H, W, sin,
                             cfg.fp8);

  // Back to the tokens' ranks, then to the tokens.
  View1<T> dxp = dxe;
  if (!alone) {
    auto dxr = dyr;  // same shape, no longer needed
    regroup<T>(exec, dxe, dxr, st.expert_major, st.source_major, st.chunk_count, H);
    dxp = dyp;  // same shape, no longer needed
    { A2aTimer t(st.a2a_seconds); ep.all_to_allv(dxr, scaled(st.recv_rows, H), dxp, scaled(st.send_rows, H)); }
  }
  dispatch_backward<T>(exec, st.plan, dxp, dx, H);
  exec.fence();  // the scratch buffers are freed on return
}

template <class T>
void moe_backward(const ExecSpace& exec, const MoeLayerConfig& cfg, const MoeParams<T>& p,
                  MoeLayerState<T>& st, View1<const T> x, View1<const T> dy,
                  comm::Communicator& ep, View1<T> dx, const MoeGrads<T>& g,
                  double loss_scale) {
  auto dweight = pooled<T>("moe::dweight", std::size_t(st.plan.tokens) * cfg.router.top_k);
  moe_experts_backward<T>(exec, cfg, p, st, st.router.weight, dy, ep, dx, dweight, g);
  router_backward<T>(exec, cfg.router, st.router, dweight, x, p.router, dx, g.router, cfg.hidden,
                     loss_scale);
  exec.fence();
}

#define MESHTRAIN_INSTANTIATE_MOE_EXPERTS(T)                                                   \
  template void moe_experts_forward<T>(const ExecSpace&, const MoeLayerConfig&,                \
                                       const MoeParams<T>&, View1<const int>,                  \
                                       View1<const weight_t<T>>, View1<const T>, int,          \
                                       comm::Communicator&, MoeLayerState<T>&, View1<T>);      \
  template void moe_experts_backward<T>(const ExecSpace&, const MoeLayerConfig&,               \
                                        const MoeParams<T>&, MoeLayerState<T>&,                \
                                        View1<const weight_t<T>>, View1<const T>,              \
                                        comm::Communicator&, View1<T>, View1<weight_t<T>>,     \
                                        const MoeGrads<T>&);
#define MESHTRAIN_INSTANTIATE_MOE_LAYER(T)                                                     \
  template void moe_forward<T>(const ExecSpace&, const MoeLayerConfig&, const MoeParams<T>&,   \
                               View1<const T>, int, comm::Communicator&, comm::Communicator&,  \
                               MoeLayerState<T>&, View1<T>);                                   \
  template void moe_backward<T>(const ExecSpace&, const MoeLayerConfig&, const MoeParams<T>&,  \
                                MoeLayerState<T>&, View1<const T>, View1<const T>,             \
                                comm::Communicator&, View1<T>, const MoeGrads<T>&, double);    \
  MESHTRAIN_INSTANTIATE_MOE_EXPERTS(T)
MESHTRAIN_INSTANTIATE_MOE_LAYER(float)
MESHTRAIN_INSTANTIATE_MOE_LAYER(double)
// 16-bit rows: the experts' half only (the router is fp32, router.hpp).
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_MOE_EXPERTS(bf16)
MESHTRAIN_INSTANTIATE_MOE_EXPERTS(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_MOE_LAYER
#undef MESHTRAIN_INSTANTIATE_MOE_EXPERTS

}  // namespace meshtrain::moe
