// The MoE router against a plain double reference (choices, weights, losses), its gradients
// against central finite differences in double, the capacity's deterministic drops, and the
// losses and gradients of tokens split over 1, 2 or 4 ranks against all tokens on one.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/kernel_test_util.hpp"
#include "moe_test_util.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/comm/self_communicator.hpp"
#include "meshtrain/mesh/mpi_comm.hpp"
#include "meshtrain/moe/router.hpp"

using namespace meshtrain;
using namespace meshtrain::moe;

namespace {

// Everything the router computes, in plain double loops (independent of the kernels).
struct Reference {
  std::vector<int> choice, expert;
  std::vector<double> weight;
  double aux = 0, z = 0;
  std::vector<double> load;
};

Reference reference(const RouterConfig& c, const std::vector<double>& x,
                    const std::vector<double>& w, const std::vector<double>& bias, int N, int H) {
  const int E = c.experts, k = c.top_k;
  Reference r;
  r.load.assign(E, 0.0);
  std::vector<double> P(E, 0.0), chosen(std::size_t(N) * k);
  for (int t = 0; t < N; ++t) {
    std::vector<double> l(E, 0.0), s(E);
    for (int e = 0; e < E; ++e)
      for (int h = 0; h < H; ++h) l[e] += x[t * H + h] * w[h * E + e];
    const double m = *std::max_element(l.begin(), l.end());
    double sum = 0;
    for (double v : l) sum += std::exp(v - m);
    const double lse = m + std::log(sum);
    r.z += lse * lse;
    for (int e = 0; e < E; ++e)
      s[e] = c.score == RouterScore::sigmoid ? 1 / (1 + std::exp(-l[e])) : std::exp(l[e] - lse);
    const double stot = std::accumulate(s.begin(), s.end(), 0.0);
    for (int e = 0; e < E; ++e) P[e] += c.score == RouterScore::sigmoid ? s[e] / stot : s[e];
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return s[a] + (bias.empty() ? 0 : bias[a]) > s[b] + (bias.empty() ? 0 : bias[b]);
    });
    double tot = 0;
    for (int j = 0; j < k; ++j) tot += s[order[j]];
    for (int j = 0; j < k; ++j) {
      r.choice.push_back(order[j]);
      chosen[t * k + j] = s[order[j]];
      r.weight.push_back(k > 1 ? s[order[j]] / tot : s[order[j]]);
      r.load[order[j]] += 1;
    }
  }
  r.expert = r.choice;
  if (c.capacity_factor > 0) {
    const long C = static_cast<long>(std::ceil(c.capacity_factor * N * k / E));
    for (int e = 0; e < E; ++e) {
      std::vector<int> mine;
      for (int a = 0; a < N * k; ++a)
        if (r.choice[a] == e) mine.push_back(a);
      std::stable_sort(mine.begin(), mine.end(), [&](int a, int b) { return chosen[a] > chosen[b]; });
      for (std::size_t i = C; i < mine.size(); ++i) {
        r.expert[mine[i]] = -1;
        r.weight[mine[i]] = 0;
      }
    }
  }
  for (int e = 0; e < E; ++e) r.aux += r.load[e] * P[e];
  r.aux *= c.aux_loss_coeff * E / (double(N) * N * k);
  r.z *= c.z_loss_coeff / N;
  return r;
}

struct Problem {
  RouterConfig cfg;
  int N = 0, H = 0;
  std::vector<double> x, w, bias, r;  // r: the dL/dweight that the objective uses
};

Problem make_problem(RouterConfig cfg, int N, int H, std::uint32_t seed) {
  Problem p;
  p.cfg = cfg;
  p.N = N;
  p.H = H;
  p.x = kt::random_vector<double>(std::size_t(N) * H, seed);
  p.w = kt::random_vector<double>(std::size_t(H) * cfg.experts, seed + 1);
  if (cfg.score == RouterScore::sigmoid)
    p.bias = kt::random_vector<double>(cfg.experts, seed + 2, -0.2, 0.2);
  p.r = kt::random_vector<double>(std::size_t(N) * cfg.top_k, seed + 3);
  return p;
}

