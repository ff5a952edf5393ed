// model_footprint: the bytes GptT's constructor (gpt.cpp) allocates, in the same integer
// arithmetic, so that the planner's prediction is exact up to the allocator's own rounding
// (test_plan_memory holds it to the measured allocations).
#include "meshtrain/model/gpt.hpp"

#include <algorithm>
#include <vector>

#include "meshtrain/kernels/linear_fp8.hpp"

namespace meshtrain::model {

namespace {

// BlockActivations: what one block keeps for backward for one micro-batch (widths as
// BlockShape: QW local query width, KW key-value width, FW the MLP's first output, HW its
// activation).
double block_activation_bytes(std::size_t B, std::size_t T, std::size_t N, std::size_t Nl,
                              std::size_t C, std::size_t NHl, std::size_t QW, std::size_t KW,
                              std::size_t FW, std::size_t HW, bool norm_mean, std::size_t E) {
  const std::size_t compute = N * C       // ln1 (gathered under SP)
                              + N * (QW + 2 * KW)  // qkv
                              + N * QW      // atty
                              + Nl * C      // res2
                              + N * C       // ln2
                              + N * FW + N * HW;  // fch, fch_gelu
  // ln1/ln2 rstd (and mean for LayerNorm), attention lse
  const std::size_t stats = (norm_mean ? 4 : 2) * Nl + B * NHl * T;
  return static_cast<double>(compute * E + stats * 4);
}

// An MoE block keeps its router state and the expert path's rows instead of fch / fch_gelu:
// M = N k rows (dropless, balanced: the expected size; the real one depends on the routing),
// xp, xr, xe, ye, yr, yp of C, the expert pre-activation (W) and activation (I); logits and
// scores [N, E] (fp64 with moe.router_fp64), four [N, k] choice tables; a shared expert's two.
double moe_state_bytes(const GptConfig& cfg, std::size_t N, std::size_t C, std::size_t E) {
  const auto& m = cfg.moe;
  const bool swiglu = cfg.mlp == Mlp::swiglu;
  const std::size_t I = cfg.expert_width(), W = swiglu ? 2 * I : I, k = m.top_k;
  const std::size_t M = N * k, S = m.shared_ffn, Ws = swiglu ? 2 * S : S;
  const double router = static_cast<double>(2 * N * m.experts * (m.router_fp64 ? 8 : 4) +
                                            4 * N * k * 4);
  return static_cast<double>((M * (6 * C + W + I) + N * (Ws + S)) * E) + router;
}

}  // namespace

// A chunk's logits at most this size. Each extra chunk re-reads and re-writes the head's weight
// gradient once (beta = 1), so the chunks should stay few; the time it costs against the memory
// it saves is measured in perf/archive/journal.md ("The LM head in chunks of rows").
constexpr std::size_t kHeadChunkLogitsBytes = std::size_t(256) << 20;

int head_chunk_rows(int requested, int rows, int vocab_local, std::size_t elem_bytes) {
  if (rows <= 0) return 1;
  if (requested > 0) return std::min(requested, rows);
  const std::size_t row_bytes = std::max<std::size_t>(1, vocab_local * elem_bytes);
  const std::size_t fit = std::max<std::size_t>(1, kHeadChunkLogitsBytes / row_bytes);
  const std::size_t n = static_cast<std::size_t>(rows);
  if (n <= fit) return rows;
  // The fewest chunks that fit, made equal; rounded up to whole GEMM tiles (128 rows) where
  // that still fits, which never adds a chunk.
  const std::size_t chunks = (n + fit - 1) / fit;
  const std::size_t per = (n + chunks - 1) / chunks;
  const std::size_t tiles = (per + 127) / 128 * 128;
  return static_cast<int>(tiles <= fit ? tiles : per);
}

ModelFootprint model_footprint(const GptConfig& cfg, int micro_batch, int seq_len,
                               const ModelLayout& layout, int tp_size, std::size_t E,
                               int cp_size) {
  const std::size_t P = static_cast<std::size_t>(tp_size), B = micro_batch, T = seq_len;
  const std::size_t C = cfg.n_embd, N = B * T;
  const bool sp = layout.sequence_parallel && P > 1;
  const std::size_t Nl = sp ? N / P : N;
  const std::size_t NHl = cfg.n_head / P, Vl = cfg.padded_vocab() / P;
  const std::size_t HS = cfg.head_size(), QW = NHl * HS, I = cfg.mlp_width() / P;
  const std::size_t KV = cfg.kv_heads(), KVl = KV < P ? 1 : KV / P;
  const bool swiglu = cfg.mlp == Mlp::swiglu, norm_mean = cfg.norm == Norm::layernorm;
  const std::size_t FW = swiglu ? 2 * I : I;
  const std::vector<LayerRange> chunks =
      layout.chunks.empty() ? std::vector<LayerRange>{{0, cfg.n_layer}} : layout.chunks;
  ModelFootprint f;

  // ---- activations: the slots of every chunk ----
  const std::size_t KW = KVl * HS;
  // recompute_mlp_act: one activation buffer for every dense block instead of one each.
  bool any_dense = false;
  for (const auto& ch : chunks)
    for (int l = ch.first; l < ch.last; ++l) any_dense = any_dense || !cfg.moe.is_moe_layer(l);
  const bool share_mlp_act = layout.recompute_mlp_act && !layout.recompute && any_dense;
  const double block = block_activation_bytes(B, T, N, Nl, C, NHl, QW, KW, FW,
                                              share_mlp_act ? 0 : I, norm_mean, E);
  if (share_mlp_act) f.activations += static_cast<double>(N * I * E);
  const double moe_block = cfg.moe.enabled()
      ? block_activation_bytes(B, T, N, Nl, C, NHl, QW, KW, 0, 0, norm_mean, E) +
            moe_state_bytes(cfg, N, C, E)
      : 0.0;
  // A block that keeps its linears' inputs as transposed FP8 casts (Fp8Recipe::keeps_inputs):
  // ln1, and in a dense block ln2 and the MLP activation where the block owns it, each a
  // kernels::fp8_kept_bytes allocation instead of [N, width] in the model's type.
  auto kept_delta = [&](int l, bool dense) {
    if (!layout.fp8.keeps_inputs(l, cfg.n_layer, layout.recompute)) return 0.0;
    const auto swap = [&](std::size_t width) {
      return static_cast<double>(kernels::fp8_kept_bytes(static_cast<int>(N),
                                                         static_cast<int>(width))) -
             static_cast<double>(N * width * E);
    };
    double d = swap(C);
    if (dense) d += swap(C) + (share_mlp_act ? 0.0 : swap(I));
    return d;
  };
  auto saved = [&](int first, int last) {  // the blocks' saved tensors
    double b = 0;
    for (int l = first; l < last; ++l) {
      const bool moe = cfg.moe.is_moe_layer(l);
      b += (moe ? moe_block : block) + kept_delta(l, !moe);
    }
    return b;
  };
  if (layout.recompute) f.activations += std::max(block, moe_block);  // one shared set
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const bool embed = c == 0 && layout.has_embedding;
    const bool head = c + 1 == chunks.size() && layout.has_head;
    const int slots = layout.chunk_slots.empty() ? layout.n_slots : layout.chunk_slots[c];
    const std::size_t nblocks = static_cast<std::size_t>(chunks[c].last - chunks[c].first);
    double per_slot = static_cast<double>(Nl * C * E);           // chunk input
    if (embed) per_slot += static_cast<double>(N * 4);           // tokens (the StepBatch's)
    per_slot += static_cast<double>(nblocks * Nl * C * E);       // block outputs
    if (!layout.recompute) per_slot += saved(chunks[c].first, chunks[c].last);
    if (head) per_slot += static_cast<double>(Nl * C * E);       // d(last block output)
    f.activations += per_slot * slots;
  }

