#pragma once
// The transformer of a block description (config.hpp). GPT-2: token + learned position
// embeddings, pre-LayerNorm blocks (causal multi-head attention, GELU MLP), final LayerNorm, LM
// head tied to the token embedding. Llama: token embedding, pre-RMSNorm blocks (causal attention
// with rotary q/k and grouped key-value heads, SwiGLU MLP), final RMSNorm, LM head tied or not.
//
// Parameters and gradients live in flat buffers laid out by the ParameterRegistry; each
// parameter is a slice of them. One object holds what this rank computes:
//  - pipeline parallelism: the blocks of one or more chunks (a stage, or the virtual chunks of an
//    interleaved schedule); the first stage embeds, the last holds ln_f, the LM head and the loss;
//    activations are kept per (chunk, slot) for the micro-batches in flight;
//  - tensor parallelism (Megatron): QKV and fc column-parallel, attention projection and MLP
//    projection row-parallel, heads split across the tp group, vocabulary-parallel embedding and
//    cross-entropy; optional sequence parallelism shards the LayerNorm/residual regions along the
//    tokens (all-gather / reduce-scatter replace the all-reduces). All tp communication happens
//    inside the model, through its TpRegion (tp_region.hpp): after a unit's backward its
//    gradients are complete on every tp rank.
// forward() of the head chunk computes the loss and, fused into it, the head's backward (the
// logits are not kept between forward and backward); backward() accumulates parameter gradients
// (so micro-batches accumulate). With activation checkpointing only each block's input is kept,
// and backward recomputes the block.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/view.hpp"
#include "meshtrain/kernels/rotary.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/fp8_recipe.hpp"
#include "meshtrain/model/grad_first_write.hpp"
#include "meshtrain/model/registry.hpp"
#include "meshtrain/model/ring_attention.hpp"
#include "meshtrain/model/tp_region.hpp"
#include "meshtrain/moe/grouped_gemm.hpp"

