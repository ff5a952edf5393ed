// Step-time model (cost.hpp). Shapes are the ones GptT runs (gpt2_block.cpp, llama_block.cpp):
// per block four linears (q/k/v [C, QW + 2 KW], output projection [QW, C], the MLP's first
// [C, FW] and second [I/tp, C]; GPT-2: QW = KW = C/tp, FW = I/tp = 4C/tp; Llama: grouped kv
// heads KW = n_kv_head HS / tp (one head when replicated), SwiGLU's FW = 2 I/tp), causal
// attention over n_head/tp heads, two norms, GELU or SwiGLU, two residual adds; the head's
// logits [N, V/tp] and fused cross-entropy; N = micro_batch x seq_len rows (N/tp under SP for
// the norm/residual region). FP8 blocks (train.precision=fp8, model/fp8_recipe.hpp) run their
// linears' GEMMs at the calibration's FP8 rate, each piece (q, k, v; gate, up) its own GEMM as
// gpt_fp8.cpp runs them, and add their casts' memory traffic (fp8_casts.cpp) at the elementwise
// bandwidth and, on GPUs, the passes that bf16 fuses into its GEMMs' epilogues (bias, bias
// gradient, GELU).
#include "meshtrain/plan/cost.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "meshtrain/mesh/rank_math.hpp"
#include "meshtrain/model/fp8_recipe.hpp"
#include "meshtrain/model/grad_first_write.hpp"
#include "meshtrain/model/registry.hpp"
#include "meshtrain/parallel/dp_policy.hpp"
#include "meshtrain/parallel/partition.hpp"
#include "meshtrain/parallel/zero_partition.hpp"
#include "fp8_casts.hpp"
#include "stage_cache.hpp"

