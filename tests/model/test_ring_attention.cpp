// Context-parallel attention against one rank's causal attention, on every rank count the test
// runs at (cp = the world: 1, 2, 3, 4): fp64 queries, keys and values of whole sequences (the
// same on every rank), each rank holding chunks r and 2cp-1-r of every sequence. The ring and
// the all-gather forms must give each rank the single-rank output, lse and every gradient
// (dq, dk, dv) of its own rows: the output to fp64 rounding (1e-12 relative), lse and the
// gradients to the fp32 lse that attention keeps between forward and backward (1e-6), for
// multi-head, grouped-query (4 query heads on 2 kv heads) and multi-query attention.
// Then float: the same comparison within fp32 rounding (2e-5). Then bf16 (Kokkos 4 builds): on a
// GPU the blocks run on cuDNN (their partials rounded to bf16 before the fp32 merge) and the
// single rank on cuDNN's self-attention: equal within bf16 rounding of the largest value.
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kernel_test_util.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/kernels/attention/attention.hpp"
#include "meshtrain/kernels/attention/attention_block.hpp"
#include "meshtrain/model/ring_attention.hpp"

using namespace meshtrain;

namespace {

struct Case {
  int B, T, NH, NKV, HS;
};

// |got - want| within tol of want's largest magnitude (bf16: rounding at different places), or
// within tol + tol |want| element by element (fp32, fp64).
template <class T, class U>
void require_near(const std::vector<T>& got, const std::vector<U>& want, double tol,
                  const std::string& what) {
#if MESHTRAIN_HAVE_BF16
  if constexpr (std::is_same_v<T, bf16>) {
    const std::vector<float> g = kt::convert<float>(got), w = kt::convert<float>(want);
    const double scale = kt::max_abs(w);
    kt::require_close(g, w, 0, tol * scale, what);
    return;
  }
#endif
  kt::require_close(got, want, tol, tol, what);
}

template <class T>
std::vector<T> random_of(std::size_t n, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
#if MESHTRAIN_HAVE_BF16
  if constexpr (std::is_same_v<T, bf16>)
    return kt::convert<T>(kt::random_vector<float>(n, seed, lo, hi));
#endif
  return kt::random_vector<T>(n, seed, lo, hi);
}

template <class T>
void check_case(const Case& c, model::CpComm how, double out_tol, double grad_tol,
                double lse_tol = 1e-6) {
  const int cp = mt_test::world_size(), r = mt_test::world_rank();
  INFO("B " << c.B << " T " << c.T << " NH " << c.NH << " NKV " << c.NKV << " HS " << c.HS
            << " cp " << cp << " " << model::cp_comm_name(how));
  const int C = c.NH * c.HS, Ckv = c.NKV * c.HS, ld = C + 2 * Ckv, Tl = c.T / cp;
  // Whole sequences, identical on every rank (a fixed seed).
  const auto qkv = random_of<T>(std::size_t(c.B) * c.T * ld, 11, -1.5, 1.5);
  const auto dout = random_of<T>(std::size_t(c.B) * c.T * C, 12);
  // The single-rank causal attention of the whole sequences.
  auto d_qkv = kt::to_device(qkv), d_dqkv = kt::nan_view<T>(qkv.size());
  auto d_out = kt::nan_view<T>(std::size_t(c.B) * c.T * C);
  auto d_lse = kt::nan_view<float>(std::size_t(c.B) * c.NH * c.T);
  const ExecSpace exec;
  kernels::attention_forward<T>(exec, d_out, d_lse, d_qkv, c.B, c.T, c.NH, c.HS, c.NKV);
  kernels::attention_backward<T>(exec, d_dqkv, View1<const T>(kt::to_device(dout)), d_qkv, d_out,
                                 d_lse, c.B, c.T, c.NH, c.HS, c.NKV);
  const auto ref_out = kt::to_host(d_out), ref_dqkv = kt::to_host(d_dqkv);
  const auto ref_lse = kt::to_host(d_lse);
  // This rank's rows.
  const std::vector<int> pos = model::cp_positions(c.T, cp, r);
  auto rows = [&](const std::vector<T>& full, int width) {
    std::vector<T> out;
    for (int b = 0; b < c.B; ++b)
      for (int p : pos)
        for (int e = 0; e < width; ++e) out.push_back(full[(std::size_t(b) * c.T + p) * width + e]);
    return out;
  };
  std::vector<float> want_lse;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.NH; ++h)
      for (int p : pos) want_lse.push_back(ref_lse[(std::size_t(b) * c.NH + h) * c.T + p]);

