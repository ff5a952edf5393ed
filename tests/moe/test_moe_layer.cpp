// The expert-parallel MoE layer: (1) on one rank, every gradient (tokens, router, both expert
// weights) against central finite differences in double, GELU and SwiGLU, softmax and sigmoid
// routers, with and without capacity drops; (2) with the experts split over ep = 1, 2 or 4
// ranks and the tokens split unevenly (the last of 4 ranks routes none), outputs and every
// gradient equal the run of all tokens and experts on one rank, including ranks whose experts
// receive no token.
#include <algorithm>

#include "kernels/kernel_test_util.hpp"
#include "moe_test_util.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/comm/self_communicator.hpp"
#include "meshtrain/mesh/mpi_comm.hpp"
#include "meshtrain/moe/moe_layer.hpp"

using namespace meshtrain;
using namespace meshtrain::moe;

namespace {

struct Weights {
  std::vector<double> router, bias, w_in, w_out;  // all E experts
};

Weights make_weights(const MoeLayerConfig& c, std::uint32_t seed) {
  const int E = c.router.experts, H = c.hidden, I = c.ffn, W = c.in_width();
  Weights w;
  w.router = kt::random_vector<double>(std::size_t(H) * E, seed);
  w.w_in = kt::random_vector<double>(std::size_t(E) * H * W, seed + 1);
  w.w_out = kt::random_vector<double>(std::size_t(E) * I * H, seed + 2);
  return w;
}

std::vector<double> part(const std::vector<double>& v, std::size_t first, std::size_t n) {
  return std::vector<double>(v.begin() + first, v.begin() + first + n);
}

struct Result {
  std::vector<double> y, dx, d_router, d_in, d_out;
  double aux = 0, z = 0;
};

// The layer over `x` (N tokens) with experts [e0, e0 + E/ep) of `w` on this rank.
Result run(const MoeLayerConfig& c, const Weights& w, const std::vector<double>& x,
           const std::vector<double>& dy, int N, comm::Communicator& ep) {
  const int E = c.router.experts, H = c.hidden, I = c.ffn, W = c.in_width();
  const int El = E / ep.size(), e0 = ep.rank() * El;
  MoeParams<double> p;
  auto router = kt::to_device(w.router), bias = kt::to_device(w.bias);
  auto w_in = kt::to_device(part(w.w_in, std::size_t(e0) * H * W, std::size_t(El) * H * W));
  auto w_out = kt::to_device(part(w.w_out, std::size_t(e0) * I * H, std::size_t(El) * I * H));
  p.router = router;
  p.bias = bias;
  p.w_in = w_in;
  p.w_out = w_out;
  MoeGrads<double> g{zeros<double>("d_router", w.router.size()),
                     zeros<double>("d_in", w_in.extent(0)), zeros<double>("d_out", w_out.extent(0))};
  MoeLayerState<double> st;
  auto xd = kt::to_device(x);
  auto y = kt::nan_view<double>(x.size()), dx = kt::nan_view<double>(x.size());
  moe_forward<double>(ExecSpace(), c, p, xd, N, ep, ep, st, y);
  moe_backward<double>(ExecSpace(), c, p, st, xd, kt::to_device(dy), ep, dx, g);
  return {kt::to_host(y),       kt::to_host(dx),     kt::to_host(g.router),
          kt::to_host(g.w_in),  kt::to_host(g.w_out), st.router.stats.aux_loss,
          st.router.stats.z_loss};
}

double objective(const MoeLayerConfig& c, const Weights& w, const std::vector<double>& x,
                 const std::vector<double>& r, int N) {
  comm::SelfCommunicator self(comm::default_backend());
  const Result res = run(c, w, x, r, N, self);
  return kt::dot(res.y, r) + res.aux + res.z;
}

MoeLayerConfig config(ExpertActivation act, RouterScore score, int k, double capacity) {
  MoeLayerConfig c;
  c.router.experts = 4;
  c.router.top_k = k;
  c.router.score = score;
  c.router.aux_loss_coeff = 0.2;
  c.router.z_loss_coeff = 0.03;
  c.router.capacity_factor = capacity;
  c.hidden = 3;
  c.ffn = 2;
  c.activation = act;
  return c;
}

}  // namespace