namespace meshtrain::plan {

namespace {

constexpr double kKernelsBlockFwd = 14, kKernelsBlockBwd = 22;  // launches per block
constexpr double kKernelsBlockFwdGpu = 7, kKernelsBlockBwdGpu = 18;  // with fused epilogues

double coll(const LinkClass& l, double factor, double bytes) {
  return l.alpha_us * 1e-6 + factor * bytes / (l.busbw_gbs * 1e9);
}
double all_reduce(const LinkClass& l, int n, double bytes) {
  return n <= 1 ? 0.0 : coll(l, 2.0 * (n - 1) / n, bytes);
}
double all_gather(const LinkClass& l, int n, double full_bytes) {  // also reduce-scatter
  return n <= 1 ? 0.0 : coll(l, double(n - 1) / n, full_bytes);
}

struct Shapes {
  double B, T, N, Nl, C, P, Vl, E;
  double Tg = 0;  // the whole sequence (T: this rank's rows of it, T = Tg / cp)
  bool sp;
  double QW = 0, KW = 0, FW = 0, I = 0;  // local widths (above)
  bool bias = true;                       // linears with biases
  bool qkv_bias = false;                  // biases on q, k and v only (Qwen2)
  bool llama = false;                     // Llama family: nn.Linear weights, q/k/v and gate/up
                                          // as separate pieces
};

struct Part {
  double gemm = 0, attn = 0, mem = 0, tp = 0, kernels = 0;  // seconds; kernel launches (count)
  double fp8 = 0;   // of gemm, the GEMMs at the FP8 rate
  double cast = 0;  // the FP8 casts
  double compute() const { return gemm + attn + mem + cast; }
  Part& operator+=(const Part& o) {
    gemm += o.gemm, attn += o.attn, mem += o.mem, tp += o.tp, kernels += o.kernels;
    fp8 += o.fp8, cast += o.cast;
    return *this;
  }
  Part times(double k) const {
    return {gemm * k, attn * k, mem * k, tp * k, kernels * k, fp8 * k, cast * k};
  }
};

double gemm(const Calibration& c, double m, double n, double k) {
  return 2.0 * m * n * k / (c.gemm_tflops(m, n, k) * 1e12);
}
double gemm_fp8(const Calibration& c, double m, double n, double k, bool rowwise) {
  return 2.0 * m * n * k / (c.fp8_gemm_tflops(m, n, k, rowwise) * 1e12);
}
double membound(double elems, double bytes_per_elem, double gbs) {
  return elems * bytes_per_elem / (gbs * 1e9);
}

// How a block runs its linears in FP8 (Fp8Recipe).
struct Fp8Block {
  bool mlp = true;  // the MLP's linears too, under `casting`
  // A MoE block's experts (and shared expert) as its MLP (mlp false): forward and input
  // gradient in FP8, always rowwise, the weight gradient in the model's type, no packed pieces
  // (moe/grouped_gemm.hpp's ExpertFp8).
  bool experts = false;
  detail::Fp8Casting casting;
};

// One transformer block, one micro-batch; fp8: its FP8 linears (null: none).
std::pair<Part, Part> block(const Shapes& s, const Calibration& c, const LinkClass& tpl,
                            const Fp8Block* fp8 = nullptr) {
  using KB = KernelBytes;
  const double N = s.N, Nl = s.Nl, C = s.C, P = s.P, E = s.E;
  const double lin[4][2] = {{C, s.QW + 2 * s.KW}, {s.QW, C}, {C, s.FW}, {s.I, C}};
  Part f, b;
  double oc_sum = 0, dw[4];
  for (int i = 0; i < 4; ++i) {
    const double ic = lin[i][0], oc = lin[i][1];
    oc_sum += oc;
    const bool expert = i >= 2 && fp8 != nullptr && fp8->experts;
    if (fp8 == nullptr || (i >= 2 && !fp8->mlp && !expert)) {
      f.gemm += gemm(c, N, oc, ic);
      dw[i] = gemm(c, ic, oc, N);
      b.gemm += gemm(c, N, ic, oc) + dw[i];
      continue;
    }
    // FP8: one GEMM per piece (gpt_fp8.cpp never merges them: each has its own weight scale);
    // the weight gradient at the bf16 rate under fp8.wgrad_bf16 (and for experts).
    const bool rw = expert || fp8->casting.rowwise;
    const bool wgrad16 = expert || fp8->casting.wgrad_bf16;
    const bool split = s.llama && (i == 0 || i == 2) && !expert;
    const std::vector<double> pieces = !split ? std::vector<double>{oc}
                                       : i == 0 ? std::vector<double>{s.QW, s.KW, s.KW}
                                                : std::vector<double>{oc / 2, oc / 2};
    dw[i] = 0;
    for (const double w : pieces) {
      const double fwd = gemm_fp8(c, N, w, ic, rw), dinp = gemm_fp8(c, N, ic, w, rw);
      const double dwt = wgrad16 ? gemm(c, ic, w, N) : gemm_fp8(c, ic, w, N, rw);
      f.gemm += fwd;
      f.fp8 += fwd;
      b.gemm += dinp + dwt;
      b.fp8 += dinp + (wgrad16 ? 0.0 : dwt);
      dw[i] += dwt;
    }
  }
  if (fp8 != nullptr) {
    const detail::Fp8BlockShape shape{N, C, s.QW, s.KW, s.FW, s.I, E, fp8->mlp, s.llama};
    detail::Fp8CastBytes bytes = detail::fp8_cast_bytes(shape, fp8->casting);
    if (fp8->experts) {
      // The experts' casts: those of an FP8 MLP under their casting (one whole w_in, as GPT-2's
      // c_fc), the block's with the MLP less the block's without.
      detail::Fp8Casting ec;
      ec.rowwise = ec.wgrad_bf16 = true;
      detail::Fp8BlockShape with = shape, without = shape;
      with.llama = without.llama = false;
      with.mlp = true;
      without.mlp = false;
      const detail::Fp8CastBytes a = detail::fp8_cast_bytes(with, ec);
      const detail::Fp8CastBytes z = detail::fp8_cast_bytes(without, ec);
      bytes.forward += a.forward - z.forward;
      bytes.backward += a.backward - z.backward;
    }
    f.cast = membound(bytes.forward, 1, c.elementwise_gbs);
    b.cast = membound(bytes.backward, 1, c.elementwise_gbs);
  }
  // Causal: half of 4 B H T^2 HS; under cp a rank's T rows see half of the Tg keys on average
  // (the balanced chunks), a cp-th of the whole.
  const double att = 2.0 * s.B * s.QW * s.T * s.Tg;
  f.attn = att / (c.attention_fwd_tflops * 1e12);
  b.attn = 2.5 * att / (c.attention_bwd_tflops * 1e12);
  if (c.device == "gpu") {
    // CUDA builds fuse bias, GELU (its input kept) and, at tp = 1, the residual adds into the
    // GEMMs, and the bias gradients into the weight-gradient GEMMs (kernels/gemm/gemm_lt.cpp,
    // gemm_ex.cpp). Under tp the reduced projection outputs are added to the residual
    // separately.
    // The calibration's GEMM points are timed with their epilogues (bench_train_step's
    // regions), so only the LayerNorms (and the tp residual adds) remain as separate passes.
    f.mem = membound(2 * Nl * C, KB::layernorm_fwd(E), c.layernorm_gbs) +
            (P > 1 ? membound(2 * Nl * C, KB::residual(E), c.elementwise_gbs) : 0.0);
    b.mem = membound(2 * Nl * C, KB::layernorm_bwd(E), c.layernorm_gbs);
    f.kernels = kKernelsBlockFwdGpu;
    b.kernels = kKernelsBlockBwdGpu;
    if (fp8 != nullptr) {
      // The FP8 GEMMs take no epilogue (gpt_fp8.cpp), so what bf16 fuses into its GEMMs is a
      // pass of its own there: a bias is written into the output first (the GEMM reads it back
      // as C in its epilogue, beside the math: not counted), its gradient is a column sum of the
      // output gradient, and GPT-2's GELU (with the amax of its output, and of its input
      // gradient) runs forward and backward alone.
      // On GPT-2 1.5B (H100, 2026-12-06) these were 14.8 ms of the FP8 step against bf16's
      // 2.8: with the casts, more than the FP8 GEMMs saved (fp8 0.957x bf16).
      double bias_cols = 0;
      for (int i = 0; i < 4; ++i)
        if ((i < 2 || fp8->mlp) && (s.bias || (i == 0 && s.qkv_bias))) bias_cols += lin[i][1];
      f.mem += membound(N * bias_cols, KB::bias_fwd(E), c.elementwise_gbs);
      b.mem += membound(N * bias_cols, KB::bias_bwd(E), c.elementwise_gbs);
      if (!s.llama && fp8->mlp) {
        f.mem += membound(N * s.FW, KB::gelu_fwd(E), c.gelu_gbs);
        b.mem += membound(N * s.FW, KB::gelu_bwd(E), c.gelu_gbs);
      }
    }
  } else {
    // The activation (GELU, or SwiGLU over its FW = 2 I inputs) as the GELU pass per input.
    f.mem = membound(2 * Nl * C, KB::layernorm_fwd(E), c.layernorm_gbs) +
            (s.bias ? membound(N * oc_sum, KB::bias_fwd(E), c.elementwise_gbs) : 0.0) +
            membound(N * s.FW, KB::gelu_fwd(E), c.gelu_gbs) +
            membound(2 * Nl * C, KB::residual(E), c.elementwise_gbs);
    b.mem = membound(2 * Nl * C, KB::layernorm_bwd(E), c.layernorm_gbs) +
            (s.bias ? membound(N * oc_sum, KB::bias_bwd(E), c.elementwise_gbs) : 0.0) +
            membound(N * s.FW, KB::gelu_bwd(E), c.gelu_gbs);
    f.kernels = kKernelsBlockFwd;
    b.kernels = kKernelsBlockBwd;
  }
  if (P > 1) {
    const int n = static_cast<int>(P);
    const double act = N * C * E;
    // Forward: two row-parallel reductions (SP: two gathers and two reduce-scatters).
    f.tp = s.sp ? 2 * (all_gather(tpl, n, act) + all_gather(tpl, n, act))
                : 2 * all_reduce(tpl, n, act);
    // Backward: the column-parallel input gradients (c_fc, c_attn) reduce while the weight
    // gradient GEMM of the same linear runs; SP adds the gathers of the residual gradient and
    // the LayerNorm parameter-gradient sums.
    const double red = s.sp ? all_gather(tpl, n, act) : all_reduce(tpl, n, act);
    b.tp = std::max(0.0, red - dw[2]) + std::max(0.0, red - dw[0]);
    if (s.sp) b.tp += 2 * all_gather(tpl, n, act) + 4 * all_reduce(tpl, n, C * E);
  }
  return {f, b};
}

// Head (final LayerNorm, logits, cross-entropy and, fused into the forward, their backward).
Part head(const Shapes& s, const Calibration& c, const LinkClass& tpl) {
  using KB = KernelBytes;
  const double N = s.N, Nl = s.Nl, C = s.C, Vl = s.Vl, E = s.E;
  Part h;
  const double dw = gemm(c, Vl, C, N);
  h.gemm = gemm(c, N, Vl, C) + gemm(c, N, C, Vl) + dw;
  h.mem = membound(N * Vl, KB::cross_entropy(E), c.cross_entropy_gbs) +
          membound(Nl * C, KB::layernorm_fwd(E) + KB::layernorm_bwd(E), c.layernorm_gbs);
  h.kernels = 10;
  if (s.P > 1) {
    const int n = static_cast<int>(s.P);
    h.tp = all_reduce(tpl, n, N * 4) + all_reduce(tpl, n, 2 * N * 4) +
           std::max(0.0, all_reduce(tpl, n, N * C * E) - dw);
    if (s.sp) h.tp += all_gather(tpl, n, N * C * E);
  }
  return h;
}

Part embedding(const Shapes& s, const Calibration& c, const LinkClass& tpl) {
  Part e;
  e.mem = membound(s.N * s.C, 3 * s.E, c.elementwise_gbs);  // forward; backward the same
  e.kernels = 4;
  if (s.P > 1) e.tp = all_reduce(tpl, static_cast<int>(s.P), s.N * s.C * s.E);
  return e;
}

bool crosses_nodes(const Layout& l, mesh::Axis axis, int G) {
  mesh::Shape shape{l.dp, l.pp, l.tp};
  shape.cp = l.cp;
  const mesh::Order order;  // tp-dp-pp: the default of mesh.order
  for (int r : {0, static_cast<int>(l.world()) - 1}) {
    const auto g = mesh::group_along(r, axis, shape, order);
    for (int x : g)
      if (x / G != g.front() / G) return true;
  }
  return false;
}

// Exposed and total time of bucketed collectives launched as backward completes units: bucket
// b is ready when its first unit's backward ends (units run in reverse), collectives run one
// after another; what outlasts the backward is exposed, scaled by how much overlap the
// transport achieves (MPI progresses only inside MPI calls).
std::pair<double, double> bucket_timeline(const std::vector<double>& ready,
                                          const std::vector<double>& cost, double bwd_end,
                                          double overlap) {
  double end = 0, total = 0;
  for (std::size_t b = 0; b < cost.size(); ++b) {
    end = std::max(end, ready[b]) + cost[b];
    total += cost[b];
  }
  const double timeline = std::max(0.0, end - bwd_end);
  return {overlap * timeline + (1 - overlap) * total, total};
}

}  // namespace

Placement placement(const Layout& l, int G) {
  Placement p;
  G = std::max(G, 1);
  p.tp_inter = crosses_nodes(l, mesh::Axis::tp, G);
  p.dp_inter = crosses_nodes(l, mesh::Axis::dp, G);
  p.pp_inter = crosses_nodes(l, mesh::Axis::pp, G);
  p.cp_inter = crosses_nodes(l, mesh::Axis::cp, G);
  return p;
}

StepCost step_cost(const model::GptConfig& cfg, int seq_len, const Layout& l,
                   const Cluster& cluster, const Calibration& cal) {
  using KB = KernelBytes;
  const Placement pl = placement(l, cluster.gpus_per_node);
  const LinkClass &tpl = pl.tp_inter ? cal.inter : cal.intra,
                  &dpl = pl.dp_inter ? cal.inter : cal.intra,
                  &ppl = pl.pp_inter ? cal.inter : cal.intra;
  const LinkClass& cpl = pl.cp_inter ? cal.inter : cal.intra;
  Shapes s;
  s.B = l.micro_batch;
  s.Tg = seq_len;
  s.T = double(seq_len) / l.cp;
  s.N = s.B * s.T;
  s.P = l.tp;
  s.sp = l.sequence_parallel && l.tp > 1;
  s.Nl = s.sp ? s.N / s.P : s.N;
  s.C = cfg.n_embd;
  s.Vl = double(cfg.padded_vocab()) / l.tp;
  {
    const double HS = cfg.head_size(), KV = cfg.kv_heads();
    s.QW = cfg.n_head * HS / l.tp;
    s.KW = (KV < l.tp ? 1.0 : KV / l.tp) * HS;  // replicated kv: the one head of a rank's group
    s.I = double(cfg.mlp_width()) / l.tp;
    s.bias = cfg.bias;
    s.qkv_bias = cfg.qkv_bias;
    s.llama = !cfg.is_gpt2();
  }
  s.E = static_cast<double>(compute_bytes(l.precision));
  // MoE blocks: every tp rank runs top_k experts per token (and the shared expert) whole.
  const double moe_w = double(cfg.moe.top_k) * cfg.expert_width() + cfg.moe.shared_ffn;
  const auto with_mlp = [&](double I) {
    Shapes x = s;
    x.I = I;
    x.FW = cfg.mlp == model::Mlp::swiglu ? 2 * I : I;
    return x;
  };
  const Shapes dense = with_mlp(s.I);
  if (cfg.moe.enabled()) {
    // An average block's MLP width over the dense and MoE blocks (the router, the permutation
    // and uneven expert loads are left out).
    const double Lm = cfg.n_moe_layers(), L = cfg.n_layer;
    s = with_mlp(((L - Lm) * s.I + Lm * moe_w) / L);
  } else {
    s = dense;
  }
  const int m = l.n_micro, v = l.virtual_chunks, dp = l.dp * l.cp;  // dp: the replicas
  const std::pair<Part, Part> base = block(s, cal, tpl);
  const Part &bf = base.first, &bb = base.second;
  // FP8 blocks (Fp8Recipe::fp8_block) at their own MLP width: a dense block runs its four
  // linears in FP8, a MoE block its attention's under the recipe and, with fp8.experts, its
  // experts' as FP8 experts (Fp8Block::experts); the blocks in the model's type keep the
  // average block.
  model::Fp8Recipe recipe;
  recipe.enabled = l.fp8;
  recipe.scaling = l.fp8_rowwise ? kernels::Fp8Scaling::rowwise : kernels::Fp8Scaling::tensorwise;
  recipe.wgrad_bf16 = l.fp8_wgrad_bf16;
  recipe.first_last_bf16 = l.fp8_first_last_bf16;
  std::pair<Part, Part> fp8_dense, fp8_moe;
  if (l.fp8) {
    Fp8Block fb;
    fb.casting.rowwise = l.fp8_rowwise;
    fb.casting.wgrad_bf16 = l.fp8_wgrad_bf16;
    // The same for every FP8 block: block first_last_bf16 is the first of them.
    fb.casting.keeps_inputs = recipe.keeps_inputs(l.fp8_first_last_bf16, cfg.n_layer, l.recompute);
    fb.casting.grad_amax_fused = recipe.fuses_grad_amax(l.fp8_first_last_bf16, cfg.n_layer);
    fb.casting.weight_scale_kept = recipe.keeps_weight_scale(l.fp8_first_last_bf16, cfg.n_layer);
    fb.casting.mlp_act_shared = l.recompute_mlp_act;
    fb.casting.norm_amax_fused = !s.sp;
    fp8_dense = block(dense, cal, tpl, &fb);
    fb.mlp = false;
    fb.experts = l.fp8_experts;
    if (cfg.moe.enabled()) fp8_moe = block(with_mlp(moe_w), cal, tpl, &fb);
  }
  const auto block_at = [&](int layer) -> const std::pair<Part, Part>& {
    if (!recipe.fp8_block(layer, cfg.n_layer)) return base;
    return cfg.moe.is_moe_layer(layer) ? fp8_moe : fp8_dense;
  };
  const Part hd = head(s, cal, tpl), em = embedding(s, cal, tpl);
  // Context parallelism, per block and micro-batch: the ring passes cp - 1 blocks of keys and
  // values (the kv heads only) forward, and backward again with their fp32 gradients plus the
  // gradients' last hop home; each hop overlaps the attention block computed meanwhile, so what
  // outlasts it is exposed. all_gather gathers them (and reduce-scatters the gradients) at once,
  // before the attention: all exposed.
  double cp_f = 0, cp_b = 0, cp_total = 0;
  if (l.cp > 1) {
    const double kv = s.B * s.T * 2 * s.KW * s.E, dkv = s.B * s.T * 2 * s.KW * 4;
    if (l.cp_all_gather) {
      cp_f = all_gather(cpl, l.cp, kv * l.cp);
      cp_b = all_gather(cpl, l.cp, kv * l.cp) + all_gather(cpl, l.cp, dkv * l.cp);
      cp_total = cp_f + cp_b;
    } else {
      const double hop_f = coll(cpl, 1.0, kv), hop_b = coll(cpl, 1.0, kv + dkv);
      const double step_f = bf.attn / l.cp, step_b = bb.attn / l.cp;  // one block's compute
      cp_f = (l.cp - 1) * std::max(0.0, hop_f - step_f);
      cp_b = (l.cp - 1) * std::max(0.0, hop_b - step_b) + coll(cpl, 1.0, dkv);
      cp_total = (l.cp - 1) * (hop_f + hop_b) + coll(cpl, 1.0, dkv);
    }
  }

  const auto& pieces = detail::cached_pieces(cfg, seq_len, l);
  StepCost out;
  double worst_mb = -1, node_work = 0;
  for (int st = 0; st < l.pp; ++st) {
    const auto chunks = parallel::stage_chunks(pieces, l.pp, st);
    const bool embed = st == 0, has_head = st == l.pp - 1;
    double nblocks = 0, fp8_dense_blocks = 0, fp8_moe_blocks = 0;
    for (const auto& c : chunks) {
      nblocks += c.last - c.first;
      for (int b = c.first; b < c.last; ++b)
        if (recipe.fp8_block(b, cfg.n_layer))
          (cfg.moe.is_moe_layer(b) ? fp8_moe_blocks : fp8_dense_blocks) += 1;
    }
    // One micro-batch through this stage's chunks: compute, exposed tp, kernel launches.
    const double bf16_blocks = nblocks - fp8_dense_blocks - fp8_moe_blocks;
    Part fwd = bf.times(bf16_blocks), bwd = bb.times(bf16_blocks);
    for (const auto& [kind, count] : {std::pair{&fp8_dense, fp8_dense_blocks},
                                      std::pair{&fp8_moe, fp8_moe_blocks}})
      if (count > 0) {
        fwd += kind->first.times(count);
        bwd += kind->second.times(count);
      }
    if (l.recompute) bwd += fwd;
    if (embed) {
      fwd += em;
      bwd.mem += em.mem;
    }
    if (has_head) fwd += hd;  // the head's backward runs inside its forward
    const double mb = fwd.compute() + bwd.compute() + fwd.tp + bwd.tp +
                      nblocks * (cp_f + cp_b) * (l.recompute ? 1.5 : 1.0);

    // ---- data parallelism and ZeRO ----
    const model::ParameterRegistry& reg = detail::cached_registry(cfg, seq_len, l, st);
    const double n = static_cast<double>(reg.size());
    parallel::DpOptions dopt;  // the buckets and shards GradSync builds
    dopt.zero_stage = l.zero_stage;
    dopt.bucket_bytes = l.bucket_bytes;
    const parallel::DpLayout dpl_layout =
        parallel::make_dp_layout(reg, compute_bytes(l.precision), dopt, dp, l.ep);
    const auto& buckets = dpl_layout.plan.buckets;
    const parallel::ZeroPartition& part = dpl_layout.partition;
    // Backward completion time of each unit in the last micro-batch (the head's backward runs
    // inside the forward, so its unit is ready first; blocks in reverse; the embedding last).
    const auto& units = reg.units();
    std::vector<double> done(units.size(), 0.0);
    {
      double t = 0;
      for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
        if (units[u].layer >= 0) {
          const auto& [f, b] = block_at(units[u].layer);
          t += b.compute() + b.tp + (l.recompute ? f.compute() + f.tp : 0);
        } else if (u == reg.embedding_unit() && embed) {
          t += em.mem;
        }
        done[u] = t;
      }
    }
    double dp_exposed = 0, dp_total = 0, gather_exposed = 0, cost_fill = 0;
    if (dp > 1) {
      std::vector<double> ready, cost;
      for (const auto& b : buckets) {
        ready.push_back(done[b.first_unit]);
        const auto& g = part.groups()[part.group_of(b.range.begin)];
        // g.ranks: dp, or the expert-data-parallel group of MoE experts (dp / ep)
        const double bytes = static_cast<double>(g.piece) * g.ranks * s.E;
        cost.push_back(l.zero_stage <= 1 ? all_reduce(dpl, g.ranks, bytes)
                                         : all_gather(dpl, g.ranks, bytes));
      }
      const auto [exp, tot] = bucket_timeline(ready, cost, bwd.compute() + bwd.tp, cal.dp_overlap);
      if (l.zero_stage <= 1) {
        dp_exposed = exp;
        dp_total = tot;
      } else {  // every micro-batch; earlier ones overlap the next micro-batch as well
        dp_exposed = exp + (m - 1) * std::max(0.0, tot - mb) * cal.dp_overlap +
                     (m - 1) * (1 - cal.dp_overlap) * tot;
        dp_total = m * tot;
      }
      if (l.zero_stage == 1 || l.zero_stage == 2) {  // updated parameters, blocking
        for (const auto& g : part.groups()) {
          const double c =
              all_gather(dpl, g.ranks, static_cast<double>(g.piece) * g.ranks * s.E);
          dp_exposed += c;
          dp_total += c;
        }
        cost_fill += membound(n, 2 * s.E, cal.memory_gbs);  // staging copies
      }
      if (l.zero_stage == 3) {
        // Each unit is gathered before its forward and again before its backward, the next
        // unit's gather overlapping this unit's compute. In backward the unit's reduce-scatter
        // shares the link with the next gather, so both must hide behind one unit's compute;
        // what does not is exposed (and replaces the bucket timeline above, which would count
        // the same reduce-scatters on a link of their own).
        double first = 0, exp_f = 0, exp_b = 0, total = 0;
        for (std::size_t u = 0; u < units.size(); ++u) {
          const auto& g = part.groups()[part.group_of(units[u].begin)];
          const double bytes = static_cast<double>(g.piece) * g.ranks * s.E;
          const double t = all_gather(dpl, g.ranks, bytes);  // a reduce-scatter costs the same
          total += 3 * t;
          if (u == 0) first = t;
          if (units[u].layer >= 0) {
            const auto& [f, b] = block_at(units[u].layer);
            exp_f += std::max(0.0, t - (f.compute() + f.tp));
            exp_b += std::max(0.0, 2 * t - (b.compute() + b.tp));
          }
        }
        const double per_mb = 3 * first + exp_f + exp_b;  // the first gathers, the last scatter
        gather_exposed = m * (cal.dp_overlap * per_mb + (1 - cal.dp_overlap) * total);
        dp_exposed = 0;
        dp_total = m * total;
      }
    }
    if (l.pp > 1 && cfg.tied_head && (embed || has_head)) {  // tied wte over the embedding group
      const double c = all_reduce(ppl, 2, s.Vl * s.C * s.E);
      dp_exposed += c;
      dp_total += c;
    }
    // ---- MoE all-to-alls: per MoE block and micro-batch the token rows out and back, forward
    // and backward (4 exchanges of N k rows of C), each rank keeping 1 / ep of them; blocking.
    double a2a = 0;
    if (cfg.moe.enabled() && l.ep > 1) {
      int moe_blocks = 0;
      for (const auto& u : units)
        if (u.group == model::ParamGroup::expert_dp) ++moe_blocks;
      const double rows_bytes = s.N * cfg.moe.top_k * s.C * s.E;
      a2a = m * moe_blocks * (4 * all_gather(dpl, l.ep, rows_bytes) * (l.recompute ? 1.5 : 1.0));
    }
    // ---- optimizer ----
    const double S = l.zero_stage >= 1 ? part.shard_size() : n;
    const bool master = s.E != 4 || l.offload;
    double opt = membound(S, s.E, cal.elementwise_gbs);  // sum of squares
    if (l.offload)
      opt += membound(S, KB::adamw(s.E, true), cal.host_adamw_gbs) +
             membound(S, 2 * s.E, cal.pcie_gbs);
    else
      opt += membound(S, KB::adamw(s.E, master), cal.adamw_gbs);
    opt += 3 * all_reduce(cal.intra, 2, 4);  // norm over dp and the model-parallel group
    // zero_grads / bucket fills: the gradient buffer (ZeRO 0/1) once, less the gradients that
    // their first GEMM of the step overwrites (model/grad_first_write.hpp), the buckets (ZeRO
    // 2/3) every micro-batch.
    const double zeroed =
        dpl_layout.plan.first_write ? double(model::GradFirstWrite(reg).zero_elems()) : n;
    cost_fill += l.zero_stage <= 1 ? membound(zeroed, s.E, cal.elementwise_gbs)
                                   : m * membound(n, 3 * s.E, cal.elementwise_gbs);
    opt += cost_fill;

    const double kernels = m * (fwd.kernels + bwd.kernels) + 10;
    const double overhead = cal.step_overhead_ms * 1e-3 + kernels * cal.kernel_overhead_us * 1e-6;
    // What this stage's ranks keep a core busy with (computing, copying messages): the work
    // that ranks sharing a node's cores divide among themselves.
    node_work += (m * mb + opt + overhead + dp_total) * l.dp * l.cp * l.tp;
    if (mb > worst_mb) {
      worst_mb = mb;
      out.compute_s = m * (fwd.compute() + bwd.compute());
      out.gemm_s = m * (fwd.gemm + bwd.gemm);
      out.fp8_gemm_s = m * (fwd.fp8 + bwd.fp8);
      out.fp8_cast_s = m * (fwd.cast + bwd.cast);
      out.attention_s = m * (fwd.attn + bwd.attn);
      out.membound_s = m * (fwd.mem + bwd.mem);
      out.tp_comm_s = m * (fwd.tp + bwd.tp);
      out.cp_comm_s = m * nblocks * (cp_f + cp_b) * (l.recompute ? 1.5 : 1.0);
      out.cp_comm_total_s = m * nblocks * cp_total * (l.recompute ? 1.5 : 1.0);
      out.optimizer_s = opt;
      out.overhead_s = overhead;
    }
    out.dp_comm_s = std::max(out.dp_comm_s, dp_exposed);
    out.dp_comm_total_s = std::max(out.dp_comm_total_s, dp_total);
    out.zero3_gather_s = std::max(out.zero3_gather_s, gather_exposed);
    out.moe_a2a_s = std::max(out.moe_a2a_s, a2a);
  }
  if (l.pp > 1) {
    out.pp_bubble_s = (l.pp - 1.0) / v * worst_mb;
    const double msg = coll(ppl, 1.0, s.Nl * s.C * s.E);
    out.pp_comm_s = 2 * (l.pp * v - 1) * msg + std::max(0.0, 2.0 * v * m * msg - m * worst_mb);
  }
  // Scale factors learnt from validation runs.
  const double sc = cal.scale_compute, sm = cal.scale_comm;
  out.compute_s *= sc;
  out.gemm_s *= sc;
  out.fp8_gemm_s *= sc;
  out.fp8_cast_s *= sc;
  out.attention_s *= sc;
  out.membound_s *= sc;
  out.optimizer_s *= sc;
  out.pp_bubble_s *= sc;
  out.tp_comm_s *= sm;
  out.pp_comm_s *= sm;
  out.dp_comm_s *= sm;
  out.dp_comm_total_s *= sm;
  out.zero3_gather_s *= sm;
  out.moe_a2a_s *= sm;
  out.cp_comm_s *= sm;
  out.cp_comm_total_s *= sm;
  const double critical = out.compute_s + out.tp_comm_s + out.pp_bubble_s + out.pp_comm_s +
                          out.dp_comm_s + out.zero3_gather_s + out.optimizer_s + out.overhead_s +
                          out.moe_a2a_s + out.cp_comm_s;
  // Ranks of one node slow each other down (shared memory bandwidth; on a CPU with fewer cores
  // than ranks, time-sharing) by the calibration's measured factor at the number of ranks busy
  // on average: the node's busy work over the step. Waiting ranks do not count: oversubscribed
  // Open MPI yields the core while it polls (measured: a 4-stage pipeline with one micro-batch
  // on 2 cores runs as fast as one rank).
  const long on_node = std::min<long>(l.world(), std::max(cluster.gpus_per_node, 1));
  const double busy = std::clamp(node_work * sc * static_cast<double>(on_node) / l.world() /
                                     critical, 1.0, static_cast<double>(on_node));
  out.step_s = critical * cal.slowdown(busy);
  out.contention = out.step_s / critical;
  const double tokens = static_cast<double>(l.global_batch()) * seq_len;
  out.tokens_per_s = tokens / out.step_s;
  if (cal.peak_tflops > 0)
    out.mfu = cfg.flops_per_token(seq_len) * out.tokens_per_s /
              (static_cast<double>(l.world()) * cal.peak_tflops * 1e12);
  const std::pair<double, const char*> parts[] = {
      {out.compute_s, "compute"},
      {out.tp_comm_s, "tp communication"},
      {out.pp_bubble_s, "pipeline bubble"},
      {out.pp_comm_s, "pipeline messages"},
      {out.dp_comm_s, "dp communication"},
      {out.zero3_gather_s, "ZeRO-3 gathers"},
      {out.moe_a2a_s, "MoE all-to-all"},
      {out.cp_comm_s, "context-parallel ring"},
      {out.optimizer_s, l.offload ? "optimizer (offloaded)" : "optimizer"},
      {out.overhead_s, "launch overhead"},
      {out.step_s - critical, "cores shared by ranks"}};
  double best = -1;
  for (const auto& [t, name] : parts)
    if (t > best) {
      best = t;
      out.bottleneck = name;
    }
  return out;
}

}  // namespace meshtrain::plan