namespace meshtrain::model {

template <class T>
struct BlockActivations;  // gpt_activations.hpp
template <class T>
struct BlockTensors;      // gpt_activations.hpp
template <class T>
struct SlotActivations;   // gpt_activations.hpp
template <class T>
struct ChunkActivations;  // gpt_activations.hpp
template <class T>
struct MoeTensors;        // gpt_activations.hpp

// What the MoE blocks' routers saw since the last reset_moe_stats(), per block (training
// forwards only; recomputation not counted twice). Values are sums over router calls (one per
// micro-batch and MoE block); load is per expert, before capacity drops.
struct MoeLayerStats {
  int calls = 0;
  double aux = 0, z = 0;          // the losses (coefficients applied)
  double tokens = 0, dropped = 0; // routed tokens, (token, choice) pairs dropped by the capacity
  std::vector<double> load;       // [E] (token, choice) pairs routed to each expert
  double expert_seconds = 0;      // host time of the expert path (all-to-alls and expert GEMMs)
  double a2a_seconds = 0;         // of which in the all-to-alls (counts and tokens)
};

// What this rank holds of the model and whom it talks to.
struct ModelLayout {
  comm::Communicator* tp = nullptr;  // tensor-parallel group; null: tp = 1
  bool sequence_parallel = false;
  std::vector<LayerRange> chunks;    // layer ranges held, in order; empty: every block, one chunk
  bool has_embedding = true;         // chunk 0 begins with the embedding (first pipeline stage)
  bool has_head = true;              // the last chunk ends with ln_f, the LM head and the loss
  int n_slots = 1;                   // micro-batches whose activations are kept at once
  std::vector<int> chunk_slots;      // per chunk (pipelines); empty: n_slots for every chunk
  bool recompute = false;            // activation checkpointing per block
  // Keep only the dense MLP's first output (GELU's pre-activation, SwiGLU's gate and up) per
  // block: its activation (fch_gelu) is one buffer shared by every block, written by the
  // forward for the down projection and recomputed by the backward for its weight gradient
  // (train.recompute_mlp_act: N x I elements per block less, one elementwise pass more).
  bool recompute_mlp_act = false;
  // Rows of the LM head and loss computed at once (train.head_chunk_tokens): the head runs over
  // the micro-batch's rows in chunks, each chunk's logits turned into dlogits and consumed by its
  // two backward GEMMs before the next chunk, so only one chunk's logits are ever held. 0: auto
  // (head_chunk_rows()); >= the rows of a micro-batch: one chunk.
  int head_chunk_rows = 0;
  // train.precision=fp8: the blocks' linears in FP8 (fp8_recipe.hpp; gpt_fp8.cpp). T must be
  // float (host builds) or bf16.
  Fp8Recipe fp8;
  // Mixture of Experts: the expert-parallel group (ranks holding the other experts; null or size
  // 1: this rank holds all of them). The registry holds experts of rank ep->rank().
  comm::Communicator* ep = nullptr;
  // The ranks whose m-th micro-batches form, with this rank's, the global batch's m-th block of
  // sequences (the data-parallel group; the MoE router's balancing group under
  // moe.aux_loss_scope=global). Null: this rank alone.
  comm::Communicator* batch_group = nullptr;
  // Context parallelism: the cp group (null or size 1: none) and how attention crosses it. The
  // model's seq_len is then this rank's rows of each sequence, which sit at `positions`
  // (cp_positions: chunks r and 2cp-1-r); position embeddings and rotary angles use them.
  comm::Communicator* cp = nullptr;
  CpComm cp_comm = CpComm::ring;
  std::vector<int> positions;
  int pp_stage = 0;                  // recorded in the registry
  // false: the caller binds storage per unit (bind_unit) before use, e.g. ZeRO-3 gathering a
  // unit's parameters just in time, ZeRO-2 keeping gradients only for buckets in flight.
  bool allocate_params = true, allocate_grads = true;
};

// One linear of a column-parallel group whose outputs share a row-major buffer (Llama's packed
// q|k|v and gate|up): its weight (rows of the local slice), its weight gradient (null in the
// forward), its columns [col, col + width) of the buffer and its bias (or null).
//
// dout_amax (the FP8 backward, tensorwise; or empty): the amax of this piece's columns of the
// output gradient, already set by the kernel that wrote them (a fused amax), which the piece's
// cast takes instead of reading the columns for it.
template <class T>
struct LinearPiece {
  const T* w;
  T* dw;
  int col, width;
  const T* b = nullptr;
  View1<float> dout_amax = {};
  View1<float> w_scale = {};  // FP8: where w's scale is kept (GptT::fp8_weight_scale)
  // The weight-gradient GEMM's beta (grad_first_write.hpp): 0 where it is the first write of
  // dw this step. Set by the backward just before the GEMMs run.
  float dw_beta = 1.0f;
};

// Callbacks around each unit (registry().units()). DP gradient buckets and ZeRO implement them.
// before_backward(u) may be called more than once before after_backward(u) (the tied wte is
// written by the head and later by the embedding); after_backward(u) is called exactly once per
// micro-batch per unit, when the unit's gradients for that micro-batch are complete.
class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void before_forward(int /*unit*/) {}
  virtual void before_backward(int /*unit*/) {}
  virtual void after_backward(int /*unit*/) {}
};

// T is the compute type of parameters, activations and gradients: float (fp32 mode, the CPU
// build) or bf16 (mixed precision on GPUs, with fp32 master weights in the optimizer).
// Statistics (LayerNorm mean/rstd, attention lse, per-token losses) and MoE routers stay fp32.
template <class T>
class GptT {
 public:
  using value_type = T;
  GptT(const GptConfig& cfg, int micro_batch, int seq_len, bool recompute = false,
       ExecSpace exec = ExecSpace{});
  GptT(const GptConfig& cfg, int micro_batch, int seq_len, const ModelLayout& layout,
       ExecSpace exec = ExecSpace{});
  ~GptT();
  GptT(const GptT&) = delete;
  GptT& operator=(const GptT&) = delete;

  const GptConfig& config() const { return cfg_; }
  const ParameterRegistry& registry() const { return reg_; }
  int micro_batch() const { return B_; }
  int seq_len() const { return T_; }
  const ExecSpace& exec() const { return exec_; }

  const ModelLayout& layout() const { return layout_; }
  // Bytes the FP8 casts' workspace holds now (train.precision=fp8; fp8_workspace_bytes predicts
  // it once every FP8 block has run forward and backward).
  std::size_t fp8_workspace_bytes() const { return fp8_workspace_.bytes(); }
  // The FP8 experts' casts (their own workspace: an expert's rows change every step, so these
  // buffers are bounded, not predicted: expert_fp8_workspace_bytes).
  std::size_t expert_fp8_workspace_bytes() const { return expert_fp8_workspace_.bytes(); }
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  int n_chunks() const { return static_cast<int>(chunks_.size()); }
  const LayerRange& chunk(int c) const { return layout_.chunks[static_cast<std::size_t>(c)]; }
  int slots(int c) const;  // activation slots of chunk c
  // Elements of what crosses a pipeline stage boundary: local rows x n_embd (rows = B*T, or
  // B*T / tp with sequence parallelism).
  std::size_t activation_elems() const;
  // Bytes of activations this object keeps (all slots), for memory reports.
  std::size_t activation_bytes() const;