TEST_CASE("MoE layer: every gradient matches finite differences", "[moe][layer]") {
  if (mt_test::world_rank() != 0) return;  // one-rank test; the others wait at the next case
  const int N = 5;
  for (auto act : {ExpertActivation::gelu, ExpertActivation::swiglu})
    for (auto score : {RouterScore::softmax, RouterScore::sigmoid})
      for (double capacity : {0.0, 0.8}) {
        const int k = score == RouterScore::softmax ? 2 : 1;
        const MoeLayerConfig c = config(act, score, k, capacity);
        INFO("swiglu=" << (act == ExpertActivation::swiglu) << " sigmoid="
                       << (score == RouterScore::sigmoid) << " capacity=" << capacity);
        Weights w = make_weights(c, 17);
        if (score == RouterScore::sigmoid) w.bias = {0.1, -0.05, 0.0, 0.02};
        auto x = kt::random_vector<double>(std::size_t(N) * c.hidden, 3);
        const auto r = kt::random_vector<double>(std::size_t(N) * c.hidden, 4);
        comm::SelfCommunicator self(comm::default_backend());
        const Result res = run(c, w, x, r, N, self);
        const double eps = 1e-6, rtol = 1e-6, atol = 1e-8;
        auto f = [&] { return objective(c, w, x, r, N); };
        kt::require_close(res.dx, kt::fd_gradient(x, f, eps), rtol, atol, "dx");
        kt::require_close(res.d_router, kt::fd_gradient(w.router, f, eps), rtol, atol, "d_router");
        kt::require_close(res.d_in, kt::fd_gradient(w.w_in, f, eps), rtol, atol, "d_w_in");
        kt::require_close(res.d_out, kt::fd_gradient(w.w_out, f, eps), rtol, atol, "d_w_out");
      }
}

TEST_CASE("MoE layer: ep = 2 and 4 equal ep = 1 on the same tokens", "[moe][layer][mpi]") {
  const int P = mt_test::world_size(), rank = mt_test::world_rank();
  auto wc = mesh::MpiComm::duplicate(mt_test::world());
  auto ep = comm::make_communicator(comm::default_backend(), wc.get());
  for (auto act : {ExpertActivation::gelu, ExpertActivation::swiglu})
    for (bool idle_last : {false, true}) {
      // idle_last: the sigmoid router's bias keeps every token away from the last rank's
      // experts (the bias only chooses), so that rank computes nothing but still exchanges.
      MoeLayerConfig c = config(act, idle_last ? RouterScore::sigmoid : RouterScore::softmax, 2,
                                0.0);
      c.router.experts = 8;
      c.hidden = 4;
      c.ffn = 3;
      const int E = 8, El = E / P, H = c.hidden, I = c.ffn, W = c.in_width();
      INFO("ep=" << P << " swiglu=" << (act == ExpertActivation::swiglu)
                 << " idle last rank's experts=" << idle_last);
      Weights w = make_weights(c, 29);
      if (idle_last) {
        w.bias.assign(E, 0.0);
        for (int e = E - El; e < E; ++e) w.bias[e] = -10.0;
      }
      const int Ng = 11;
      const auto x = kt::random_vector<double>(std::size_t(Ng) * H, 5);
      const auto dy = kt::random_vector<double>(std::size_t(Ng) * H, 6);
      // Uneven token slices; with 4 ranks the last routes none.
      std::vector<int> first(P + 1, Ng);
      first[0] = 0;
      for (int q = 1; q < P; ++q) first[q] = std::min(Ng, q * (Ng / P + 2));
      const int n = first[rank + 1] - first[rank];

      comm::SelfCommunicator self(comm::default_backend());
      const Result one = run(c, w, x, dy, Ng, self);
      const Result mine = run(c, w, part(x, first[rank] * H, n * H), part(dy, first[rank] * H, n * H),
                              n, *ep);
      if (idle_last && P > 1) {  // the bias did keep the last rank's experts idle
        bool idle = true;
        for (std::size_t i = 0; i < std::size_t(El) * I * H; ++i)
          idle = idle && one.d_out[(E - El) * I * H + i] == 0.0;
        REQUIRE(idle);
      }
      auto close = [](double a, double b) { return std::fabs(a - b) <= 1e-12 + 1e-12 * std::fabs(b); };
      bool ok = close(mine.aux, one.aux) && close(mine.z, one.z);
      for (int i = 0; i < n * H; ++i)
        ok = ok && close(mine.y[i], one.y[first[rank] * H + i]) &&
             close(mine.dx[i], one.dx[first[rank] * H + i]);
      for (std::size_t i = 0; i < mine.d_in.size(); ++i)
        ok = ok && close(mine.d_in[i], one.d_in[std::size_t(rank) * El * H * W + i]);
      for (std::size_t i = 0; i < mine.d_out.size(); ++i)
        ok = ok && close(mine.d_out[i], one.d_out[std::size_t(rank) * El * I * H + i]);
      // The router is replicated: its gradients over the ranks' tokens add up to ep = 1's.
      HostView1<double> sum("sum", mine.d_router.size());
      for (std::size_t i = 0; i < sum.extent(0); ++i) sum(i) = mine.d_router[i];
      mt_test::all_reduce_host(*ep, sum);
      for (std::size_t i = 0; i < sum.extent(0); ++i) ok = ok && close(sum(i), one.d_router[i]);
      REQUIRE(mt_test::all_ranks(ok));
    }
}

TEST_CASE("MoE layer: experts not divisible by ep is a configuration error", "[moe][layer]") {
  MoeLayerConfig c = config(ExpertActivation::gelu, RouterScore::softmax, 2, 0.0);
  REQUIRE_THROWS_WITH(c.validate(3), mt_test::contains("moe.experts=4 is not divisible by mesh.ep=3"));
  REQUIRE_NOTHROW(c.validate(2));
}