  // ---- the head: ln_f output and statistics, one chunk's logits, losses (the targets are
  // read in place: parallel/step_batch.hpp) ----
  if (layout.has_head) {
    const std::size_t R = static_cast<std::size_t>(
        head_chunk_rows(layout.head_chunk_rows, static_cast<int>(N), static_cast<int>(Vl), E));
    f.head = static_cast<double>(N * C * E + 2 * Nl * 4 + R * Vl * E + N * 4);
    if (P > 1) f.head += static_cast<double>(N * 4 + 2 * N * 4);  // vocab-parallel CE
  }
  // ---- backward scratch: dres, dln, dqkv, datty, dfch (the GELU derivative is a GEMM
  // epilogue: no separate gradient of the GELU output; SwiGLU's is dh, and GPT-2's under FP8,
  // whose GELU derivative is a kernel of its own) ----
  f.scratch = static_cast<double>((Nl * C + N * C + N * (QW + 2 * KW) + N * QW + N * FW) * E);
  if (swiglu || layout.fp8.enabled) f.scratch += static_cast<double>(N * I * E);
  // The amaxes an FP8 MLP's activation backward sets (GptT::fused_grad_amax): 2 floats.
  bool fused_grad_amax = false;
  for (const auto& ch : chunks)
    for (int l = ch.first; l < ch.last; ++l)
      fused_grad_amax = fused_grad_amax || (!cfg.moe.is_moe_layer(l) &&
                                            layout.fp8.fuses_grad_amax(l, cfg.n_layer));
  if (fused_grad_amax) f.scratch += 2 * 4;
  // The FP8 weights' kept scales (GptT::fp8_weight_scale): a slot per block and weight.
  bool weight_scales = false;
  for (const auto& ch : chunks)
    for (int l = ch.first; l < ch.last; ++l)
      weight_scales = weight_scales || layout.fp8.keeps_weight_scale(l, cfg.n_layer);
  if (weight_scales)
    f.scratch += static_cast<double>(std::size_t(cfg.n_layer) * kFp8WeightSlots *
                                     kernels::kFp8WeightScaleFloats * 4);
  if (KV < P)  // replicated kv heads' weight (and Qwen2 bias) gradients before their tp sum
    f.scratch += static_cast<double>(2 * KV * HS * (C + (cfg.qkv_bias ? 1 : 0)) * E);
  if (cfg.positions == Positions::rotary) f.scratch += static_cast<double>(T * HS * 4);  // rope
  // row-parallel partial sums and their reduced local rows (before the residual add)
  if (P > 1) f.scratch += static_cast<double>((N * C + Nl * C) * E);
  if (sp) f.scratch += static_cast<double>((Nl * C + N * C + Nl * C + (norm_mean ? 2 : 1) * C) * E);
  f.scratch += 8;  // the loss sum: a rank-0 View, which Kokkos allocates in 8 bytes
  if (cp_size > 1) {  // the rows' positions and the ring's buffers
    f.scratch += static_cast<double>(T * 4);
    f.scratch += static_cast<double>(ring_attention_bytes(layout.cp_comm, cp_size, B, T, NHl, KVl,
                                                          HS, E));
  }
  if (layout.fp8.enabled)
    f.scratch += static_cast<double>(fp8_workspace_bytes(cfg, micro_batch, seq_len, layout,
                                                         tp_size, E) +
                                     expert_fp8_workspace_bytes(cfg, micro_batch, seq_len,
                                                                layout, E));
  if (cfg.moe.enabled()) {  // the MoE output and the backward's transient rows (one block)
    const std::size_t Ie = cfg.expert_width(), We = swiglu ? 2 * Ie : Ie;
    const std::size_t M = N * cfg.moe.top_k;
    f.scratch += static_cast<double>((N * C + M * (4 * C + We + Ie)) * E);
    if (cfg.moe.shared_ffn > 0) f.scratch += static_cast<double>(N * C * E);
    // A 16-bit model's fp32 router: its input and weight converted, and their gradients.
    const std::size_t experts = static_cast<std::size_t>(cfg.moe.experts);
    if (E < 4 && !cfg.moe.router_fp64)
      f.scratch += static_cast<double>(2 * (N * C + C * experts) * 4);
  }
  return f;
}

