// The FP8 recipe's agreement over tp (model/fp8_recipe.hpp) on the GEMMs of one linear
// (kernels/linear_fp8.hpp): each rank holds Megatron's column- or row-parallel piece of one
// linear (weight in either layout), agrees the amaxes the recipe names over the group, and must
// compute the single-rank linear's slice — forward, input gradient and weight gradient, both
// scalings. At this level every rank casts exactly the values one rank casts, so the results
// match to the rounding of the split sums: fp32 summation order where the FP8 GEMM is the
// host's emulation (1e-6 of the largest value), and where cuBLASLt runs it on Hopper, the
// tensor cores' FP8 accumulator, which keeps about 14 bits between its promotions to fp32
// (DeepSeek-V3's report, sec. 3.3.2; on the H200 tp 2's column-parallel dinp differed by 1.2e-5
// of the largest value): each of the two sums off by up to 2^-14 of sum |a b| of the FP8
// operands (at most 1.27x the fp32 ones'), so 2^-12 of sum |a b|. A scale that is not the
// whole tensor's (a missing or wrong agreement) moves most elements by FP8 rounding, 2^-4 to
// 2^-3 of the element. Runs at 1, 2 and 4 ranks. Also the policy's table itself.
#include <cmath>
#include <vector>

#include "kernel_test_util.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/kernels/gemm/gemm_fp8.hpp"
#include "meshtrain/kernels/linear_fp8.hpp"
#include "meshtrain/model/fp8_amax.hpp"
#include "meshtrain/model/fp8_recipe.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {

constexpr int N = 16, IC = 24, OC = 32;

// Rows [r0, r1) x columns [c0, c1) of the row-major x with `cols` columns.
std::vector<float> block(const std::vector<float>& x, int cols, int r0, int r1, int c0, int c1) {
  std::vector<float> b;
  for (int r = r0; r < r1; ++r)
    for (int c = c0; c < c1; ++c) b.push_back(x[std::size_t(r) * cols + c]);
  return b;
}

struct Result {
  std::vector<float> out, dinp, dw;  // out [N, oc], dinp [N, ic], dw as the weight is stored
};

// sum |a b| over each element's products, the three GEMMs of one linear, laid out as Result.
Result magnitudes(const std::vector<float>& inp, const std::vector<float>& w,
                  const std::vector<float>& dout, int ic, int oc, bool out_in) {
  auto W = [&](int k, int j) { return std::fabs(double(out_in ? w[std::size_t(j) * ic + k]
                                                               : w[std::size_t(k) * oc + j])); };
  Result m{std::vector<float>(std::size_t(N) * oc), std::vector<float>(std::size_t(N) * ic),
           std::vector<float>(std::size_t(ic) * oc)};
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < oc; ++j) {
      double o = 0;
      for (int k = 0; k < ic; ++k) o += std::fabs(double(inp[std::size_t(n) * ic + k])) * W(k, j);
      m.out[std::size_t(n) * oc + j] = float(o);
    }
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < ic; ++k) {
      double d = 0;
      for (int j = 0; j < oc; ++j) d += std::fabs(double(dout[std::size_t(n) * oc + j])) * W(k, j);
      m.dinp[std::size_t(n) * ic + k] = float(d);
    }
  for (int k = 0; k < ic; ++k)
    for (int j = 0; j < oc; ++j) {
      double g = 0;
      for (int n = 0; n < N; ++n)
        g += std::fabs(double(inp[std::size_t(n) * ic + k])) *
             std::fabs(double(dout[std::size_t(n) * oc + j]));
      m.dw[out_in ? std::size_t(j) * ic + k : std::size_t(k) * oc + j] = float(g);
    }
  return m;
}