  // Full flat buffers (empty when the layout does not allocate them).
  View1<T> params() const { return params_; }
  View1<T> grads() const { return grads_; }
  View1<T> param(const std::string& name) const;
  View1<T> grad(const std::string& name) const;

  // Seconds spent in tensor-parallel communication since construction (host wall time).
  double tp_comm_seconds() const { return tp_.comm_seconds(); }

  void set_hooks(LayerHooks* hooks) { hooks_ = hooks; }
  // Storage of unit u (registry().units()[u]): views of units[u].size() elements laid out like
  // the flat buffer's range [begin, end). Either may be empty to keep the current binding.
  void bind_unit(int u, View1<T> params, View1<T> grads);

  // Initialisation from the counter-based RNG keyed by (seed, name, global index), by each
  // parameter's ParamInfo::init: weights N(0, 0.02), GPT-2's residual projections
  // N(0, 0.02 / sqrt(2 n_layer)), biases 0, norm weights 1; padding rows of the embedding and of
  // an untied head 0.
  void init_parameters(std::uint64_t seed);
  // The same values written into `flat` (registry layout), e.g. a temporary full buffer that
  // ZeRO-3 scatters into its shards when the model does not allocate its parameters.
  void init_parameters_into(std::uint64_t seed, View1<T> flat) const;
  // Use `other`'s parameter buffer (same configuration), e.g. a batch-1 model for sampling that
  // shares the weights of the training model instead of copying them.
  void share_parameters(const GptT& other);
  // Zero the whole gradient buffer; every gradient write then accumulates (disarms
  // grad_first_write()).
  void zero_grads();
  // Which gradients the weight-gradient GEMMs overwrite on their first write of a step
  // (grad_first_write.hpp). Data parallelism arms it at the begin of a ZeRO 0/1 step and zeroes
  // only the rest; unarmed (the default) every gradient write accumulates.
  GradFirstWrite& grad_first_write() { return first_write_; }
  const GradFirstWrite& grad_first_write() const { return first_write_; }

  // Forward of chunk c for the micro-batch held in activation slot `slot` (0 <= slot < n_slots).
  // tokens: the micro-batch's B*T input tokens; x_in: the chunk's input activation
  // (activation_elems()) unless the chunk starts with the embedding; targets and grad_scale are
  // used by the head chunk (train: loss and head backward; !train: loss only). Returns the
  // chunk's output activation (valid until this slot's next forward), empty for the head chunk.
  // The views are read in place, not copied: the tokens until this slot's backward (the wte
  // gradient), the targets during this call (parallel/step_batch.hpp keeps them so).
  View1<const T> forward(int c, int slot, View1<const std::int32_t> tokens, View1<const T> x_in,
                         View1<const std::int32_t> targets, float grad_scale, bool train = true);
  // Backward of chunk c for `slot`; dy = gradient of the chunk output (ignored by the head
  // chunk). Returns d(chunk input), empty for the embedding chunk; valid until the next backward.
  View1<const T> backward(int c, int slot, View1<const T> dy);

  // One training micro-batch (B*T tokens, device memory). grad_scale = 1 / (counted target
  // tokens of the whole global batch). Adds the sum of token losses to loss_sum().
  void forward_train(View1<const std::int32_t> inputs, View1<const std::int32_t> targets,
                     float grad_scale);
  // Gradients of the last forward_train, accumulated into grads().
  void backward();
  // Single-chunk helpers above, and the two below, use chunk 0 and slot 0.
  // Loss only (evaluation). Adds to loss_sum().
  void forward_eval(View1<const std::int32_t> inputs, View1<const std::int32_t> targets);
  // Logits [B*T, padded_vocab] for generation (inputs of B*T tokens; shorter prompts padded by
  // the caller). Needs the whole model on one rank (tp = 1, one chunk).
  View1<const T> forward_logits(View1<const std::int32_t> inputs);

