// Router backward: one thread per token turns dL/d(weights) and the two losses into dL/dlogits,
// then two GEMMs take it to x and to the router weight.
//
// Combine weights, k > 1: w_j = c_j / S with c_j the chosen score of choice j and S their sum
// (dropped choices included: the capacity zeroes w_j after normalisation, so dw_j = 0 there):
//   dc_j = (dw_j - sum_i dw_i w'_i) / S,   w'_i = c_i / S (the weights before the drop)
// k = 1: w = c, dc = dw.
// Aux loss: dL/dP_te = g_e = aux_loss_coeff * E / (T^2 k) * count_e; softmax mode P = p;
// sigmoid mode P_te = s_te / sum s_t, so dL/ds_te = (g_e - sum_i g_i P_ti) / sum s_t.
// Softmax: dlogit_e = p_e (dp_e - sum_i dp_i p_i). Sigmoid: dlogit_e = ds_e s_e (1 - s_e).
// z-loss: dL_z/dlogit_te = z_loss_coeff * 2 / T * lse_t * softmax(logits_t)_e.
#include <cmath>

#include "common.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/moe/router.hpp"

namespace meshtrain::moe {

namespace {
using detail::Index;
using detail::Range;
}  // namespace

template <class T>
void router_backward(const ExecSpace& exec, const RouterConfig& cfg, RouterState<T>& st,
                     View1<const T> dweight, View1<const T> x, View1<const T> w_router,
                     View1<T> dx, View1<T> dw_router, int H, double loss_scale) {
  const int E = cfg.experts, k = cfg.top_k, N = st.tokens;
  const bool sigmoid = cfg.score == RouterScore::sigmoid;
  const bool has_dw = dweight.extent(0) > 0;
  if (has_dw) detail::check_extent(dweight, std::size_t(N) * k, "moe::router_backward", "dweight");
  detail::check_extent(x, std::size_t(N) * H, "moe::router_backward", "x");
  detail::check_extent(w_router, std::size_t(H) * E, "moe::router_backward", "w_router");
  detail::check_extent(dw_router, std::size_t(H) * E, "moe::router_backward", "dw_router");
  if (dx.extent(0) > 0) detail::check_extent(dx, std::size_t(N) * H, "moe::router_backward", "dx");
  detail::ensure(st.dlogits, "moe::router_dlogits", std::size_t(N) * E);
  if (N == 0) return;
  const double T_ = st.stats.tokens;
  const T aux_c = static_cast<T>(loss_scale * cfg.aux_loss_coeff * E / (T_ * T_ * k));
  const T z_c = static_cast<T>(loss_scale * cfg.z_loss_coeff * 2.0 / T_);
  auto logits = st.logits;
  auto scores = st.scores;
  auto expert = st.expert;
  auto choice = st.choice;
  auto chosen = st.chosen_score;
  auto load = st.global_load;
  auto dlogits = st.dlogits;
  Kokkos::parallel_for(
      "meshtrain::moe::router_backward", Range(exec, 0, N), KOKKOS_LAMBDA(Index t) {
        const T* l = logits.data() + t * E;
        const T* s = scores.data() + t * E;
        T* dl = dlogits.data() + t * E;
        // dL/d(score) of each choice from the combine weights; a dropped choice's weight is a
        // constant 0, so its dweight does not count.
        T dc[8] = {};
        if (has_dw) {
          T S = 0, dot = 0;
          for (int j = 0; j < k; ++j) S += chosen(t * k + j);
          for (int j = 0; j < k; ++j)
            if (expert(t * k + j) >= 0) dot += dweight(t * k + j) * chosen(t * k + j) / S;
          for (int j = 0; j < k; ++j) {
            const T dwj = expert(t * k + j) >= 0 ? dweight(t * k + j) : T(0);
            dc[j] = k > 1 ? (dwj - dot) / S : dwj;
          }
        }
        auto dscore = [&](int e) {
          T d = 0;
          for (int j = 0; j < k; ++j) d += choice(t * k + j) == e ? dc[j] : T(0);
          return d;
        };
        T m = l[0];
        for (int e = 1; e < E; ++e) m = l[e] > m ? l[e] : m;
        T sum = 0;
        for (int e = 0; e < E; ++e) sum += kc::exp(l[e] - m);
        const T lse = m + kc::log(sum);
        if (!sigmoid) {
          T dot = 0;
          for (int e = 0; e < E; ++e) dot += (dscore(e) + aux_c * T(load(e))) * s[e];
          for (int e = 0; e < E; ++e)
            dl[e] = s[e] * (dscore(e) + aux_c * T(load(e)) - dot) + z_c * lse * s[e];
        } else {
          T stot = 0, gdot = 0;
          for (int e = 0; e < E; ++e) stot += s[e];
          for (int e = 0; e < E; ++e) gdot += aux_c * T(load(e)) * s[e] / stot;
          for (int e = 0; e < E; ++e) {
            const T ds = dscore(e) + (aux_c * T(load(e)) - gdot) / stot;
            dl[e] = ds * s[e] * (T(1) - s[e]) + z_c * lse * kc::exp(l[e] - lse);
          }
        }
      });
  using kernels::Trans;
  if (dx.extent(0) > 0)
    kernels::gemm<T>(exec, Trans::N, Trans::T, N, H, E, 1.0f, dlogits.data(), E, w_router.data(),
                     E, 1.0f, dx.data(), H);
  kernels::gemm<T>(exec, Trans::T, Trans::N, H, E, N, 1.0f, x.data(), H, dlogits.data(), E, 1.0f,
                   dw_router.data(), E);
}

#define MESHTRAIN_INSTANTIATE_ROUTER_BACKWARD(T)                                               \
  template void router_backward<T>(const ExecSpace&, const RouterConfig&, RouterState<T>&,     \
                                   View1<const T>, View1<const T>, View1<const T>, View1<T>,   \
                                   View1<T>, int, double);
MESHTRAIN_INSTANTIATE_ROUTER_BACKWARD(float)
MESHTRAIN_INSTANTIATE_ROUTER_BACKWARD(double)
#undef MESHTRAIN_INSTANTIATE_ROUTER_BACKWARD

}  // namespace meshtrain::moe