// One linear with every GEMM: weight [ic, oc] (in_out) or [oc, ic] (out_in).
Result run(const std::vector<float>& inp, const std::vector<float>& w,
           const std::vector<float>& dout, int ic, int oc, const Fp8LinearOptions& o) {
  View1<float> out("out", std::size_t(N) * oc), dinp("dinp", std::size_t(N) * ic),
      dw("dw", std::size_t(ic) * oc);
  const auto x = kt::to_device(inp), wd = kt::to_device(w), g = kt::to_device(dout);
  linear_fp8_forward_gemm<float>(ExecSpace(), out.data(), oc, nullptr, x.data(), wd.data(), N,
                                 ic, oc, o);
  const Fp8Tensor q = linear_fp8_grad<float>(ExecSpace(), g.data(), oc, N, oc, o);
  linear_fp8_dinp_gemm<float>(ExecSpace(), dinp.data(), 0.0f, q, wd.data(), N, ic, oc, o);
  linear_fp8_dweight_gemm<float>(ExecSpace(), dw.data(), q, g.data(), oc, x.data(), N, ic, oc, o);
  return {kt::to_host(out), kt::to_host(dinp), kt::to_host(dw)};
}

// `terms`: sum |a b| of each element (magnitudes), used where cuBLASLt ran the FP8 GEMMs.
void require_close(const std::vector<float>& got, const std::vector<float>& want,
                   const std::vector<float>& terms, const char* what) {
  REQUIRE(got.size() == want.size());
  REQUIRE(terms.size() == want.size());
  const bool tensor_cores = kernels::gemm_fp8_cublaslt_calls() > 0;
  double mag = 0;
  for (float v : want) mag = std::max(mag, std::fabs(double(v)));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = 1e-6 * mag + (tensor_cores ? std::ldexp(double(terms[i]), -12) : 0.0);
    INFO(what << " element " << i << " got " << got[i] << " want " << want[i] << " bound "
              << bound << (tensor_cores ? " (cuBLASLt)" : " (emulated)"));
    REQUIRE(std::fabs(double(got[i]) - want[i]) <= bound);
  }
}

}  // namespace

TEST_CASE("the recipe agrees where tp splits a scale", "[fp8]") {
  using model::TpSplit;
  const auto oi = Fp8WeightLayout::out_in, io = Fp8WeightLayout::in_out;
  const auto tw = Fp8Scaling::tensorwise, rw = Fp8Scaling::rowwise;
  REQUIRE(model::tp_split_dim(TpSplit::column, oi, "weight") == 0);
  REQUIRE(model::tp_split_dim(TpSplit::column, io, "weight") == 1);
  REQUIRE(model::tp_split_dim(TpSplit::column, oi, "dout") == 1);
  REQUIRE(model::tp_split_dim(TpSplit::column, oi, "inp") == -1);
  REQUIRE(model::tp_split_dim(TpSplit::row, oi, "weight") == 1);
  REQUIRE(model::tp_split_dim(TpSplit::row, io, "weight") == 0);
  REQUIRE(model::tp_split_dim(TpSplit::row, io, "inp") == 1);
  REQUIRE(model::tp_split_dim(TpSplit::row, io, "dout") == -1);
  // Tensorwise: every split tensor; rowwise: only along K.
  REQUIRE(model::agree_over_tp(TpSplit::column, oi, {"weight", 1, tw}));
  REQUIRE_FALSE(model::agree_over_tp(TpSplit::column, oi, {"weight", 1, rw}));
  REQUIRE(model::agree_over_tp(TpSplit::column, oi, {"weight", 0, rw}));
  REQUIRE_FALSE(model::agree_over_tp(TpSplit::column, oi, {"inp", 1, tw}));
  REQUIRE(model::agree_over_tp(TpSplit::row, oi, {"inp", 1, rw}));
  REQUIRE_FALSE(model::agree_over_tp(TpSplit::row, oi, {"inp", 0, rw}));
  REQUIRE_FALSE(model::agree_over_tp(TpSplit::row, io, {"dout", 1, tw}));
  // cp splits tokens: activations and gradients, never weights.
  REQUIRE(model::agree_over_cp({"inp", 1, tw}));
  REQUIRE(model::agree_over_cp({"dout", 0, rw}));
  REQUIRE_FALSE(model::agree_over_cp({"dout", 1, rw}));
  REQUIRE_FALSE(model::agree_over_cp({"weight", 0, tw}));
  REQUIRE(model::parse_fp8_recipe("rowwise", "fp8.recipe") == rw);
  REQUIRE_THROWS_WITH(model::parse_fp8_recipe("blockwise", "fp8.recipe"),
                      "fp8.recipe='blockwise' is not one of tensorwise, rowwise");
}

