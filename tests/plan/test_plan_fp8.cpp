// The planner's FP8 terms (issue 35), without MPI peers: the casts' workspace and the kept
// inputs in each stage's memory, the FP8 blocks' GEMMs at the FP8 rate and their casts as
// memory traffic in the step time (hand-computed on llama-tiny), and the 8B shape's
// prediction and report.
#include <string>
#include <vector>

#include "harness.hpp"
#include "meshtrain/model/fp8_recipe.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/plan/memory.hpp"
#include "meshtrain/plan/report.hpp"
#include "plan_model_util.hpp"

using namespace meshtrain;
using mt_test::Approx;
using plan_test::h200;
using plan_test::node;

namespace {

// Issue 35's FP8 shape: Llama 3.1 8B cut to 4 blocks (seq 4096, mb 1, one GPU).
model::GptConfig llama8b_4_blocks() {
  model::GptConfig cfg = model::preset("llama3.1-8b");
  cfg.n_layer = 4;
  return cfg;
}

}  // namespace

TEST_CASE("FP8 layouts count the casts' workspace, stage by stage", "[plan][memory][fp8]") {
  // Llama 3.1 8B's shape cut to 4 blocks, seq 4096, mb 1, bf16 + FP8 linears: at tp 1 the
  // workspace is four [N, I] buffers (the input and weight casts, the output gradient's two
  // orientations), N = 4096 tokens, I = 14336: about 235 MB, in each stage's scratch.
  model::GptConfig cfg = llama8b_4_blocks();
  plan::Layout l;
  l.precision = plan::Precision::bf16;
  const auto scratch = [&](const plan::Layout& x) {
    std::vector<double> s;
    for (const auto& m : plan::memory_per_stage(cfg, 4096, x)) s.push_back(m.scratch);
    return s;
  };
  const auto bf16 = scratch(l);
  plan::Layout f = l;
  f.fp8 = true;
  // An FP8 tensor: its codes (N I, a multiple of 256 bytes) and 256 bytes each for the amax,
  // the scale and its inverse; besides the workspace, the 2 floats of the amaxes the MLP
  // activation's backward sets (GptT::fused_grad_amax) and the weights' kept scales
  // (GptT::fp8_weight_scale: 7 slots of 16 floats a block).
  const double tile = 4096.0 * 14336 + 3 * 256, grad_amax = 2 * 4, weight_scales = 4 * 7 * 64;
  REQUIRE(scratch(f)[0] - bf16[0] ==
          Approx(3 * tile + 4096.0 * 14336 + grad_amax + weight_scales).epsilon(1e-12));
  model::ModelLayout ml;
  ml.fp8.enabled = true;
  REQUIRE(scratch(f)[0] - bf16[0] ==
          double(model::fp8_workspace_bytes(cfg, 1, 4096, ml, 1, 2)) + grad_amax + weight_scales);
  // Each pipeline stage counts its own blocks: with the first and last block in bf16 both
  // stages (two blocks each: a small vocabulary keeps the embedding and head out of the
  // balance) still hold one FP8 block of the same shape (and slots for every block's weight
  // scales, indexed by the global block); with two of each, none.
  cfg.vocab_size = 256;
  f.pp = l.pp = 2;
  f.fp8_first_last_bf16 = 1;
  const auto pp_bf16 = scratch(l), pp_fp8 = scratch(f);
  REQUIRE(pp_fp8.size() == 2);
  for (std::size_t s = 0; s < 2; ++s)
    REQUIRE(pp_fp8[s] - pp_bf16[s] ==
            Approx(3 * tile + 4096.0 * 14336 + grad_amax + weight_scales).epsilon(1e-12));
  f.fp8_first_last_bf16 = 2;
  REQUIRE(scratch(f) == pp_bf16);
  // Rowwise adds the packed copies of strided and transposed operands: more than tensorwise.
  f.pp = l.pp = 1;
  f.fp8_first_last_bf16 = 0;
  plan::Layout r = f;
  r.fp8_rowwise = true;
  REQUIRE(scratch(r)[0] > scratch(f)[0]);
  REQUIRE(r.name().find("fp8 linears (rowwise)") != std::string::npos);
}

