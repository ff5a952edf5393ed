// Dispatch and combine against plain loops: the plan's order and counts (experts with no
// choice, an expert in every token's choices, capacity drops), the round trip with weights
// that restore the input exactly, and both backward passes.
#include "kernels/kernel_test_util.hpp"
#include "meshtrain/moe/permute.hpp"

using namespace meshtrain;
using namespace meshtrain::moe;

namespace {

// Choices of N tokens over E experts, k distinct experts per token; `drop` marks every
// third choice -1; `unused` is never chosen; expert 0 is in every token's choices when `all0`.
std::vector<int> make_choices(int N, int k, int E, int unused, bool all0, bool drop,
                              std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int> c;
  for (int t = 0; t < N; ++t) {
    std::vector<int> pool;
    for (int e = all0 ? 1 : 0; e < E; ++e)
      if (e != unused) pool.push_back(e);
    std::shuffle(pool.begin(), pool.end(), gen);
    if (all0) pool.insert(pool.begin() + (t % k), 0);
    for (int j = 0; j < k; ++j) c.push_back(pool[j]);
  }
  if (drop)
    for (std::size_t a = 0; a < c.size(); a += 3) c[a] = -1;
  return c;
}

void check_case(int N, int k, int E, int H, int unused, bool all0, bool drop) {
  INFO("N=" << N << " k=" << k << " E=" << E << " unused=" << unused << " all0=" << all0
            << " drop=" << drop);
  const auto choice = make_choices(N, k, E, unused, all0, drop, 5 + N + k);
  DispatchPlan plan;
  plan_dispatch(ExecSpace(), kt::to_device(choice), N, k, E, plan);
  // Reference order: by expert, then by choice index.
  std::vector<int> order;
  std::vector<std::int64_t> counts(E, 0);
  for (int e = 0; e < E; ++e)
    for (int a = 0; a < N * k; ++a)
      if (choice[a] == e) {
        order.push_back(a);
        ++counts[e];
      }
  REQUIRE(plan.counts == counts);
  REQUIRE(plan.rows == static_cast<std::int64_t>(order.size()));
  REQUIRE(kt::to_host(plan.choice_of_row) == order);
  if (unused >= 0) REQUIRE(plan.counts[unused] == 0);
  if (all0) REQUIRE(plan.counts[0] == N);
  const auto pos = kt::to_host(plan.position);
  for (int a = 0; a < N * k; ++a)
    REQUIRE(pos[a] == (choice[a] < 0 ? -1
                                     : int(std::find(order.begin(), order.end(), a) - order.begin())));

  // Round trip: identity experts and weights that add up to 1 over a token's m kept choices
  // (1/2, 1/4, ..., 2^-(m-1), 2^-(m-1)) on integer-valued x: every product and partial sum is
  // exact, so y == x exactly (0 for a token with no kept choice).
  std::vector<double> x = kt::random_vector<double>(std::size_t(N) * H, 3, -8, 8);
  for (double& v : x) v = std::round(v);
  std::vector<double> w(choice.size(), 7.0);  // dropped choices' weights must not matter
  for (int t = 0; t < N; ++t) {
    int m = 0;
    for (int j = 0; j < k; ++j) m += choice[t * k + j] >= 0;
    int i = 0;
    for (int j = 0; j < k; ++j)
      if (choice[t * k + j] >= 0) {
        w[t * k + j] = std::ldexp(1.0, -(i < m - 1 ? i + 1 : m - 1));
        ++i;
      }
  }
  auto xp = kt::nan_view<double>(std::size_t(plan.rows) * H);
  dispatch_forward<double>(ExecSpace(), plan, kt::to_device(x), xp, H);
  auto y = kt::nan_view<double>(std::size_t(N) * H);
  combine_forward<double>(ExecSpace(), plan, xp, kt::to_device(w), y, H);
  const auto hy = kt::to_host(y);
  for (int t = 0; t < N; ++t) {
    bool any = false;
    for (int j = 0; j < k; ++j) any = any || choice[t * k + j] >= 0;
    for (int h = 0; h < H; ++h) REQUIRE(hy[t * H + h] == (any ? x[t * H + h] : 0.0));
  }

  // Backward passes against loops.
  const auto dxp = kt::random_vector<double>(std::size_t(plan.rows) * H, 4);
  auto dx = kt::nan_view<double>(std::size_t(N) * H);
  dispatch_backward<double>(ExecSpace(), plan, kt::to_device(dxp), dx, H);
  std::vector<double> want_dx(std::size_t(N) * H, 0.0);
  for (std::size_t p = 0; p < order.size(); ++p)
    for (int h = 0; h < H; ++h) want_dx[(order[p] / k) * H + h] += dxp[p * H + h];
  kt::require_close(kt::to_host(dx), want_dx, 1e-15, 1e-15, "dispatch dx");

  const auto ye = kt::random_vector<double>(std::size_t(plan.rows) * H, 6);
  const auto dy = kt::random_vector<double>(std::size_t(N) * H, 7);
  auto dye = kt::nan_view<double>(std::size_t(plan.rows) * H);
  auto dw = kt::nan_view<double>(choice.size());
  combine_backward<double>(ExecSpace(), plan, kt::to_device(dy), kt::to_device(ye),
                           kt::to_device(w), dye, dw, H);
  std::vector<double> want_dye(std::size_t(plan.rows) * H), want_dw(choice.size(), 0.0);
  for (std::size_t p = 0; p < order.size(); ++p) {
    const int a = order[p], t = a / k;
    for (int h = 0; h < H; ++h) {
      want_dye[p * H + h] = w[a] * dy[t * H + h];
      want_dw[a] += dy[t * H + h] * ye[p * H + h];
    }
  }
  kt::require_close(kt::to_host(dye), want_dye, 1e-15, 1e-15, "combine dye");
  kt::require_close(kt::to_host(dw), want_dw, 1e-13, 1e-14, "combine dweight");
}

}  // namespace

TEST_CASE("dispatch and combine: order, counts, round trip and gradients", "[moe][permute]") {
  for (int k : {1, 2, 4}) {
    check_case(13, k, 6, 5, /*unused=*/3, false, false);
    check_case(13, k, 6, 5, /*unused=*/5, /*all0=*/true, false);
    check_case(13, k, 6, 5, -1, false, /*drop=*/true);
  }
  check_case(0, 2, 4, 3, -1, false, false);  // no tokens at all
  check_case(1, 1, 1, 2, -1, false, false);  // one expert
  // More choices than one scan segment (256): rows found across segment boundaries, the last
  // segment partial, with drops and an expert nobody chose.
  check_case(300, 2, 6, 2, /*unused=*/4, false, /*drop=*/true);
  check_case(257, 3, 5, 2, -1, /*all0=*/true, false);
}