static double relative_gap(double got, double want) { return std::abs(got - want) / want; }

TEST_CASE("the FP8 share of a token's FLOPs counts the FP8 blocks' linears", "[fp8]") {
  // GPT-2, 4 blocks, C = 64, seq 32, counted by hand: parameters 256 x 64 (tied embedding) +
  // 32 x 64 (positions) + 4 x 49,984 (per block: norms 256, c_attn 12,480, attention c_proj
  // 4,160, c_fc 16,640, MLP c_proj 16,448) + 128 (final norm) = 218,496, so a token's model
  // FLOPs are 6 x 218,496 + 12 x 4 x 4 x 16 x 32 = 1,409,280. The linears' weights are
  // 12 C^2 = 49,152 per block: 6 x 4 x 49,152 = 1,179,648 of those FLOPs run in FP8.
  model::GptConfig g;
  g.n_layer = 4;
  g.n_head = 4;
  g.n_embd = 64;
  g.vocab_size = 256;
  g.block_size = 32;
  REQUIRE(g.flops_per_token(32) == 1409280.0);
  model::Fp8Recipe r;
  REQUIRE(model::fp8_flops_share(g, r, 32) == 0.0);  // fp8 off
  r.enabled = true;
  REQUIRE(relative_gap(model::fp8_flops_share(g, r, 32), 1179648.0 / 1409280.0) < 1e-12);
  r.first_last_bf16 = 1;  // blocks 1 and 2 only
  REQUIRE(relative_gap(model::fp8_flops_share(g, r, 32), 589824.0 / 1409280.0) < 1e-12);
  r.wgrad_bf16 = true;  // 4 of each weight's 6 FLOPs
  REQUIRE(relative_gap(model::fp8_flops_share(g, r, 32), 393216.0 / 1409280.0) < 1e-12);
  // Llama shape with grouped-query attention (4 heads of 16, 2 kv heads, SwiGLU 128) and an MoE
  // MLP in every other block: q/k/v 64 x 128 + o 64 x 64 = 12,288 weights per block, 6 FLOPs
  // each; the dense MLP 3 x 64 x 128 = 24,576 in blocks 1 and 3; in blocks 0 and 2 a token's
  // top-2 experts of 96 and a shared expert of 32, 3 x 64 x (2 x 96 + 32) = 43,008 weights at 4
  // FLOPs each with fp8.experts (forward and input gradient in FP8, the weight gradient in the
  // model's type).
  g.family = model::Family::llama;
  g.norm = model::Norm::rmsnorm;
  g.positions = model::Positions::rotary;
  g.mlp = model::Mlp::swiglu;
  g.bias = false;
  g.n_kv_head = 2;
  g.intermediate_size = 128;
  g.moe.experts = 4;
  g.moe.layer_freq = 2;  // blocks 0 and 2 are MoE blocks
  g.moe.top_k = 2;
  g.moe.ffn = 96;
  g.moe.shared_ffn = 32;
  model::Fp8Recipe all;
  all.enabled = true;
  // Without fp8.experts the experts stay in the model's type.
  REQUIRE(relative_gap(model::fp8_flops_share(g, all, 32),
                       6.0 * (4 * 12288.0 + 2 * 24576.0) / g.flops_per_token(32)) < 1e-12);
  all.experts = true;
  const double fp8 = 6.0 * (4 * 12288.0 + 2 * 24576.0) + 4.0 * 2 * 43008.0;
  REQUIRE(relative_gap(model::fp8_flops_share(g, all, 32), fp8 / g.flops_per_token(32)) < 1e-12);
  // With the first and last block in bf16: blocks 1 (dense) and 2 (MoE).
  all.first_last_bf16 = 1;
  const double middle = 6.0 * (2 * 12288.0 + 24576.0) + 4.0 * 43008.0;
  REQUIRE(relative_gap(model::fp8_flops_share(g, all, 32), middle / g.flops_per_token(32)) <
          1e-12);
}

