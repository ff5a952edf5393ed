// Router forward: logits GEMM, one thread per token for scores, top-k and weights, one team per
// expert for the group sums, then the capacity drop. See router.hpp for the formulas.
#include "meshtrain/core/scratch_pool.hpp"
#include "meshtrain/moe/router.hpp"

#include <cmath>

#include "common.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"

namespace meshtrain::moe {

RouterScore parse_router_score(const std::string& s) {
  if (s == "softmax") return RouterScore::softmax;
  if (s == "sigmoid") return RouterScore::sigmoid;
  throw ConfigError(cat("moe.router_score='", s, "' is not one of softmax, sigmoid"));
}

void RouterConfig::validate() const {
  MESHTRAIN_CONFIG_CHECK(experts >= 1, "moe.experts=", experts, " must be at least 1");
  MESHTRAIN_CONFIG_CHECK(top_k >= 1 && top_k <= 8, "moe.top_k=", top_k, " must be in 1..8");
  MESHTRAIN_CONFIG_CHECK(top_k <= experts, "moe.top_k=", top_k, " exceeds moe.experts=", experts);
  MESHTRAIN_CONFIG_CHECK(aux_loss_coeff >= 0, "moe.aux_loss_coeff=", aux_loss_coeff,
                         " must not be negative");
  MESHTRAIN_CONFIG_CHECK(z_loss_coeff >= 0, "moe.z_loss_coeff=", z_loss_coeff,
                         " must not be negative");
  MESHTRAIN_CONFIG_CHECK(capacity_factor >= 0, "moe.capacity_factor=", capacity_factor,
                         " must be positive (or 0 for dropless routing)");
}

namespace detail {

void all_reduce_host_doubles(const ExecSpace& exec, comm::Communicator& group,
                             HostView1<double> h) {
  if (group.size() == 1) return;
  if (group.needs_host_memory()) {
    group.all_reduce(h);
    return;
  }
  auto d = pooled<double>("moe::group_sums", h.extent(0));
  Kokkos::deep_copy(exec, d, h);
  group.all_reduce(d);
  Kokkos::deep_copy(exec, h, d);
  exec.fence();
}

}  // namespace detail

namespace {

using detail::Index;
using detail::Member;
using detail::Range;
using detail::Team;

// Per token: scores, logsumexp (z-loss), top-k of score + bias, chosen scores and weights.
template <class T>
void route_tokens(const ExecSpace& exec, const RouterConfig& cfg, View1<const T> bias,
                  RouterState<T>& st, View1<T> lse) {
  const int E = cfg.experts, k = cfg.top_k;
  const bool sigmoid = cfg.score == RouterScore::sigmoid;
  const bool has_bias = bias.extent(0) > 0;
  auto logits = st.logits;
  auto scores = st.scores;
  auto expert = st.choice;
  auto chosen = st.chosen_score;
  auto weight = st.weight;
  Kokkos::parallel_for(
      "meshtrain::moe::router_route", Range(exec, 0, st.tokens), KOKKOS_LAMBDA(Index t) {
        const T* l = logits.data() + t * E;
        T* s = scores.data() + t * E;
        T m = l[0];
        for (int e = 1; e < E; ++e) m = l[e] > m ? l[e] : m;
        T sum = 0;
        for (int e = 0; e < E; ++e) sum += kc::exp(l[e] - m);
        lse(t) = m + kc::log(sum);
        for (int e = 0; e < E; ++e)
          s[e] = sigmoid ? T(1) / (T(1) + kc::exp(-l[e])) : kc::exp(l[e] - m) / sum;
        // Selection by repeated argmax over the experts not chosen yet (k <= 8); the strict
        // comparison keeps the lower index on ties.
        T total = 0;
        for (int j = 0; j < k; ++j) {
          int best = -1;
          T best_v = 0;
          for (int e = 0; e < E; ++e) {
            bool taken = false;
            for (int i = 0; i < j; ++i) taken = taken || expert(t * k + i) == e;
            if (taken) continue;
            const T v = s[e] + (has_bias ? bias(e) : T(0));
            if (best < 0 || v > best_v) {
              best = e;
              best_v = v;
            }
          }
          expert(t * k + j) = best;
          chosen(t * k + j) = s[best];
          total += s[best];
        }
        for (int j = 0; j < k; ++j)
          weight(t * k + j) = k > 1 ? chosen(t * k + j) / total : chosen(t * k + j);
      });
}

// Group sums, one team per expert and one for the z-loss: sums = [count_e (E) | sum_t P_te (E)
// | sum_t lse_t^2 | N | dropped], the last two filled on the host.
template <class T>
void local_sums(const ExecSpace& exec, const RouterConfig& cfg, const RouterState<T>& st,
                View1<const T> lse, View1<double> sums) {
  const int E = cfg.experts, k = cfg.top_k, N = st.tokens;
  const bool sigmoid = cfg.score == RouterScore::sigmoid;
  auto scores = st.scores;
  auto expert = st.choice;  // before capacity drops
  Kokkos::parallel_for(
      "meshtrain::moe::router_sums", Team(exec, E + 1, Kokkos::AUTO),
      KOKKOS_LAMBDA(const Member& team) {
        const int e = team.league_rank();
        if (e == E) {
          double z = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, N),
              [&](int t, double& acc) { acc += double(lse(t)) * double(lse(t)); }, z);
          Kokkos::single(Kokkos::PerTeam(team), [&] { sums(2 * E) = z; });
          return;
        }
        double count = 0, p = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, N),
            [&](int t, double& acc) {
              for (int j = 0; j < k; ++j) acc += expert(t * k + j) == e ? 1.0 : 0.0;
            },
            count);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, N),
            [&](int t, double& acc) {
              const T* s = scores.data() + Index(t) * E;
              if (!sigmoid) {
                acc += double(s[e]);
                return;
              }
              double tot = 0;
              for (int i = 0; i < E; ++i) tot += double(s[i]);
              acc += double(s[e]) / tot;
            },
            p);
        Kokkos::single(Kokkos::PerTeam(team), [&] {
          sums(e) = count;
          sums(E + e) = p;
        });
      });
}