TEST_CASE("FP8 blocks' kept inputs bring the 8B shape's memory below bf16's", "[plan][memory][fp8]") {
  // Issue 35's memory target at its shape (Llama 3.1 8B cut to 4 blocks, seq 4096, mb 1, one
  // GPU): FP8 no higher than bf16. The casts' workspace adds about 235 MB (the case above); each
  // block keeps ln1, ln2 ([N, C]) and the SwiGLU output ([N, I]) as E4M3 transposes (codes and
  // three 256-byte scalars) instead of bf16: about 92 MB a block less.
  model::GptConfig cfg = llama8b_4_blocks();
  plan::Layout l;
  l.precision = plan::Precision::bf16;
  plan::Layout f = l;
  f.fp8 = true;
  const auto mem = [&](const plan::Layout& x) { return plan::memory_per_stage(cfg, 4096, x)[0]; };
  const plan::MemoryBreakdown b = mem(l), q = mem(f);
  const double N = 4096, C = 4096, I = 14336;
  const auto kept = [&](double width) { return N * width + 3 * 256; };
  const double per_block = 2 * (2 * N * C - kept(C)) + (2 * N * I - kept(I));
  REQUIRE(b.activations - q.activations == Approx(4 * per_block).epsilon(1e-12));
  INFO("bf16 " << b.total() / (1 << 30) << " GiB, fp8 " << q.total() / (1 << 30) << " GiB");
  REQUIRE(q.total() < b.total());
  // Not kept under full recomputation (nothing is kept between forward and backward), nor
  // with the weight gradients in bf16 (that GEMM reads the input unquantized): there FP8 adds
  // its workspace.
  f.recompute = l.recompute = true;
  REQUIRE(mem(f).activations == mem(l).activations);
  f.recompute = l.recompute = false;
  f.fp8_wgrad_bf16 = true;
  REQUIRE(mem(f).activations == b.activations);
  REQUIRE(mem(f).total() > b.total());
}

namespace {

// One GEMM point (every shape at 100 TFLOP/s), FP8 GEMMs twice as fast, casts at 100 GB/s: the
// FP8 terms by hand.
plan::Calibration flat_gpu() {
  plan::Calibration c;
  c.device = "gpu";
  c.precision = "bf16";
  c.gemm = {{1024, 1024, 1024, 100}};
  c.fp8_speedup_tensorwise = 2;
  c.elementwise_gbs = 100;
  return c;
}

// llama-tiny (4 blocks, C 128, 4 query and 2 kv heads of 32, SwiGLU of 352), seq 64, mb 2:
// N = 128 rows. A block's linears hold W = 128 x (128 + 2 x 64) + 128 x 128 + 128 x 704 +
// 352 x 128 = 184320 weights: 6 N W = 141557760 FLOPs forward, input and weight gradients,
// 1.4155776 us at 100 TFLOP/s, half that in FP8.
constexpr double kTinyBlockGemm = 6.0 * 128 * 184320 / 100e12;

plan::Layout tiny_layout(bool fp8) {
  plan::Layout l;
  l.precision = plan::Precision::bf16;
  l.micro_batch = 2;
  l.fp8 = fp8;
  return l;
}

}  // namespace

TEST_CASE("FP8 step time: the FP8 blocks' GEMMs at the FP8 rate, plus their casts' traffic",
          "[plan][fp8]") {
  const auto cal = flat_gpu();
  const auto cfg = model::preset("llama-tiny");
  const auto b = plan::step_cost(cfg, 64, tiny_layout(false), node(1), cal);
  const auto f = plan::step_cost(cfg, 64, tiny_layout(true), node(1), cal);
  REQUIRE(b.fp8_gemm_s == 0);
  REQUIRE(b.fp8_cast_s == 0);
  // Every block in FP8: the blocks' linears at half their bf16 time; the head's GEMMs stay.
  REQUIRE(f.fp8_gemm_s == Approx(4 * kTinyBlockGemm / 2).epsilon(1e-12));
  REQUIRE(f.gemm_s == Approx(b.gemm_s - 4 * kTinyBlockGemm + 4 * kTinyBlockGemm / 2)
                          .epsilon(1e-12));
  // Casts per block (tensorwise; ln1, ln2 and the SwiGLU output kept as FP8 transposes, their
  // amax from the kernel that wrote them; E = 2 bytes):
  //   forward  W 5 + attention output (N x 128) 5 + norms (2 N x 128) 4 + SwiGLU (N x 352) 4
  //            = 921600 + 81920 + 131072 + 180224 = 1314816 bytes
  //   backward W 3 (the forward's scale kept: the cast alone) + output gradients
  //            (N x (256 + 128 + 704 + 128)) 6 + attention output 5, less gate|up's gradient
  //            (N x 704) 2: its amax comes from SwiGLU's backward
  //            = 552960 + 933888 + 81920 - 180224 = 1388544 bytes
  // 2703360 bytes a block at 100 GB/s.
  REQUIRE(f.fp8_cast_s == Approx(4 * 2703360.0 / 100e9).epsilon(1e-12));
  REQUIRE(f.compute_s == Approx(b.compute_s - (b.gemm_s - f.gemm_s) + f.fp8_cast_s)
                             .epsilon(1e-12));
  REQUIRE(f.attention_s == b.attention_s);
  REQUIRE(f.membound_s == b.membound_s);
  // The default ratio (h200.json's kind of file): the measured 1.68.
  auto measured = cal;
  measured.fp8_speedup_tensorwise = 0;
  REQUIRE(plan::step_cost(cfg, 64, tiny_layout(true), node(1), measured).fp8_gemm_s ==
          Approx(4 * kTinyBlockGemm / 1.68).epsilon(1e-12));
}