  Scalar<float> loss_sum() const { return loss_sum_; }
  void reset_loss_sum();

  // Mixture of Experts: router statistics per global block (empty entries for dense blocks and
  // blocks of other ranks).
  const std::vector<MoeLayerStats>& moe_stats() const { return moe_stats_; }
  void reset_moe_stats();
  // The sigmoid router's expert bias (moe.expert_bias, DeepSeek-V3's auxiliary-loss-free
  // balancing) of global block l: [E] fp32, zero at the start, on every rank that holds the
  // block; empty for other blocks or without moe.expert_bias. It only chooses experts (no
  // gradient, not a parameter). The engine moves it after each optimizer step from the global
  // load of the step (update_expert_bias: the same on every rank) and checkpoints it.
  View1<float> expert_bias(int l) const { return moe_bias_[static_cast<std::size_t>(l)]; }
  void update_expert_bias(int l, const std::vector<double>& load, double rate);

 private:
  enum class Mode { train, eval, logits };
  View1<const T> run_forward(int c, int slot, View1<const std::int32_t> tokens,
                             View1<const T> x_in, View1<const std::int32_t> targets,
                             float grad_scale, Mode mode);
  void embedding_forward(SlotActivations<T>& s);
  void embedding_backward(SlotActivations<T>& s, View1<const T> dres);
  void head_forward(SlotActivations<T>& s, View1<const T> x, View1<const std::int32_t> targets,
                    float grad_scale, Mode mode);
  void block_forward(int l, View1<const T> x, BlockActivations<T>& a, View1<T> out);
  // An MoE block's MLP (moe_block.cpp): out (local rows) = res2 + moe(a.ln2) with a.ln2 the
  // full rows; backward: dx (local rows) = d(ln2) from dfull (full rows of d(out)).
  void moe_mlp_forward(int l, BlockActivations<T>& a, View1<const T> res2, View1<T> out);
  void moe_mlp_backward(int l, BlockActivations<T>& a, View1<const T> dfull, View1<T> dx);
  // Block l's experts (and shared expert) in FP8 where fp8.experts and the block is FP8
  // (moe/grouped_gemm.hpp).
  moe::ExpertFp8 expert_fp8(int l);
  void block_backward(int l, View1<const T> x, BlockActivations<T>& a, View1<T> dres);
  // The Llama block (llama_block.cpp): nn.Linear [out, in] weights, RMSNorm, rotary, GQA, SwiGLU.
  void llama_block_forward(int l, View1<const T> x, BlockActivations<T>& a, View1<T> out);
  void llama_block_backward(int l, View1<const T> x, BlockActivations<T>& a, View1<T> dres);
  // The parallel parts of a block (gpt_parallel.cpp), over the tp region tp_:
  // The block's norm (LayerNorm or RMSNorm) on Nl rows; mean is unused by RMSNorm. amax (FP8,
  // optional): the kernel also sets amax(0) to the max |out| (kernels/fp8_cast.hpp's amax).
  void norm_forward(View1<T> out, View1<float> mean, View1<float> rstd, View1<const T> x,
                    View1<const T> w, View1<const T> b, View1<float> amax = {});
  // The norm in front of a column-parallel linear: this rank's rows of x normalised, then every
  // row of them in `full`, the linear's input (all-gathered under sequence parallelism). amax
  // as norm_forward's: only without sequence parallelism, where the rank's rows are all of them.
  void norm_enter(View1<T> full, View1<float> mean, View1<float> rstd, View1<const T> x,
                  View1<const T> w, View1<const T> b, View1<float> amax = {});
  // The kept cast's amax for a norm in front of it (null kept, or sequence parallelism: none;
  // the cast then reduces it itself).
  View1<float> fused_amax(const kernels::Fp8Tensor* kept) const {
    return kept != nullptr && !tp_.sequence_parallel() ? kept->amax : View1<float>{};
  }
  // Norm backward (LayerNorm or RMSNorm; db empty for RMSNorm). The norm's parameters are
  // replicated over tp; under sequence parallelism each rank's gradients are partial sums over
  // its rows, summed over tp before they are added.
  void norm_backward(View1<T> dx, View1<T> dw, View1<T> db, View1<const T> dout, View1<const T> x,
                     View1<const T> w, View1<const float> mean, View1<const float> rstd);
  // Row-parallel linear plus the residual: out (local rows) = residual + reduce over tp of
  // inp @ weight (+ bias once). At tp = 1 one GEMM with the residual as its C operand.
  void row_parallel_forward(View1<T> out, View1<const T> inp, View1<const T> w,
                            View1<const T> b, int in_cols, View1<const T> residual);
  // The same with an nn.Linear weight: out = residual + reduce of inp [N, in_cols] @ w^T (w:
  // [C, in_cols]), no bias (llama_block.cpp).
  void row_parallel_forward_nt(View1<T> out, View1<const T> inp, View1<const T> w, int in_cols,
                               View1<const T> residual);
  // Column-parallel input gradient: dx (local rows, tp_.local_grad_rows(dln_)) = reduce over tp
  // of dout @ w^T, overlapped with the weight gradient of the same linear.
  void column_parallel_backward(View1<T> dx, View1<T> dw, View1<T> db, View1<const T> dout,
                                View1<const T> inp, View1<const T> w, int out_cols);
  // The FP8 linears (gpt_fp8.cpp), each the FP8 counterpart of a part above:
  bool fp8_block(int l) const { return layout_.fp8.fp8_block(l, cfg_.n_layer); }
  bool fp8_keeps_inputs(int l) const {
    return layout_.fp8.keeps_inputs(l, cfg_.n_layer, layout_.recompute);
  }
  kernels::Fp8LinearOptions fp8_options(TpSplit split, kernels::Fp8WeightLayout layout);
  // `kept` (a block's BlockActivations::*_t where fp8_keeps_inputs, else null): the forward
  // also writes the input's transposed cast there, and the backward's weight gradients read it
  // instead of the input (which may then be null).
  // Column-parallel linears reading one input (q, k, v; gate, up; or one piece), each into its
  // columns of out (row stride ld) with its bias (piece.b, or null): the input is cast once.
  // kept_amax_set: the producer of inp already set kept->amax (a fused amax: norm_enter's,
  // the activation kernels'), so the cast does not read inp for it.
  void fp8_column_forward(const LinearPiece<T>* pieces, int n, T* out, int ld, const T* inp,
                          kernels::Fp8WeightLayout layout, const kernels::Fp8Tensor* kept,
                          bool kept_amax_set = false);
  // Row-parallel linear plus the residual (row_parallel_forward's FP8 form; bias or null).
  // w_scale: where w's scale is kept (fp8_weight_scale), as LinearPiece::w_scale.
  void fp8_row_forward(View1<T> out, View1<const T> inp, const T* w, View1<float> w_scale,
                       const T* b, int in_cols, View1<const T> residual,
                       kernels::Fp8WeightLayout layout, const kernels::Fp8Tensor* kept,
                       bool kept_amax_set = false);
  // Row-parallel backward from every row of the output gradient: dinp [N, in_cols], dw += ,
  // db += column sums of dfull (db may be null).
  void fp8_row_backward(T* dinp, T* dw, T* db, View1<const T> dfull, const T* inp, const T* w,
                        View1<float> w_scale, int in_cols, kernels::Fp8WeightLayout layout,
                        const kernels::Fp8Tensor* kept);
  // column_parallel_backward's FP8 form over pieces of one packed output gradient (row stride
  // ld): dx = reduce over tp of the summed input gradients, overlapped with the weight
  // gradients; bias gradients are the caller's. A piece's dout_amax, where set, is its cast's
  // amax (agreed over tp and cp as the cast's own would be).
  void fp8_column_backward(View1<T> dx, const LinearPiece<T>* pieces, int n, const T* dout,
                           int ld, const T* inp, kernels::Fp8WeightLayout layout,
                           const kernels::Fp8Tensor* kept);
  kernels::Fp8Workspace fp8_workspace_;  // the casts' buffers, on exec_'s stream
  kernels::Fp8Workspace expert_fp8_workspace_;  // the FP8 experts' (moe_block.cpp)
  // Where Fp8Recipe::fuses_grad_amax(l): `count` amaxes (GELU's 1; SwiGLU's 2, gate and up)
  // for block l's MLP activation backward to set, the dout_amax of c_fc's (gate_proj's,
  // up_proj's) piece; empty elsewhere. One buffer serves every block: a block's casts have
  // read their amaxes (agreed them, made their scales) before the next block's backward
  // writes them, in stream order.
  View1<float> fused_grad_amax(int l, int count) const {
    if (!layout_.fp8.fuses_grad_amax(l, cfg_.n_layer)) return {};
    return slice(fp8_grad_amax_, 0, static_cast<std::size_t>(count));
  }
  View1<float> fp8_grad_amax_;  // [2] where a dense block fuses_grad_amax, else empty
  // Where Fp8Recipe::keeps_weight_scale(l): the slot of block l's weight `w` that its forward
  // cast writes and its backward cast reads (Fp8LinearOptions::weight_scale); empty elsewhere.
  // A slot per block and weight, not per micro-batch: the weights, and so their scales, are
  // the same for every micro-batch of a step.
  View1<float> fp8_weight_scale(int l, Fp8WeightSlot w) const {
    if (!layout_.fp8.keeps_weight_scale(l, cfg_.n_layer)) return {};
    return slice(fp8_weight_scales_,
                 (std::size_t(l) * kFp8WeightSlots + w) * kernels::kFp8WeightScaleFloats,
                 kernels::kFp8WeightScaleFloats);
  }
  View1<float> fp8_weight_scales_;  // n_layer x kFp8WeightSlots slots where any block keeps
  // Cross-entropy of the head's n rows from row r0 against `targets` (the caller's, not copied;
  // logits_ in place -> dlogits when train):
  // the fused single-rank kernel, or the vocabulary-parallel one whose row max and sums are
  // reduced over tp (gpt_head.cpp).
  void cross_entropy(View1<const std::int32_t> targets, int r0, int n, float grad_scale,
                     bool train);
  BlockActivations<T>& acts_for(ChunkActivations<T>& ca, SlotActivations<T>& s, int l);
  void bind_all();
  void hook_before_forward(int u) { if (hooks_) hooks_->before_forward(u); }
  void hook_before_backward(int u) { if (hooks_) hooks_->before_backward(u); }
  void hook_after_backward(int u) { if (hooks_) hooks_->after_backward(u); }
  // The beta of a weight-gradient GEMM about to write the n gradient elements at dw: 0 where
  // they are a whole first-written gradient not yet written this step, else 1 (accumulate).
  float grad_beta(const T* dw, std::size_t n);
  float grad_beta(const View1<T>& g) { return grad_beta(g.data(), g.span()); }
  // An accumulating producer (the embedding's scatter-add) is about to add into g: zero what
  // of it no GEMM has written yet this step.
  void before_accumulate(const View1<T>& g);
  View1<T> head_w() const { return cfg_.tied_head ? wte_ : lm_head_; }
  View1<T> dhead_w() const { return cfg_.tied_head ? dwte_ : dlm_head_; }