// L = sum r * weight + L_aux + L_z, through the library's forward pass.
double objective(const Problem& p, comm::Communicator& group, RouterState<double>& st) {
  router_forward<double>(ExecSpace(), p.cfg, kt::to_device(p.x), kt::to_device(p.w),
                         kt::to_device(p.bias), p.N, p.H, group, st);
  const auto w = kt::to_host(st.weight);
  double l = st.stats.aux_loss + st.stats.z_loss;
  for (std::size_t i = 0; i < w.size(); ++i) l += p.r[i] * w[i];
  return l;
}

void check_against_reference_and_fd(const RouterConfig& cfg, int N, int H, std::uint32_t seed) {
  INFO("E=" << cfg.experts << " k=" << cfg.top_k << " sigmoid="
            << (cfg.score == RouterScore::sigmoid) << " capacity=" << cfg.capacity_factor);
  Problem p = make_problem(cfg, N, H, seed);
  comm::SelfCommunicator self(comm::default_backend());
  RouterState<double> st;
  objective(p, self, st);
  const Reference ref = reference(cfg, p.x, p.w, p.bias, N, H);
  REQUIRE(kt::to_host(st.choice) == ref.choice);
  REQUIRE(kt::to_host(st.expert) == ref.expert);
  kt::require_close(kt::to_host(st.weight), ref.weight, 1e-12, 1e-14, "weight");
  REQUIRE(st.stats.aux_loss == mt_test::Approx(ref.aux).epsilon(1e-12));
  REQUIRE(st.stats.z_loss == mt_test::Approx(ref.z).epsilon(1e-12));
  REQUIRE(st.stats.load == ref.load);

  auto dx = kt::to_device(std::vector<double>(p.x.size(), 0.0));
  auto dw = kt::to_device(std::vector<double>(p.w.size(), 0.0));
  router_backward<double>(ExecSpace(), cfg, st, kt::to_device(p.r), kt::to_device(p.x),
                          kt::to_device(p.w), dx, dw, H);
  RouterState<double> scratch;
  const auto fx = kt::fd_gradient(p.x, [&] { return objective(p, self, scratch); }, 1e-6);
  const auto fw = kt::fd_gradient(p.w, [&] { return objective(p, self, scratch); }, 1e-6);
  kt::require_close(kt::to_host(dx), fx, 1e-6, 1e-8, "dx");
  kt::require_close(kt::to_host(dw), fw, 1e-6, 1e-8, "dw_router");
}

}  // namespace

TEST_CASE("router: choices, weights and losses match a double reference; gradients match "
          "finite differences", "[moe][router]") {
  RouterConfig c;
  c.experts = 6;
  c.aux_loss_coeff = 0.3;
  c.z_loss_coeff = 0.05;
  for (int k : {1, 2, 3}) {
    c.top_k = k;
    c.score = RouterScore::softmax;
    c.capacity_factor = 0;
    check_against_reference_and_fd(c, 9, 5, 11 + k);
    c.score = RouterScore::sigmoid;
    check_against_reference_and_fd(c, 9, 5, 21 + k);
    // Capacity below the load: some choices are dropped (checked against the reference).
    c.capacity_factor = 0.6;
    check_against_reference_and_fd(c, 9, 5, 31 + k);
    c.score = RouterScore::softmax;
    check_against_reference_and_fd(c, 9, 5, 41 + k);
  }
}

TEST_CASE("router: capacity drops the lowest probability, later tokens first on ties",
          "[moe][router]") {
  RouterConfig c;
  c.experts = 4;
  c.top_k = 1;
  c.capacity_factor = 1.0;  // C = ceil(8 * 1 / 4) = 2
  const int N = 8, H = 2;
  // Every token prefers expert 0 (the weight column of expert 0 is large), equal tokens tie.
  std::vector<double> x(N * H, 1.0), w(H * 4, 0.0);
  w[0] = w[4] = 3.0;  // column 0
  x[5 * H] = 2.0;     // token 5: the highest probability for expert 0
  comm::SelfCommunicator self(comm::default_backend());
  RouterState<double> st;
  router_forward<double>(ExecSpace(), c, kt::to_device(x), kt::to_device(w),
                         View1<const double>(), N, H, self, st);
  const auto e = kt::to_host(st.expert);
  REQUIRE(e == std::vector<int>{0, -1, -1, -1, -1, 0, -1, -1});
  REQUIRE(st.stats.dropped == 6);
  REQUIRE(st.stats.load == std::vector<double>{8, 0, 0, 0});  // before the drop
  const auto wt = kt::to_host(st.weight);
  REQUIRE(wt[1] == 0.0);
  REQUIRE(wt[0] > 0.0);
}