TEST_CASE("column- and row-parallel FP8 linears compute the single-rank linear", "[fp8][mpi]") {
  auto group = comm::make_group_communicator(comm::default_backend(), mt_test::world());
  const int P = group->size(), r = group->rank();
  // Magnitudes vary by row and column so that no rank's piece holds every amax.
  auto inp = kt::random_vector<float>(std::size_t(N) * IC, 71, -1.0, 1.0);
  for (std::size_t i = 0; i < inp.size(); ++i) inp[i] *= 1.0f + float(i % IC) / 4 + float(i / IC);
  const auto dout = kt::random_vector<float>(std::size_t(N) * OC, 72, -1e-3, 1e-3);
  for (const auto layout : {Fp8WeightLayout::out_in, Fp8WeightLayout::in_out})
    for (const auto scaling : {Fp8Scaling::tensorwise, Fp8Scaling::rowwise})
      for (const auto split : {model::TpSplit::column, model::TpSplit::row}) {
        const bool oi = layout == Fp8WeightLayout::out_in;
        const bool col = split == model::TpSplit::column;
        INFO((oi ? "out_in " : "in_out ") << fp8_scaling_name(scaling) << (col ? " column" : " row")
                                          << " ranks " << P);
        auto w = kt::random_vector<float>(std::size_t(IC) * OC, 73, -0.2, 0.2);
        for (std::size_t i = 0; i < w.size(); ++i) w[i] *= 1.0f + float(i % 7);
        Fp8LinearOptions o;
        o.layout = layout;
        o.scaling = scaling;
        const Result ref = run(inp, w, dout, IC, OC, o);
        const Result mag = magnitudes(inp, w, dout, IC, OC, oi);
        o.agree = [&](const Fp8Cast& c, View1<float> amax, std::size_t n) {
          if (model::agree_over_tp(split, layout, c))
            model::agree_amax(*group, ExecSpace(), amax, n);
        };
        // The weight stored as [rows, cols]; this rank's piece of its output (column) or
        // input (row) features.
        const int wc = oi ? IC : OC;  // the stored weight's columns
        if (col) {
          const int oc = OC / P, o0 = r * oc;
          const auto wl = oi ? block(w, wc, o0, o0 + oc, 0, IC) : block(w, wc, 0, IC, o0, o0 + oc);
          const Result got = run(inp, wl, block(dout, OC, 0, N, o0, o0 + oc), IC, oc, o);
          require_close(got.out, block(ref.out, OC, 0, N, o0, o0 + oc),
                        block(mag.out, OC, 0, N, o0, o0 + oc), "out");
          std::vector<float> dinp = got.dinp;  // partial over the ranks
          MPI_Allreduce(MPI_IN_PLACE, dinp.data(), int(dinp.size()), MPI_FLOAT, MPI_SUM,
                        mt_test::world());
          require_close(dinp, ref.dinp, mag.dinp, "dinp");
          require_close(got.dw, oi ? block(ref.dw, wc, o0, o0 + oc, 0, IC)
                                   : block(ref.dw, wc, 0, IC, o0, o0 + oc),
                        oi ? block(mag.dw, wc, o0, o0 + oc, 0, IC)
                           : block(mag.dw, wc, 0, IC, o0, o0 + oc), "dweight");
        } else {
          const int ic = IC / P, i0 = r * ic;
          const auto wl = oi ? block(w, wc, 0, OC, i0, i0 + ic) : block(w, wc, i0, i0 + ic, 0, OC);
          const Result got = run(block(inp, IC, 0, N, i0, i0 + ic), wl, dout, ic, OC, o);
          std::vector<float> out = got.out;  // partial over the ranks
          MPI_Allreduce(MPI_IN_PLACE, out.data(), int(out.size()), MPI_FLOAT, MPI_SUM,
                        mt_test::world());
          require_close(out, ref.out, mag.out, "out");
          require_close(got.dinp, block(ref.dinp, IC, 0, N, i0, i0 + ic),
                        block(mag.dinp, IC, 0, N, i0, i0 + ic), "dinp");
          require_close(got.dw, oi ? block(ref.dw, wc, 0, OC, i0, i0 + ic)
                                   : block(ref.dw, wc, i0, i0 + ic, 0, OC),
                        oi ? block(mag.dw, wc, 0, OC, i0, i0 + ic)
                           : block(mag.dw, wc, i0, i0 + ic, 0, OC), "dweight");
        }
      }
}
