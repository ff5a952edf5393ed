#pragma once
// The parameter registry (DESIGN invariant 4): every parameter's stable HuggingFace name (GPT-2's
// or Llama's, per model family),
// global shape, how tensor parallelism splits it, its pipeline stage and its offset in the flat
// buffer of the stage's parameters. DP buckets, ZeRO shards, checkpoints, import/export and the
// planner read offsets from here; nobody computes them by hand elsewhere.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/core/decay_range.hpp"
#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/model/config.hpp"

namespace meshtrain::model {

// How tensor parallelism splits a parameter across the tp group. GPT-2's Conv1D weights are
// [in, out] (column-parallel: cols, row-parallel: rows); Llama's nn.Linear weights are [out, in]
// (column-parallel: rows, row-parallel: cols).
enum class Split {
  replicated,  // every tp rank holds the whole tensor (norms, row-parallel biases, wpe; Llama's
               // k/v projections when n_kv_head < tp, whose gradients the model sums over tp)
  rows,        // dim 0 split in tp contiguous blocks (GPT-2 row-parallel weight [IC, OC]; vocab
               // rows; Llama column-parallel weight [OC, IC], split by heads for q/k/v)
  cols,        // dim 1 split in tp contiguous blocks (GPT-2 column-parallel weight/bias; Llama
               // row-parallel weight)
  qkv_cols,    // the fused [q|k|v] columns: each of the three parts split by heads
};

// How init_parameters draws a parameter (GPT-2's scheme, and HF Llama's _init_weights).
enum class Init {
  normal,    // N(0, 0.02)
  residual,  // N(0, 0.02 / sqrt(2 n_layer)): GPT-2's projections into the residual stream
  zeros,     // biases
  ones,      // norm weights
};

const char* split_name(Split s);

// Global row-major index of local element i of a tensor split by `split` (a Split value) across
// the tp group: local shape [lrows, lcols] (a vector when !matrix: lcols elements), global row
// length gcols. Host and device (parameter initialisation draws each element by global index).
KOKKOS_INLINE_FUNCTION std::int64_t split_global_index(int split, std::int64_t i, bool matrix,
                                                       std::int64_t lrows, std::int64_t lcols,
                                                       std::int64_t gcols, int tp_rank) {
  const std::int64_t r = matrix ? i / lcols : 0, c = matrix ? i % lcols : i;
  if (split == static_cast<int>(Split::rows)) return (tp_rank * lrows + r) * gcols + c;
  if (split == static_cast<int>(Split::cols)) return r * gcols + tp_rank * lcols + c;
  if (split == static_cast<int>(Split::qkv_cols)) {  // each of q, k, v split by heads
    const std::int64_t part = lcols / 3, which = c / part, within = c % part;
    return r * gcols + which * (gcols / 3) + tp_rank * part + within;
  }
  return i;  // replicated
}

// The group of ranks over which a parameter's gradient is reduced and its optimizer state is
// sharded. Dense parameters belong to data parallelism; the experts of a Mixture of Experts
// (expert parallelism) to the expert-data-parallel group, whose members hold the same experts.
enum class ParamGroup { dp, expert_dp };
const char* param_group_name(ParamGroup g);

struct ParamInfo {
  std::string name;                        // HF name, e.g. transformer.h.0.attn.c_attn.weight
                                           // or model.layers.0.self_attn.q_proj.weight
  std::vector<std::int64_t> global_shape;  // wte uses the padded vocab
  std::vector<std::int64_t> local_shape;   // this rank's slice
  Split split = Split::replicated;
  int layer = -1;                          // transformer block index, -1 for embeddings / ln_f
  int stage = 0;                           // pipeline stage holding it
  std::size_t offset = 0;                  // in the stage's flat buffer (elements)
  std::size_t numel = 0;                   // local elements
  bool decay = false;                      // AdamW weight decay applies
  Init init = Init::normal;
  ParamGroup grad_group = ParamGroup::dp;  // reduces its gradient
  ParamGroup state_group = ParamGroup::dp; // shards its optimizer state (ZeRO)
  std::int64_t global_numel() const;
  // Global flat index (row-major in global_shape) of local flat element `i`.
  std::int64_t global_index(std::int64_t i, int tp_rank, int tp_size) const;
};

// Blocks [first, last) held together: a pipeline stage, or one virtual chunk of an interleaved
// schedule.
struct LayerRange {
  int first = 0, last = 0;
};

// A contiguous range [begin, end) of the flat buffer that is used as a whole: the embedding
// (wte, and wpe on the first stage), one transformer block, or the head (ln_f). Layer hooks
// (DP buckets, ZeRO) work unit by unit; `begin` is aligned.
struct UnitInfo {
  std::string name;  // "embedding", "transformer.h.<l>" (GPT-2) or "model.layers.<l>", "head"
  int layer = -1;    // block index; -1 for the embedding and the head
  std::size_t begin = 0, end = 0;
  ParamGroup group = ParamGroup::dp;  // every parameter of a unit reduces over this group
  std::size_t size() const { return end - begin; }
};

class ParameterRegistry {
 public:
  // Parameters of the layers this rank holds (pipeline stage `stage` owning blocks
  // [first_layer, last_layer); `has_embedding` / `has_head` for the first / last stage), sliced for
  // tp rank `tp_rank` of `tp_size`. Offsets are aligned to `kAlign` elements.
  // MoE blocks hold experts [ep_rank E / ep_size, (ep_rank + 1) E / ep_size) of each MoE block.
  ParameterRegistry(const GptConfig& cfg, int tp_rank, int tp_size, int stage, int first_layer,
                    int last_layer, bool has_embedding, bool has_head, int ep_rank = 0,
                    int ep_size = 1);
  // Several layer ranges (the virtual chunks of an interleaved pipeline) in one flat buffer.
  ParameterRegistry(const GptConfig& cfg, int tp_rank, int tp_size, int stage,
                    const std::vector<LayerRange>& chunks, bool has_embedding, bool has_head,
                    int ep_rank = 0, int ep_size = 1);

