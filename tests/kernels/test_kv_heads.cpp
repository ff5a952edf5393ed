// Grouped key-value heads: expand_kv_heads is HF's repeat_kv on the packed layout (query head j
// reads kv head j / G), and reduce_kv_heads is its adjoint: <expand(x), y> = <x, reduce(y)> for
// any x, y, which is what makes it the gradient.
#include <cmath>
#include <vector>

#include "harness.hpp"
#include "meshtrain/kernels/kv_heads.hpp"

using namespace meshtrain;

namespace {
View1<double> to_device(const std::vector<double>& v) {
  auto d = alloc<double>("test.v", v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}
std::vector<double> to_host(View1<double> d) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, d);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}
}  // namespace

TEST_CASE("expand_kv_heads repeats each kv head for its query group", "[kernels][gqa]") {
  for (int NKV : {1, 2, 3, 6}) {
    const int N = 5, NH = 6, HS = 4, G = NH / NKV;
    const int wc = (NH + 2 * NKV) * HS, wf = 3 * NH * HS;
    std::vector<double> compact(static_cast<std::size_t>(N) * wc);
    std::vector<double> y(static_cast<std::size_t>(N) * wf);
    for (std::size_t i = 0; i < compact.size(); ++i) compact[i] = std::sin(1.0 + 0.37 * i);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::cos(2.0 + 0.11 * i);
    auto full = alloc<double>("full", y.size());
    auto dcompact = alloc<double>("dcompact", compact.size());
    auto dc = to_device(compact);
    kernels::expand_kv_heads<double>(ExecSpace{}, full, dc, N, NH, NKV, HS);
    kernels::reduce_kv_heads<double>(ExecSpace{}, dcompact, to_device(y), N, NH, NKV, HS);
    const auto f = to_host(full), r = to_host(dcompact);
    INFO("NKV " << NKV);
    for (int n = 0; n < N; ++n)
      for (int part = 0; part < 3; ++part)
        for (int h = 0; h < NH; ++h)
          for (int d = 0; d < HS; ++d) {
            const int src =
                part == 0 ? h * HS + d : NH * HS + (part - 1) * NKV * HS + (h / G) * HS + d;
            REQUIRE(f[n * wf + part * NH * HS + h * HS + d] == compact[n * wc + src]);
          }
    double lhs = 0, rhs = 0;
    for (std::size_t i = 0; i < y.size(); ++i) lhs += f[i] * y[i];
    for (std::size_t i = 0; i < compact.size(); ++i) rhs += compact[i] * r[i];
    REQUIRE(std::fabs(lhs - rhs) <= 1e-12 * std::fabs(lhs));
  }
}