TEST_CASE("FP8 step time: bf16 weight gradients and bf16 first/last blocks move their FLOPs "
          "back to the bf16 rate", "[plan][fp8]") {
  const auto cal = flat_gpu();
  const auto cfg = model::preset("llama-tiny");
  const auto b = plan::step_cost(cfg, 64, tiny_layout(false), node(1), cal);
  // fp8.wgrad_bf16: a third of each FP8 block's linear FLOPs (the weight gradients) at the bf16
  // rate; the casts lose the gradients' second orientation and the inputs' transposes, and
  // keep no inputs: forward W 5 + (norms + SwiGLU + attention output) 5 = 1392640, backward
  // W 3 + output gradients 5 - gate|up's 2 = 1150976 bytes a block.
  auto wl = tiny_layout(true);
  wl.fp8_wgrad_bf16 = true;
  const auto w = plan::step_cost(cfg, 64, wl, node(1), cal);
  REQUIRE(w.fp8_gemm_s == Approx(4 * (2.0 / 3) * kTinyBlockGemm / 2).epsilon(1e-12));
  REQUIRE(w.gemm_s == Approx(b.gemm_s - 4 * (2.0 / 3) * kTinyBlockGemm / 2).epsilon(1e-12));
  REQUIRE(w.fp8_cast_s == Approx(4 * (1392640.0 + 1150976.0) / 100e9).epsilon(1e-12));
  // train.recompute_mlp_act: the SwiGLU output (N x 352) is not kept: cast in the forward at
  // 5 bytes an element (not 4) and its transpose again in the backward (5).
  auto ra = tiny_layout(true);
  ra.recompute_mlp_act = true;
  REQUIRE(plan::step_cost(cfg, 64, ra, node(1), cal).fp8_cast_s ==
          Approx(4 * (2703360.0 + 128 * 352 * 6) / 100e9).epsilon(1e-12));
  // Rowwise (the measured 1.54 by default): no kept inputs, no two orientations from one
  // pass, no amax from another kernel or from the forward (W^T's rows are not W's), operands
  // read along their other dimension transposed first (4 bytes more an element): forward W 5 +
  // inputs (94208) 5; backward W (5 + 4) + gradients (155648) 5 + their q/k/v and gate/up
  // column blocks copied out (122880) 4, then G^T and X^T (4 + 5) and the column blocks again:
  // 1392640 + 5668864 bytes a block.
  auto rl = tiny_layout(true);
  rl.fp8_rowwise = true;
  const auto rw = plan::step_cost(cfg, 64, rl, node(1), cal);
  REQUIRE(rw.fp8_gemm_s == Approx(4 * kTinyBlockGemm / 1.54).epsilon(1e-12));
  REQUIRE(rw.fp8_cast_s == Approx(4 * (1392640.0 + 5668864.0) / 100e9).epsilon(1e-12));
  // fp8.first_last_bf16 = 1: blocks 1 and 2 in FP8, 0 and 3 at the bf16 rate without casts.
  auto fl = tiny_layout(true);
  fl.fp8_first_last_bf16 = 1;
  const auto h = plan::step_cost(cfg, 64, fl, node(1), cal);
  REQUIRE(h.fp8_gemm_s == Approx(2 * kTinyBlockGemm / 2).epsilon(1e-12));
  REQUIRE(h.gemm_s == Approx(b.gemm_s - 2 * kTinyBlockGemm / 2).epsilon(1e-12));
  REQUIRE(h.fp8_cast_s == Approx(2 * 2703360.0 / 100e9).epsilon(1e-12));
  // Under a pipeline the FP8 blocks are counted per stage: each stage holds two blocks, one of
  // them FP8; the parts are the slowest stage's, over its 4 micro-batches.
  fl.pp = 2;
  fl.n_micro = 4;
  const auto p = plan::step_cost(cfg, 64, fl, node(2), cal);
  REQUIRE(p.fp8_gemm_s == Approx(4 * kTinyBlockGemm / 2).epsilon(1e-12));
  REQUIRE(p.fp8_cast_s == Approx(4 * 2703360.0 / 100e9).epsilon(1e-12));
}

