// Token + position embedding: forward against host loops (vocab slices, out-of-range tokens),
// backward (double instantiation) against central differences, run-to-run bitwise equality, and
// the float backward (the GPU's sorted-segment path) against host sums.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kernel_test_util.hpp"
#include "meshtrain/kernels/embedding.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {
std::vector<std::int32_t> random_tokens(std::size_t n, int lo, int hi, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(lo, hi - 1);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = dist(gen);
  return t;
}
}  // namespace

TEST_CASE("embedding_forward: vocab slice, out-of-range tokens give zero rows",
          "[kernels][embedding]") {
  const int B = 3, T = 7, C = 12, V = 37;
  const int vocab_start = 10, vocab_local = 15;  // this rank holds rows [10, 25) of 37
  const auto tokens = random_tokens(std::size_t(B) * T, 0, V, 1);
  const auto wte = kt::random_vector<float>(std::size_t(vocab_local) * C, 2);
  const auto wpe = kt::random_vector<float>(std::size_t(T) * C, 3);
  ExecSpace exec;
  int in_slice = 0;
  for (auto t : tokens) in_slice += (t >= vocab_start && t < vocab_start + vocab_local);
  REQUIRE(in_slice > 0);
  REQUIRE(in_slice < B * T);  // the data exercise both cases
  for (bool with_wpe : {true, false}) {
    auto out = kt::nan_view<float>(std::size_t(B) * T * C);
    embedding_forward<float>(exec, out, kt::to_device(tokens), kt::to_device(wte),
                             with_wpe ? kt::to_device(wpe) : View1<float>(), B, T, C,
                             vocab_start, vocab_local);
    const auto got = kt::to_host(out);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c) {
          const int v = tokens[b * T + t] - vocab_start;
          float want = (v >= 0 && v < vocab_local) ? wte[v * C + c] : 0.0f;
          if (with_wpe) want += wpe[t * C + c];
          // One fp32 addition at most, done the same way here: exact.
          const std::size_t i = (std::size_t(b) * T + t) * C + c;
          if (got[i] != want) {
            INFO("b=" << b << " t=" << t << " c=" << c << " token " << tokens[b * T + t]
                      << " got " << got[i] << " want " << want << " wpe " << with_wpe);
            REQUIRE(false);
          }
        }
  }
}

TEST_CASE("embedding_backward matches finite differences (double)", "[kernels][embedding]") {
  const int B = 3, T = 7, C = 4, vocab_start = 5, vocab_local = 9;
  // Tokens in [0, 20): repeats within the slice (scatter-add) and tokens outside it.
  const auto tokens = random_tokens(std::size_t(B) * T, 0, 20, 11);
  auto wte = kt::random_vector<double>(std::size_t(vocab_local) * C, 12);
  auto wpe = kt::random_vector<double>(std::size_t(T) * C, 13);
  const auto R = kt::random_vector<double>(std::size_t(B) * T * C, 14);
  ExecSpace exec;
  auto dtok = kt::to_device(tokens);
  auto objective = [&]() {
    View1<double> out("out", R.size());
    embedding_forward<double>(exec, out, dtok, kt::to_device(wte), kt::to_device(wpe), B, T, C,
                              vocab_start, vocab_local);
    return kt::dot(kt::to_host(out), R);
  };
  // Linear in wte and wpe: central differences are exact up to rounding (~1e-16 |L| / eps).
  const auto fd_wte = kt::fd_gradient(wte, objective, 1e-3);
  const auto fd_wpe = kt::fd_gradient(wpe, objective, 1e-3);
  // Both gradients accumulate.
  const auto wte0 = kt::random_vector<double>(wte.size(), 15);
  const auto wpe0 = kt::random_vector<double>(wpe.size(), 16);
  auto dwte = kt::to_device(wte0), dwpe = kt::to_device(wpe0);
  embedding_backward<double>(exec, dwte, dwpe, kt::to_device(R), dtok, B, T, C, vocab_start,
                             vocab_local);
  kt::require_close(kt::subtract(kt::to_host(dwte), wte0), fd_wte, 1e-9, 1e-9, "dwte");
  kt::require_close(kt::subtract(kt::to_host(dwpe), wpe0), fd_wpe, 1e-9, 1e-9, "dwpe");
  // Empty dwpe is skipped.
  auto dwte2 = kt::to_device(wte0);
  embedding_backward<double>(exec, dwte2, View1<double>(), kt::to_device(R), dtok, B, T, C,
                             vocab_start, vocab_local);
  REQUIRE(kt::bitwise_equal(kt::to_host(dwte2), kt::to_host(dwte)));
}