TEST_CASE("router: losses and gradients do not depend on how the tokens are split",
          "[moe][router][mpi]") {
  const int world = mt_test::world_size(), rank = mt_test::world_rank();
  auto wcomm = mesh::MpiComm::duplicate(mt_test::world());
  auto group = comm::make_communicator(comm::default_backend(), wcomm.get());
  for (RouterScore score : {RouterScore::softmax, RouterScore::sigmoid}) {
    RouterConfig c;
    c.experts = 5;
    c.top_k = 2;
    c.score = score;
    c.aux_loss_coeff = 0.1;
    c.z_loss_coeff = 0.01;
    const int Ng = 13, H = 4;
    Problem all = make_problem(c, Ng, H, 7);
    // Rank q takes an uneven slice; the last rank of 4 takes none.
    std::vector<int> first(world + 1, Ng);
    first[0] = 0;
    for (int q = 1; q < world; ++q) first[q] = std::min(Ng, q * (Ng / world + 2));
    Problem mine = all;
    mine.N = first[rank + 1] - first[rank];
    mine.x.assign(all.x.begin() + first[rank] * H, all.x.begin() + first[rank + 1] * H);
    mine.r.assign(all.r.begin() + first[rank] * c.top_k, all.r.begin() + first[rank + 1] * c.top_k);

    comm::SelfCommunicator self(comm::default_backend());
    RouterState<double> s1, sn;
    objective(all, self, s1);
    objective(mine, *group, sn);
    const bool same = std::fabs(sn.stats.aux_loss - s1.stats.aux_loss) <= 1e-13 &&
                      std::fabs(sn.stats.z_loss - s1.stats.z_loss) <= 1e-13 &&
                      sn.stats.load == s1.stats.load && sn.stats.tokens == Ng;
    REQUIRE(mt_test::all_ranks(same));

    auto backward = [&](Problem& p, RouterState<double>& st) {
      auto dx = kt::to_device(std::vector<double>(p.x.size(), 0.0));
      auto dw = kt::to_device(std::vector<double>(p.w.size(), 0.0));
      router_backward<double>(ExecSpace(), c, st, kt::to_device(p.r), kt::to_device(p.x),
                              kt::to_device(p.w), dx, dw, H);
      return std::make_pair(kt::to_host(dx), kt::to_host(dw));
    };
    auto [dx1, dw1] = backward(all, s1);
    auto [dxn, dwn] = backward(mine, sn);
    // The router weight is replicated: its gradient is the sum over the ranks' tokens.
    Kokkos::View<double*, Kokkos::HostSpace> sum("sum", dwn.size());
    for (std::size_t i = 0; i < dwn.size(); ++i) sum(i) = dwn[i];
    mt_test::all_reduce_host(*group, sum);
    bool ok = true;
    for (std::size_t i = 0; i < dw1.size(); ++i) ok = ok && std::fabs(sum(i) - dw1[i]) <= 1e-13;
    for (std::size_t i = 0; i < dxn.size(); ++i)
      ok = ok && std::fabs(dxn[i] - dx1[first[rank] * H + i]) <= 1e-13;
    REQUIRE(mt_test::all_ranks(ok));
  }
}

TEST_CASE("router: the aux-loss-free bias moves against the load", "[moe][router]") {
  auto b = kt::to_device(std::vector<float>{0.f, 0.f, 0.5f, 0.f});
  update_expert_bias<float>(ExecSpace(), b, {10, 2, 4, 4}, 0.01);
  kt::require_close(kt::to_host(b), std::vector<double>{-0.01, 0.01, 0.5 + 0.01, 0.01}, 1e-6,
                    1e-7, "bias");
}

TEST_CASE("router: bad configuration names the option", "[moe][router]") {
  RouterConfig c;
  c.experts = 4;
  c.top_k = 5;
  REQUIRE_THROWS_WITH(c.validate(), mt_test::contains("moe.top_k=5 exceeds moe.experts=4"));
  c.top_k = 2;
  c.capacity_factor = -1;
  REQUIRE_THROWS_WITH(c.validate(), mt_test::contains("moe.capacity_factor"));
  REQUIRE_THROWS_AS(parse_router_score("topk"), ConfigError);
}