TEST_CASE("FP8 step time: with fp8.experts a MoE block's experts at the rowwise FP8 rate, "
          "their weight gradients at the bf16 rate", "[plan][fp8][moe]") {
  // llama-tiny with every block a MoE block (4 experts of 64, top-2): N = 128 rows; per block
  // the attention's weights Wa = 128 x 256 + 128 x 128 = 49152 (6 N Wa FLOPs at the tensorwise
  // FP8 rate, 2x), a token's expert weights We = 3 x 128 x (2 x 64) = 49152 (forward and input
  // gradient, 4 N We, at the rowwise rate: the measured 1.54 by default; the weight gradient,
  // 2 N We, at the bf16 rate).
  const auto cal = flat_gpu();
  auto cfg = model::preset("llama-tiny");
  cfg.moe.experts = 4;
  cfg.moe.top_k = 2;
  cfg.moe.ffn = 64;
  cfg.moe.layer_freq = 1;
  const auto b = plan::step_cost(cfg, 64, tiny_layout(false), node(1), cal);
  auto fl = tiny_layout(true);
  fl.fp8_experts = true;  // fp8.experts
  const auto f = plan::step_cost(cfg, 64, fl, node(1), cal);
  const double N = 128, Wa = 49152, We = 49152;
  // Without fp8.experts only the attention's linears are FP8.
  REQUIRE(plan::step_cost(cfg, 64, tiny_layout(true), node(1), cal).fp8_gemm_s ==
          Approx(4 * 6 * N * Wa / 2e14).epsilon(1e-12));
  const double fp8 = 4 * (6 * N * Wa / 2e14 + 4 * N * We / 1.54e14);
  REQUIRE(f.fp8_gemm_s == Approx(fp8).epsilon(1e-12));
  REQUIRE(b.gemm_s - f.gemm_s ==
          Approx(4 * (6 * N * Wa / 1e14 + 4 * N * We / 1e14) - fp8).epsilon(1e-9));
  // The experts' casts add to the attention's (rowwise, no kept inputs: more bytes than the
  // same MLP dense under the recipe would move).
  auto dense = cfg;
  dense.moe = {};
  dense.intermediate_size = 128;  // the same active MLP width, dense
  const auto d = plan::step_cost(dense, 64, fl, node(1), cal);
  REQUIRE(f.fp8_cast_s > d.fp8_cast_s);
}