TEST_CASE("embedding_backward is bitwise deterministic", "[kernels][embedding][determinism]") {
  const int B = 4, T = 64, C = 48, vocab_start = 0, vocab_local = 16;
  // Few distinct tokens: every row of dwte is hit many times.
  const auto tokens = random_tokens(std::size_t(B) * T, 0, vocab_local, 21);
  const auto dout = kt::random_vector<float>(std::size_t(B) * T * C, 22);
  const auto wte0 = kt::random_vector<float>(std::size_t(vocab_local) * C, 23);
  const auto wpe0 = kt::random_vector<float>(std::size_t(T) * C, 24);
  ExecSpace exec;
  std::vector<float> first_wte, first_wpe;
  for (int run = 0; run < 2; ++run) {
    auto dwte = kt::to_device(wte0), dwpe = kt::to_device(wpe0);
    embedding_backward<float>(exec, dwte, dwpe, kt::to_device(dout), kt::to_device(tokens), B, T,
                              C, vocab_start, vocab_local);
    if (run == 0) {
      first_wte = kt::to_host(dwte);
      first_wpe = kt::to_host(dwpe);
    } else {
      REQUIRE(kt::bitwise_equal(kt::to_host(dwte), first_wte));
      REQUIRE(kt::bitwise_equal(kt::to_host(dwpe), first_wpe));
    }
  }
}

namespace {
// dwte after embedding_backward (float) against host sums in double, from a random start.
// hot_of_5 rows in every 5 carry token `hot`, the rest spread over [0, spread); tokens outside
// [vocab_start, vocab_start + vocab_local) must leave dwte alone.
void check_long_runs(int B, int T, int C, int vocab_start, int vocab_local, int hot, int spread,
                     int hot_of_5, std::uint32_t seed) {
  const std::size_t BT = std::size_t(B) * T;
  std::vector<std::int32_t> tokens(BT);
  const auto r = random_tokens(BT, 0, spread, seed);
  for (std::size_t i = 0; i < BT; ++i) tokens[i] = int(i % 5) < hot_of_5 ? hot : r[i];
  const auto dout = kt::random_vector<float>(BT * C, seed + 1);
  const auto wte0 = kt::random_vector<float>(std::size_t(vocab_local) * C, seed + 2);
  std::vector<double> want(wte0.begin(), wte0.end());
  for (std::size_t bt = 0; bt < BT; ++bt) {
    const int v = tokens[bt] - vocab_start;
    if (v < 0 || v >= vocab_local) continue;
    for (int c = 0; c < C; ++c) want[std::size_t(v) * C + c] += dout[bt * C + c];
  }
  ExecSpace exec;
  auto dwte = kt::to_device(wte0);
  embedding_backward<float>(exec, dwte, View1<float>(), kt::to_device(dout),
                            kt::to_device(tokens), B, T, C, vocab_start, vocab_local);
  // Sums of up to BT * hot_of_5 / 5 terms in [-1, 1] in fp32.
  const double tol = 1e-5 * std::max(1.0, double(BT * hot_of_5) / 5 / 90);
  kt::require_close(kt::to_host(dwte), want, tol, tol, "dwte");
}
}  // namespace

TEST_CASE("embedding_backward (float) with long runs of one token matches host sums",
          "[kernels][embedding]") {
  // A byte-level corpus puts a fifth of all rows on one token: segments far longer than the
  // GPU path's 32-row pieces, starting and ending inside pieces, plus tokens outside this rank's
  // vocabulary slice. B*T = 150 is not a multiple of the piece size.
  check_long_runs(3, 50, 40, 4, 9, 7, 16, 3, 31);  // 60 % on token 7, the rest over [0, 16)
  // A step's worth of rows (the GPU sort's several passes and blocks): 4 x 1024 rows, a
  // 256-token slice whose out-of-slice key (256) needs one more bit than the slice's tokens,
  // and a slice starting inside the vocabulary.
  check_long_runs(4, 1024, 24, 0, 256, 32, 300, 1, 41);
  check_long_runs(2, 2048, 16, 100, 1000, 120, 1500, 2, 51);
}