// The casts of gpt_fp8.cpp's parts as the blocks (llama_block.cpp, gpt2_block.cpp) call them,
// request by request: Fp8WorkspaceSizes mirrors each call's buffers.
std::size_t fp8_workspace_bytes(const GptConfig& cfg, int micro_batch, int seq_len,
                                const ModelLayout& layout, int tp_size, std::size_t E) {
  namespace k = meshtrain::kernels;
  const int P = tp_size, N = micro_batch * seq_len, C = cfg.n_embd;
  const int QW = cfg.n_head / P * cfg.head_size(), I = cfg.mlp_width() / P;
  const int KV = cfg.kv_heads(), KW = (KV < P ? 1 : KV / P) * cfg.head_size();
  const bool gpt2 = cfg.is_gpt2();
  k::Fp8LinearOptions o;
  o.scaling = layout.fp8.scaling;
  o.wgrad_high_precision = layout.fp8.wgrad_bf16;
  o.layout = gpt2 ? k::Fp8WeightLayout::in_out : k::Fp8WeightLayout::out_in;
  k::Fp8WorkspaceSizes w(E);
  struct Piece {
    int width;
  };
  // gpt_fp8.cpp's fp8_column_forward / fp8_row_forward / fp8_row_backward /
  // fp8_column_backward.
  auto column_forward = [&](const std::vector<Piece>& pieces) {
    o.slot = 0;
    w.input(N, C, o);
    for (const Piece& p : pieces) w.forward_weight(C, p.width, o);
  };
  auto row_forward = [&](int in_cols) {
    o.slot = 0;
    w.input(N, in_cols, o);
    w.forward_weight(in_cols, C, o);
  };
  auto row_backward = [&](int in_cols) {
    o.slot = 0;
    w.grad(N, C, C, o);
    w.dinp_weight(in_cols, C, o);
    if (o.wgrad_high_precision) return;
    w.input_t(N, in_cols, o);
    w.dweight_grad_t(N, C, C, o);
  };
  auto column_backward = [&](const std::vector<Piece>& pieces, int ld) {
    const bool tp = P > 1;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      o.slot = tp ? static_cast<int>(i) : 0;
      w.grad(N, pieces[i].width, ld, o);
      w.dinp_weight(C, pieces[i].width, o);
    }
    if (o.wgrad_high_precision) return;
    o.slot = 0;
    w.input_t(N, C, o);
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      o.slot = tp ? static_cast<int>(i) : 0;
      w.dweight_grad_t(N, pieces[i].width, ld, o);
    }
  };
  const std::vector<LayerRange> chunks =
      layout.chunks.empty() ? std::vector<LayerRange>{{0, cfg.n_layer}} : layout.chunks;
  for (const auto& ch : chunks)
    for (int l = ch.first; l < ch.last; ++l) {
      if (!layout.fp8.fp8_block(l, cfg.n_layer)) continue;
      const bool mlp = !cfg.moe.is_moe_layer(l);  // MoE experts stay in the model's type
      if (gpt2) {
        column_forward({{3 * C / P}});
        row_forward(C / P);
        column_backward({{3 * C / P}}, 3 * C / P);
        row_backward(C / P);
        if (mlp) {
          column_forward({{I}});
          row_forward(I);
          column_backward({{I}}, I);
          row_backward(I);
        }
      } else {
        column_forward({{QW}, {KW}, {KW}});
        row_forward(QW);
        column_backward({{QW}, {KW}, {KW}}, QW + 2 * KW);
        row_backward(QW);
        if (mlp) {
          column_forward({{I}, {I}});
          row_forward(I);
          column_backward({{I}, {I}}, 2 * I);
          row_backward(I);
        }
      }
    }
  return w.bytes();
}