TEST_CASE("FP8 step time on a GPU: the bias, bias-gradient and GELU passes that bf16 fuses "
          "into its GEMMs", "[plan][fp8]") {
  // The FP8 GEMMs take no epilogue. demo (GPT-2: 4 blocks, C 128, GELU over 512, biases on
  // every linear), seq 64, mb 2: N = 128 rows; the linears' outputs 3C + C + 4C + C = 1152
  // columns. Per FP8 block, E = 2 bytes:
  //   forward   the biases written into the outputs (the GEMM reads them as C in its epilogue):
  //             N x 1152 x E = 294912 bytes at the elementwise rate; GELU alone: N x 512 x 2E =
  //             262144 at GELU's
  //   backward  the bias gradients' column sums: N x 1152 x E = 294912; GELU's backward alone:
  //             N x 512 x 3E = 393216 at GELU's
  auto cal = flat_gpu();
  cal.gelu_gbs = 50;
  const auto cfg = model::preset("demo");
  const auto b = plan::step_cost(cfg, 64, tiny_layout(false), node(1), cal);
  const auto f = plan::step_cost(cfg, 64, tiny_layout(true), node(1), cal);
  const double per_block = (294912.0 + 294912.0) / 100e9 + (262144.0 + 393216.0) / 50e9;
  REQUIRE(f.membound_s - b.membound_s == Approx(4 * per_block).epsilon(1e-9));
  REQUIRE(f.compute_s == Approx(b.compute_s - (b.gemm_s - f.gemm_s) + f.fp8_cast_s +
                                4 * per_block).epsilon(1e-12));
  // Only the FP8 blocks: with the first and last in bf16, two of the four.
  auto fl = tiny_layout(true);
  fl.fp8_first_last_bf16 = 1;
  REQUIRE(plan::step_cost(cfg, 64, fl, node(1), cal).membound_s - b.membound_s ==
          Approx(2 * per_block).epsilon(1e-9));
  // Qwen2's q/k/v biases on a Llama block (q/k/v 128 + 2 x 64 = 256 columns; SwiGLU is a pass
  // of its own in both precisions): N x 256 x (E + E) = 131072 bytes a block.
  auto qwen = model::preset("llama-tiny");
  qwen.qkv_bias = true;
  const auto qb = plan::step_cost(qwen, 64, tiny_layout(false), node(1), cal);
  const auto qf = plan::step_cost(qwen, 64, tiny_layout(true), node(1), cal);
  REQUIRE(qf.membound_s - qb.membound_s == Approx(4 * 131072.0 / 100e9).epsilon(1e-9));
  // The host build fuses nothing: its bf16 step already has these passes, and FP8 adds none.
  auto host = cal;
  host.device = "cpu";
  REQUIRE(plan::step_cost(cfg, 64, tiny_layout(true), node(1), host).membound_s ==
          plan::step_cost(cfg, 64, tiny_layout(false), node(1), host).membound_s);
}

TEST_CASE("FP8 step time at GPT-2 1.5B: no faster than bf16, as measured", "[plan][fp8]") {
  // GPT-2 1.5B, seq 1024, mb 4, one GPU: measured on the H100 (2026-12-06, perf/archive/gpu-fp8/
  // h100_fp8_step_2026-12-06d_second_calls_gpt2xl.txt) fp8 102.84 ms against bf16 98.37: the
  // FP8 GEMMs saved 26.1 ms, the casts cost 15.9, and the bias fills, bias gradients and GELU
  // passes 14.8 against bf16's 2.8. Without those passes the plan had fp8 5 % faster.
  const auto cal = h200();
  const auto cfg = model::preset("gpt2-1.5b");
  plan::Layout l;
  l.precision = plan::Precision::bf16;
  l.micro_batch = 4;
  plan::Layout f = l;
  f.fp8 = true;
  const auto b = plan::step_cost(cfg, 1024, l, node(1), cal);
  const auto q = plan::step_cost(cfg, 1024, f, node(1), cal);
  INFO("bf16 " << b.step_s * 1e3 << " ms, fp8 " << q.step_s * 1e3 << " ms (GEMM " << q.gemm_s * 1e3
               << " against " << b.gemm_s * 1e3 << ", casts " << q.fp8_cast_s * 1e3
               << ", memory-bound " << q.membound_s * 1e3 << " against " << b.membound_s * 1e3
               << ")");
  REQUIRE(q.gemm_s < b.gemm_s);
  REQUIRE(q.step_s >= b.step_s);
}