  GptConfig cfg_;
  int B_, T_;
  ModelLayout layout_;
  int tp_rank_ = 0, tp_size_ = 1;
  int N_ = 0, Nl_ = 0;          // rows of a micro-batch; local rows (N / tp with SP)
  int NHl_ = 0, Vl_ = 0, v0_ = 0;  // local heads, local vocabulary rows and the first of them
  int HS_ = 0, QW_ = 0, KW_ = 0;   // head size; local query and key-value widths (heads x HS)
  int NKVl_ = 0, kv0_ = 0;         // local key-value heads and the first (global) of them
  int Il_ = 0;                     // local MLP width
  ExecSpace exec_;
  ParameterRegistry reg_;
  GradFirstWrite first_write_;  // after reg_, from which it is built
  LayerHooks* hooks_ = nullptr;
  TpRegion<T> tp_;  // tensor and sequence parallelism's collectives and their scratch
  View1<T> params_, grads_;
  // Per-layer views of parameters / gradients (indexed by global layer; empty when not held).
  std::vector<BlockTensors<T>> block_params_, block_grads_;
  std::vector<MoeTensors<T>> moe_params_, moe_grads_;  // MoE blocks (router, experts)
  std::unique_ptr<comm::Communicator> self_;  // the router's group and ep when none is given
  View1<T> moe_y_, moe_dx_;   // [N, C]: the MoE output, a shared expert's input gradient
  View1<double> moe_x64_, moe_w64_, moe_dx64_, moe_dw64_;  // moe.router_fp64 scratch
  View1<float> moe_x32_, moe_w32_, moe_dx32_, moe_dw32_;   // a 16-bit model's fp32 router
  View1<double> moe_bias64_;                                // moe.router_fp64: the bias
  std::vector<View1<float>> moe_bias_;  // per global block: the expert bias (expert_bias())
  float moe_loss_weight_ = 0;  // d(loss)/d(router losses) of the current micro-batch
  bool recomputing_ = false;
  std::vector<MoeLayerStats> moe_stats_;
  View1<T> wte_, wpe_, lnf_w_, lnf_b_, dwte_, dwpe_, dlnf_w_, dlnf_b_;
  View1<T> lm_head_, dlm_head_;  // untied head
  kernels::RopeTable rope_;      // rotary positions: cos/sin of [T, HS/2]
  View1<std::int32_t> positions_;  // context parallelism: the rows' positions (empty: 0..T-1)
  std::unique_ptr<RingAttention<T>> ring_;  // context parallelism's attention (null: cp = 1)
  std::vector<std::unique_ptr<ChunkActivations<T>>> chunks_;
  std::unique_ptr<BlockActivations<T>> shared_acts_;  // recompute: one set for every block
  View1<T> shared_mlp_act_;  // recompute_mlp_act: every block's fch_gelu [N, HW]
  // head scratch (the head's backward runs inside its forward)
  View1<T> lnf_, logits_;  // logits_: [head_rows_, Vl] (one chunk of rows)
  View1<T> logits_all_;  // [N, Vl]: forward_logits' result, allocated by its first call
  int head_rows_ = 0;    // rows per head chunk (head_chunk_rows())
  View1<float> lnf_mean_, lnf_rstd_, losses_, ce_max_, ce_sums_;
  // gradient / communication scratch
  View1<T> dres_, dln_;
  View1<T> dqkv_, datty_, dfch_;
  View1<T> dh_;           // SwiGLU: gradient of the MLP activation [N, HW]
  View1<T> kv_dw_;        // kv heads replicated over tp: k and v weight (then bias) gradients
                          // before the sum
  View1<T> qkv_b_;        // Qwen2: [q | k | v] biases side by side for the merged q/k/v GEMM's
                          // epilogue, where the registry's 64-element alignment parts them
  Scalar<float> loss_sum_;
};