// The calls of moe/grouped_gemm.cpp's FP8 path (ExpertFp8) at the most rows: the workspace keeps
// each buffer at its largest request, and every request grows with the rows.
std::size_t expert_fp8_workspace_bytes(const GptConfig& cfg, int micro_batch, int seq_len,
                                       const ModelLayout& layout, std::size_t E) {
  namespace k = meshtrain::kernels;
  bool any = false;
  for (const auto& ch : layout.chunks.empty() ? std::vector<LayerRange>{{0, cfg.n_layer}}
                                              : layout.chunks)
    for (int l = ch.first; l < ch.last; ++l)
      any = any || (cfg.moe.is_moe_layer(l) && layout.fp8.fp8_experts(l, cfg.n_layer));
  if (!any) return 0;
  k::Fp8LinearOptions o;
  o.scaling = k::Fp8Scaling::rowwise;
  o.layout = k::Fp8WeightLayout::in_out;
  o.wgrad_high_precision = true;
  o.rows_vary = true;
  k::Fp8WorkspaceSizes w(E);
  const bool swiglu = cfg.mlp == Mlp::swiglu;
  const int N = micro_batch * seq_len, C = cfg.n_embd;
  // One expert MLP of `rows` rows: x [rows, C] -> [rows, W] -> act [rows, I] -> [rows, C].
  const auto mlp = [&](int rows, int I) {
    const int W = swiglu ? 2 * I : I;
    w.input(rows, C, o);
    w.forward_weight(C, W, o);
    w.input(rows, I, o);
    w.forward_weight(I, C, o);
    w.grad(rows, C, C, o);
    w.dinp_weight(I, C, o);
    w.grad(rows, W, W, o);
    w.dinp_weight(C, W, o);
  };
  // An expert takes a token at most once (top_k distinct experts), from each rank of its ep group.
  const int ep = layout.ep != nullptr ? layout.ep->size() : 1;
  mlp(N * ep, cfg.expert_width());
  if (cfg.moe.shared_ffn > 0) mlp(N, cfg.moe.shared_ffn);
  return w.bytes();
}

}  // namespace meshtrain::model