  auto group = comm::make_group_communicator(comm::default_backend(), mt_test::world());
  model::RingAttention<T> ring(*group, how, c.B, Tl, c.NH, c.NKV, c.HS, exec);
  auto l_qkv = kt::to_device(rows(qkv, ld));
  auto l_out = kt::nan_view<T>(std::size_t(c.B) * Tl * C);
  auto l_lse = kt::nan_view<float>(std::size_t(c.B) * c.NH * Tl);
  auto l_dqkv = kt::nan_view<T>(std::size_t(c.B) * Tl * ld);
  const std::int64_t calls = kernels::cudnn_attention_block_calls();
  for (int round = 0; round < 2; ++round) {  // the second reuses the ring's buffers
    ring.forward(l_out, l_lse, l_qkv);
    ring.backward(l_dqkv, View1<const T>(kt::to_device(rows(dout, C))), l_qkv, l_out, l_lse);
  }
  require_near(kt::to_host(l_out), rows(ref_out, C), out_tol, "out");
  kt::require_close(kt::to_host(l_lse), want_lse, lse_tol, lse_tol, "lse");
  require_near(kt::to_host(l_dqkv), rows(ref_dqkv, ld), grad_tol, "dqkv");
  // Where cuDNN runs attention (a GPU, bf16/fp16, HS 64 or 128), every block ran on it: one
  // forward and one backward call per source and round.
  constexpr bool sixteen_bit = !std::is_same_v<T, float> && !std::is_same_v<T, double>;
  const bool cudnn = !kDeviceIsHost && sixteen_bit && (c.HS == 64 || c.HS == 128) &&
                     kernels::cudnn_attention_unavailable_reason().empty();
  if (cudnn) REQUIRE(kernels::cudnn_attention_block_calls() - calls == 2 * 2 * cp);
  REQUIRE(mt_test::all_ranks(true));
}

}  // namespace

TEST_CASE("ring attention equals one rank's causal attention, fp64", "[model][cp][mpi]") {
  for (const auto how : {model::CpComm::ring, model::CpComm::all_gather})
    for (const Case& c : {Case{2, 24, 2, 2, 8}, Case{2, 48, 4, 2, 16}, Case{1, 24, 4, 1, 8}})
      check_case<double>(c, how, 1e-12, 1e-6);
}

TEST_CASE("ring attention equals one rank's causal attention, fp32", "[model][cp][mpi]") {
  for (const auto how : {model::CpComm::ring, model::CpComm::all_gather})
    check_case<float>(Case{2, 48, 4, 2, 16}, how, 2e-5, 2e-5);
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("ring attention equals one rank's causal attention, bf16", "[model][cp][mpi]") {
  // T = 384 splits into chunks of 192, 96, 64 and 48 rows at cp = 1..4; HS 64 and GQA, so that
  // on a GPU the blocks (Tq = Tk, Tq = 2 Tk, 2 Tq = Tk) run on cuDNN. bf16 outputs and
  // gradients: within 2e-2 and 3e-2 of the largest value; lse fp32 (1e-4).
  for (const auto how : {model::CpComm::ring, model::CpComm::all_gather})
    check_case<bf16>(Case{1, 384, 4, 2, 64}, how, 2e-2, 3e-2, 1e-4);
}
#endif

TEST_CASE("cp_positions: chunks r and 2cp-1-r, every position once", "[model][cp]") {
  for (int cp : {1, 2, 3, 4}) {
    std::vector<int> seen(24, 0);
    for (int r = 0; r < cp; ++r) {
      const auto p = model::cp_positions(24, cp, r);
      REQUIRE(p.size() == std::size_t(24 / cp));
      const int c = 24 / (2 * cp);
      REQUIRE(p.front() == r * c);
      REQUIRE(p[std::size_t(c)] == (2 * cp - 1 - r) * c);
      for (int x : p) ++seen[std::size_t(x)];
    }
    for (int s : seen) REQUIRE(s == 1);
  }
  REQUIRE_THROWS(model::cp_positions(20, 3, 0));
}
