// FP8 scales agreed over the group that splits a tensor (model/fp8_amax.hpp; invariant 1): every
// rank holds a piece of one tensor (split along the columns, as tp splits K, or along the rows,
// as sp splits tokens); after agree_amax each rank's amax equals the whole tensor's, bit for bit,
// and its FP8 codes equal the slice of the whole tensor's cast. NaN and inf on one rank reach
// every rank. Runs at 1 and 2 ranks.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernel_test_util.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/kernels/fp8_cast.hpp"
#include "meshtrain/model/fp8_amax.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {

constexpr int kRows = 12, kCols = 24;  // divisible by 1, 2, 3, 4 ranks

// The whole tensor, the same on every rank: magnitudes vary by row; the largest element lies in
// the last column block and the last row block, so rank 0 alone never sees it.
std::vector<float> whole() {
  std::vector<float> x(std::size_t(kRows) * kCols);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c)
      x[std::size_t(r) * kCols + c] = float(std::sin(0.37 * r + 1.3 * c)) * float(1 + r % 5);
  x[std::size_t(kRows - 1) * kCols + kCols - 2] = -31.5f;
  return x;
}

// Rows [r0, r1) x columns [c0, c1) of x, row-major.
std::vector<float> block(const std::vector<float>& x, int r0, int r1, int c0, int c1) {
  std::vector<float> b;
  for (int r = r0; r < r1; ++r)
    for (int c = c0; c < c1; ++c) b.push_back(x[std::size_t(r) * kCols + c]);
  return b;
}

using kt::bitwise_equal;
using kt::to_host;
using kt::to_device;

}  // namespace

TEST_CASE("agree_amax gives every rank the whole tensor's amax and cast", "[fp8][mpi]") {
  auto group = comm::make_group_communicator(comm::default_backend(), mt_test::world());
  const int P = group->size(), r = group->rank();
  const auto x = whole();
  const AmaxHook agree = [&](View1<float> amax, std::size_t n) {
    model::agree_amax(*group, ExecSpace(), amax, n);
  };

  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (Fp8Scaling sc : {Fp8Scaling::tensorwise, Fp8Scaling::rowwise}) {
      INFO(fp8_format_name(f) << " " << fp8_scaling_name(sc) << " ranks " << P);
      Fp8Tensor ref = make_fp8_tensor("whole", kRows, kCols, f, sc);
      fp8_quantize<float>(ExecSpace(), ref, to_device(x));
      const auto ref_amax = to_host(ref.amax), ref_scale = to_host(ref.scale);
      const auto ref_codes = to_host(ref.data);

      // Column split (tp splits K): rows keep their length only after agreement.
      const int w = kCols / P;
      Fp8Tensor q = make_fp8_tensor("cols", kRows, w, f, sc);
      fp8_quantize<float>(ExecSpace(), q, to_device(block(x, 0, kRows, r * w, (r + 1) * w)), agree);
      bool ok = bitwise_equal(to_host(q.amax), ref_amax) &&
                bitwise_equal(to_host(q.scale), ref_scale);
      const auto codes = to_host(q.data);
      for (int i = 0; i < kRows; ++i)
        for (int c = 0; c < w; ++c)
          ok = ok && codes[std::size_t(i) * w + c] == ref_codes[std::size_t(i) * kCols + r * w + c];
      REQUIRE(mt_test::all_ranks(ok));

      // Row split (sp splits tokens): tensorwise agrees; rowwise needs no agreement.
      const int h = kRows / P;
      Fp8Tensor p = make_fp8_tensor("rows", h, kCols, f, sc);
      fp8_quantize<float>(ExecSpace(), p, to_device(block(x, r * h, (r + 1) * h, 0, kCols)),
                          sc == Fp8Scaling::tensorwise ? agree : AmaxHook{});
      const auto pa = to_host(p.amax);
      ok = sc == Fp8Scaling::tensorwise
               ? bitwise_equal(pa, ref_amax)
               : bitwise_equal(pa, std::vector<float>(ref_amax.begin() + r * h,
                                                  ref_amax.begin() + (r + 1) * h));
      const auto pc = to_host(p.data);
      for (std::size_t i = 0; i < pc.size(); ++i)
        ok = ok && pc[i] == ref_codes[std::size_t(r * h) * kCols + i];
      REQUIRE(mt_test::all_ranks(ok));
    }
}

TEST_CASE("agree_amax carries NaN and inf from one rank to all", "[fp8][mpi]") {
  auto group = comm::make_group_communicator(comm::default_backend(), mt_test::world());
  const int P = group->size(), r = group->rank();
  const float inf = std::numeric_limits<float>::infinity();
  // Per rank: [finite, inf on the last rank, NaN on the last rank, NaN on rank 0 and inf on the
  // last]; a NaN's bits compare above inf's, whichever rank holds which.
  std::vector<float> a{float(r + 1), r == P - 1 ? inf : 1.0f,
                       r == P - 1 ? std::nanf("") : 2.0f, r == 0 ? std::nanf("") : 0.5f};
  if (P > 1 && r == P - 1) a[3] = inf;
  View1<float> d = to_device(a);
  // As fp8_amax would write them (the sign bit clear), then agreed.
  model::agree_amax(*group, ExecSpace(), d, a.size());
  const auto got = to_host(d);
  const bool ok = got[0] == float(P) && got[1] == inf && std::isnan(got[2]) && std::isnan(got[3]);
  REQUIRE(mt_test::all_ranks(ok));
  REQUIRE_THROWS_WITH(model::agree_amax(*group, ExecSpace(), d, 5),
                      mt_test::contains("agree_amax"));
}