// Capacity: choice a = (t, j) of expert e is kept iff fewer than C choices of e outrank it
// (higher score, or equal score and an earlier index). O((N k)^2) comparisons: a sort by
// (expert, -score) is phase 2's job (docs/moe.md).
template <class T>
Index drop_over_capacity(const ExecSpace& exec, const RouterConfig& cfg, RouterState<T>& st) {
  const int k = cfg.top_k;
  const Index A = Index(st.tokens) * k;
  const Index C = static_cast<Index>(
      std::ceil(cfg.capacity_factor * double(st.tokens) * k / cfg.experts));
  auto expert = st.expert;
  auto chosen = st.chosen_score;
  auto weight = st.weight;
  View1<int> keep = pooled<int>("moe::router_keep", A);
  Kokkos::parallel_for(
      "meshtrain::moe::router_capacity", Range(exec, 0, A), KOKKOS_LAMBDA(Index a) {
        const int e = expert(a);
        const T v = chosen(a);
        Index ahead = 0;
        for (Index b = 0; b < A; ++b)
          if (expert(b) == e && (chosen(b) > v || (chosen(b) == v && b < a))) ++ahead;
        keep(a) = ahead < C ? 1 : 0;
      });
  Index dropped = 0;
  Kokkos::parallel_reduce(
      "meshtrain::moe::router_capacity_apply", Range(exec, 0, A),
      KOKKOS_LAMBDA(Index a, Index & acc) {
        if (keep(a)) return;
        expert(a) = -1;
        weight(a) = T(0);
        ++acc;
      },
      dropped);
  return dropped;
}

}  // namespace