  static constexpr std::size_t kAlign = 64;

  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& get(const std::string& name) const;  // Error naming the parameter
  const ParamInfo* find(const std::string& name) const;
  std::size_t size() const { return total_; }  // elements of the flat buffer, padding included
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  const GptConfig& config() const { return cfg_; }
  bool has_embedding() const { return has_embedding_; }
  bool has_head() const { return has_head_; }
  // The LM head reads the token embedding (GPT-2, Llama 3.2); otherwise it has its own weight
  // (lm_head.weight, in the head unit) and the last stage holds no copy of the embedding.
  bool tied_head() const { return cfg_.tied_head; }
  // The token embedding's name: transformer.wte.weight or model.embed_tokens.weight.
  const std::string& embedding_name() const { return wte_name_; }
  // The weight the LM head multiplies by: the embedding when tied, else lm_head.weight.
  const std::string& head_weight_name() const { return head_w_name_; }
  // Key-value heads of a block on this rank and the first of them (global index). Split by
  // heads when n_kv_head >= tp; otherwise one replica per rank: the head its query heads use.
  int local_kv_heads() const { return kv_local_; }
  int first_kv_head() const { return kv_first_; }
  bool kv_replicated() const { return kv_replicated_; }
  // Name prefix of block l's parameters ("transformer.h.<l>." or "model.layers.<l>.").
  std::string block_prefix(int layer) const;
  int stage() const { return stage_; }

  const std::vector<UnitInfo>& units() const { return units_; }
  // Unit index of block `layer`, of the embedding (-1 when wte is not held) and of the head.
  int unit_of_layer(int layer) const;
  // Mixture of Experts: the unit of block `layer`'s experts (the unit after the block's, of
  // group expert_dp; -1 for a dense block), and which experts this rank holds. Expert e's
  // weights are `<block>mlp.experts.<e>.w_in` [C, W] and `.w_out` [I, C] (W = I, or 2 I packed
  // [gate | up] per row for SwiGLU; the project's linear layout out = in @ w), all local w_in
  // first, then all w_out, each a run of equal stride (expert_stride).
  int expert_unit_of_layer(int layer) const;
  int ep_rank() const { return ep_rank_; }
  int ep_size() const { return ep_size_; }
  int local_experts() const { return cfg_.moe.experts / ep_size_; }
  int first_expert() const { return ep_rank_ * local_experts(); }
  std::string expert_prefix(int layer, int e) const;  // "<block>mlp.experts.<e>."
  // Elements from one local expert's w_in (w_out) to the next's in the flat buffer.
  std::size_t expert_stride(int layer, bool w_in) const;
  int embedding_unit() const { return embedding_unit_; }
  int head_unit() const { return head_unit_; }

  // Whether the parameter's squares enter the global gradient norm on this rank, so that the norm
  // summed over the model-parallel group counts every global element once: tensor-parallel
  // replicas count on tp rank 0 only, and the tied copy of wte on a last stage without the
  // embedding not at all (the first stage counts it).
  bool counts_in_norm(const ParamInfo& p) const;

  // Every parameter as a run of the flat buffer with its weight decay, in flat order: what
  // optim::AdamWT takes.
  std::vector<DecayRange> decay_ranges() const;

 private:
  void build(const std::vector<LayerRange>& chunks);
  void add_gpt2_block(int l);
  void add_llama_block(int l);
  void add_moe(int l);  // router and shared expert (block unit)
  void add_experts(int l);  // the expert unit's parameters
  void add(std::string name, std::vector<std::int64_t> shape, Split split, int layer, bool decay,
           Init init);
  GptConfig cfg_;
  int tp_rank_, tp_size_, stage_;
  bool has_embedding_, has_head_;
  std::vector<ParamInfo> params_;
  std::vector<UnitInfo> units_;
  std::vector<int> layer_unit_;  // per global layer; -1 when not held
  std::vector<int> expert_unit_;  // per global layer; -1 when dense or not held
  int ep_rank_ = 0, ep_size_ = 1;
  int embedding_unit_ = -1, head_unit_ = -1;
  std::string wte_name_, head_w_name_;
  int kv_local_ = 0, kv_first_ = 0;
  bool kv_replicated_ = false;
  std::size_t total_ = 0;
};

}  // namespace meshtrain::model