TEST_CASE("FP8 step time: an fp8 layout without FP8 blocks times exactly as bf16", "[plan][fp8]") {
  // fp8.first_last_bf16 = 2 of 4 blocks leaves none in FP8: every part equal, to the bit, over
  // layouts that time blocks one by one (the DP bucket timeline, ZeRO-3's gathers, tp).
  const auto cfg = model::preset("llama-tiny");
  for (const auto& cal : {flat_gpu(), h200()})
    for (auto [dp, tp, pp, zero] : {std::tuple{1, 1, 1, 0}, std::tuple{2, 2, 1, 3},
                                    std::tuple{2, 1, 2, 1}, std::tuple{4, 2, 1, 2}}) {
      plan::Layout b = tiny_layout(false);
      b.dp = dp;
      b.tp = tp;
      b.pp = pp;
      b.zero_stage = zero;
      b.n_micro = 2 * pp;
      plan::Layout f = b;
      f.fp8 = true;
      f.fp8_first_last_bf16 = 2;
      const auto x = plan::step_cost(cfg, 64, b, node(dp * tp * pp), cal);
      const auto y = plan::step_cost(cfg, 64, f, node(dp * tp * pp), cal);
      INFO("dp " << dp << " tp " << tp << " pp " << pp << " ZeRO-" << zero);
      REQUIRE(y.step_s == x.step_s);
      REQUIRE(y.compute_s == x.compute_s);
      REQUIRE(y.gemm_s == x.gemm_s);
      REQUIRE(y.tp_comm_s == x.tp_comm_s);
      REQUIRE(y.dp_comm_s == x.dp_comm_s);
      REQUIRE(y.zero3_gather_s == x.zero3_gather_s);
      REQUIRE(y.fp8_gemm_s == 0);
      REQUIRE(y.fp8_cast_s == 0);
    }
}

TEST_CASE("FP8 step time at issue 35's 8B shape, and the plan's report of it", "[plan][fp8]") {
  // Llama 3.1 8B cut to 4 blocks, seq 4096, mb 1, one GPU (the shape of perf/gpu/fp8_step.sh).
  // The casts' traffic per block (N = C = 4096, q/k/v 6144, SwiGLU 14336, E = 2): W = 4096 x
  // 53248 weights, output gradients 4096 x 43008; forward W 5 + attention output 4096^2 5 +
  // norms 2 x 4096^2 4 + SwiGLU 4096 x 14336 4 = 1543503872 bytes, backward W 5 + gradients 6 +
  // attention output 5 - gate|up's 4096 x 28672 2 = 1996488704 bytes: 14.2 GB a step, at
  // h200.json's 1750 GB/s.
  const auto cal = h200();
  model::GptConfig cfg = llama8b_4_blocks();
  plan::Layout l;
  l.precision = plan::Precision::bf16;
  plan::Layout f = l;
  f.fp8 = true;
  const auto b = plan::step_cost(cfg, 4096, l, node(1), cal);
  const auto q = plan::step_cost(cfg, 4096, f, node(1), cal);
  INFO("bf16: step " << b.step_s * 1e3 << " ms, GEMM " << b.gemm_s * 1e3 << " ms; fp8: step "
                     << q.step_s * 1e3 << " ms, GEMM " << q.gemm_s * 1e3 << " ms (FP8 "
                     << q.fp8_gemm_s * 1e3 << "), casts " << q.fp8_cast_s * 1e3 << " ms");
  // Backward 1996488704 bytes a block before the weights kept their forward's scale, less
  // one read of the block's 218103808 bf16 weights.
  REQUIRE(q.fp8_cast_s == Approx(4 * (1543503872.0 + 1560281088.0) / 1750e9).epsilon(1e-12));
  // The head's GEMMs stay bf16; the blocks' run at 1.68x the rate of their (split) shapes.
  REQUIRE(q.fp8_gemm_s < q.gemm_s);
  REQUIRE(q.gemm_s < b.gemm_s);
  REQUIRE(q.step_s < b.step_s);
  // The report: the detail line and the JSON parts name the FP8 GEMMs and the casts.
  plan::SearchOptions o;
  o.cluster = node(1);
  plan::SearchResult r;
  plan::Candidate c{f, plan::peak_memory(cfg, 4096, f, {false, cal.runtime_bytes}), q, true};
  r.ranked = {c};
  const std::string table = plan::format_table(r, cfg, 4096, o, cal, 1);
  const char* want = "of which FP8 ";
  REQUIRE(table.find(want) != std::string::npos);
  REQUIRE(table.find(", FP8 casts ") != std::string::npos);
  const std::string json = plan::candidate_json(c, r);
  REQUIRE(json.find("\"fp8_gemm\"") != std::string::npos);
  REQUIRE(json.find("\"fp8_cast\"") != std::string::npos);
  c.layout = l;
  c.cost = b;
  r.ranked = {c};
  REQUIRE(plan::format_table(r, cfg, 4096, o, cal, 1).find(want) == std::string::npos);
  REQUIRE(plan::candidate_json(c, r).find("\"fp8_gemm\"") == std::string::npos);
}