template <class T>
void router_forward(const ExecSpace& exec, const RouterConfig& cfg, View1<const T> x,
                    View1<const T> w_router, View1<const T> expert_bias, int N, int H,
                    comm::Communicator& group, RouterState<T>& st) {
  cfg.validate();
  const int E = cfg.experts, k = cfg.top_k;
  MESHTRAIN_CHECK(N >= 0 && H > 0, "moe::router_forward: bad shape N=", N, ", H=", H);
  detail::check_extent(x, std::size_t(N) * H, "moe::router_forward", "x");
  detail::check_extent(w_router, std::size_t(H) * E, "moe::router_forward", "w_router");
  MESHTRAIN_CHECK(expert_bias.extent(0) == 0 || cfg.score == RouterScore::sigmoid,
                  "moe::router_forward: an expert bias is only used with moe.router_score=sigmoid");
  if (expert_bias.extent(0) > 0)
    detail::check_extent(expert_bias, std::size_t(E), "moe::router_forward", "expert_bias");
  st.tokens = N;
  detail::ensure(st.logits, "moe::router_logits", std::size_t(N) * E);
  detail::ensure(st.scores, "moe::router_scores", std::size_t(N) * E);
  detail::ensure(st.choice, "moe::router_choice", std::size_t(N) * k);
  detail::ensure(st.expert, "moe::router_expert", std::size_t(N) * k);
  detail::ensure(st.chosen_score, "moe::router_chosen_score", std::size_t(N) * k);
  detail::ensure(st.weight, "moe::router_weight", std::size_t(N) * k);
  detail::ensure(st.global_load, "moe::router_global_load", std::size_t(E));
  if (N > 0)
    kernels::gemm<T>(exec, kernels::Trans::N, kernels::Trans::N, N, E, H, 1.0f, x.data(), H,
                     w_router.data(), E, 0.0f, st.logits.data(), E);
  View1<T> lse = pooled<T>("moe::router_lse", std::size_t(N));
  route_tokens<T>(exec, cfg, expert_bias, st, lse);

  View1<double> sums = pooled<double>("moe::router_sums", 2 * std::size_t(E) + 3);
  local_sums<T>(exec, cfg, st, lse, sums);
  Kokkos::deep_copy(exec, st.expert, st.choice);
  const double dropped = cfg.capacity_factor > 0 ? double(drop_over_capacity<T>(exec, cfg, st)) : 0;
  auto h = Kokkos::create_mirror_view(sums);
  Kokkos::deep_copy(exec, h, sums);
  exec.fence();
  h(2 * E + 1) = N;
  h(2 * E + 2) = dropped;
  RouterStats& s = st.stats;
  s.local_tokens = N;
  s.local_dropped = dropped;
  s.local_load.assign(h.data(), h.data() + E);
  detail::all_reduce_host_doubles(exec, group, h);

  s.tokens = h(2 * E + 1);
  s.dropped = h(2 * E + 2);
  s.load.assign(h.data(), h.data() + E);
  double aux = 0;
  for (int e = 0; e < E; ++e) aux += h(e) * h(E + e);
  const double T2k = s.tokens * s.tokens * k;
  s.aux_loss = s.tokens > 0 ? cfg.aux_loss_coeff * E / T2k * aux : 0.0;
  s.z_loss = s.tokens > 0 ? cfg.z_loss_coeff / s.tokens * h(2 * E) : 0.0;
  Kokkos::deep_copy(exec, st.global_load, Kokkos::subview(h, Kokkos::make_pair(0, E)));
  exec.fence();  // `h` is freed on return
}

template <class T>
void update_expert_bias(const ExecSpace& exec, View1<T> bias, const std::vector<double>& load,
                        double rate) {
  const int E = static_cast<int>(load.size());
  detail::check_extent(bias, std::size_t(E), "moe::update_expert_bias", "bias");
  double mean = 0;
  for (double l : load) mean += l;
  mean /= E > 0 ? E : 1;
  auto h = Kokkos::create_mirror_view(bias);
  Kokkos::deep_copy(exec, h, bias);
  exec.fence();
  // sign(mean - load): an overloaded expert becomes less attractive, an idle one more.
  for (int e = 0; e < E; ++e)
    h(e) += static_cast<T>(rate * (load[e] < mean ? 1.0 : load[e] > mean ? -1.0 : 0.0));
  Kokkos::deep_copy(exec, bias, h);
  exec.fence();  // `h` is freed on return
}

#define MESHTRAIN_INSTANTIATE_ROUTER(T)                                                       \
  template void router_forward<T>(const ExecSpace&, const RouterConfig&, View1<const T>,       \
                                  View1<const T>, View1<const T>, int, int,                   \
                                  comm::Communicator&, RouterState<T>&);                       \
  template void update_expert_bias<T>(const ExecSpace&, View1<T>, const std::vector<double>&, \
                                      double);
MESHTRAIN_INSTANTIATE_ROUTER(float)
MESHTRAIN_INSTANTIATE_ROUTER(double)
#undef MESHTRAIN_INSTANTIATE_ROUTER

}  // namespace meshtrain::moe