// What GptT's constructor allocates besides its flat parameter and gradient buffers, predicted
// without building it (the planner adds these up): activations of every slot of every chunk,
// the head's buffers, and the backward and tensor-parallel scratch. Bytes, for compute elements
// of `elem_bytes`; `tp_size` stands for layout.tp (which the planner cannot create).
struct ModelFootprint {
  double activations = 0, head = 0, scratch = 0;
};
// With context parallelism (`cp_size` > 1) seq_len is the rank's rows per sequence and the
// ring's buffers (RingAttention::buffer_bytes, by layout.cp_comm) count as scratch.
ModelFootprint model_footprint(const GptConfig& cfg, int micro_batch, int seq_len,
                               const ModelLayout& layout, int tp_size, std::size_t elem_bytes,
                               int cp_size = 1);

// The FP8 casts' workspace (kernels::Fp8Workspace) once every FP8 block of the layout's chunks
// has run forward and backward: the largest request of each of its buffers (counted in
// model_footprint's scratch). seq_len as model_footprint's (the rank's rows per sequence).
std::size_t fp8_workspace_bytes(const GptConfig& cfg, int micro_batch, int seq_len,
                                const ModelLayout& layout, int tp_size, std::size_t elem_bytes);

// The FP8 experts' casts' workspace (GptT::expert_fp8_workspace_bytes) at most: each expert
// GEMM's casts (rowwise) at the most rows an expert can take, micro_batch x seq_len from each
// rank of the ep group (layout.ep; a token picks top_k distinct experts), and the shared
// expert's at micro_batch x seq_len. 0 without FP8 MoE blocks in the layout's chunks.
std::size_t expert_fp8_workspace_bytes(const GptConfig& cfg, int micro_batch, int seq_len,
                                       const ModelLayout& layout, std::size_t elem_bytes);

// Rows per LM-head chunk for `rows` rows of `vocab_local` logits of `elem_bytes` each:
// `requested` (clamped to [1, rows]) when positive; else (auto) the whole micro-batch when its
// logits fit in 256 MiB, otherwise the fewest equal chunks that fit, rounded up to a multiple
// of 128 rows (GEMM tiles).
int head_chunk_rows(int requested, int rows, int vocab_local, std::size_t elem_bytes);

using Gpt = GptT<float>;
#if MESHTRAIN_HAVE_BF16
using GptBf16 = GptT<bf16>;
using GptFp16 = GptT<fp16>;
#endif

}  // namespace meshtrain::model
