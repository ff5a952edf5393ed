#pragma once
// GPT-2: token + learned position embeddings, pre-LayerNorm blocks (causal multi-head attention,
// GELU MLP of width 4C), final LayerNorm, LM head tied to the token embedding.
//
// Parameters and gradients live in flat buffers laid out by the ParameterRegistry; each
// parameter is a slice of them. The model runs one micro-batch of B sequences of T tokens:
// forward_train() computes the loss and, fused into the cross-entropy, the logits' gradient;
// backward() accumulates parameter gradients (so micro-batches accumulate). With activation
// checkpointing only each block's input is kept, and backward() recomputes the block.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/core/view.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/registry.hpp"

namespace meshtrain::model {

template <class T>
struct BlockActivations;  // gpt_activations.hpp
template <class T>
struct BlockTensors;      // gpt_activations.hpp

// T is the compute type of parameters, activations and gradients: float (fp32 mode, the CPU
// build) or bf16 (mixed precision on GPUs, with fp32 master weights in the optimizer).
// Statistics (LayerNorm mean/rstd, attention lse, per-token losses) stay fp32.
template <class T>
class GptT {
 public:
  using value_type = T;
  GptT(const GptConfig& cfg, int micro_batch, int seq_len, bool recompute = false,
       ExecSpace exec = ExecSpace{});
  ~GptT();
  GptT(const GptT&) = delete;
  GptT& operator=(const GptT&) = delete;

  const GptConfig& config() const { return cfg_; }
  const ParameterRegistry& registry() const { return reg_; }
  int micro_batch() const { return B_; }
  int seq_len() const { return T_; }
  const ExecSpace& exec() const { return exec_; }

  View1<T> params() const { return params_; }
  View1<T> grads() const { return grads_; }
  View1<T> param(const std::string& name) const;
  View1<T> grad(const std::string& name) const;

  // GPT-2 initialisation from the counter-based RNG keyed by (seed, name, global index):
  // weights N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm
  // weights 1; padding rows of wte 0.
  void init_parameters(std::uint64_t seed);
  // Use `other`'s parameter buffer (same configuration), e.g. a batch-1 model for sampling that
  // shares the weights of the training model instead of copying them.
  void share_parameters(const GptT& other);
  void zero_grads();

  // One training micro-batch (B*T tokens, device memory). grad_scale = 1 / (counted target
  // tokens of the whole global batch). Adds the sum of token losses to loss_sum().
  void forward_train(View1<const std::int32_t> inputs, View1<const std::int32_t> targets,
                     float grad_scale);
  // Gradients of the last forward_train, accumulated into grads().
  void backward();
  // Loss only (evaluation). Adds to loss_sum().
  void forward_eval(View1<const std::int32_t> inputs, View1<const std::int32_t> targets);
  // Logits [B*T, padded_vocab] for generation (inputs of B*T tokens; shorter prompts padded by
  // the caller).
  View1<const T> forward_logits(View1<const std::int32_t> inputs);

  Scalar<float> loss_sum() const { return loss_sum_; }
  void reset_loss_sum();

 private:
  void forward_body(View1<const std::int32_t> inputs);
  void block_forward(int l, View1<const T> x, BlockActivations<T>& a);
  void block_backward(int l, View1<const T> x, BlockActivations<T>& a, View1<T> dres);
  BlockActivations<T>& acts_for(int l);
  void bind_block_tensors();

  GptConfig cfg_;
  int B_, T_;
  bool recompute_;
  ExecSpace exec_;
  ParameterRegistry reg_;
  View1<T> params_, grads_;
  std::vector<BlockTensors<T>> block_params_, block_grads_;  // slices of params_ / grads_
  // activations
  View1<T> encoded_;                        // [N, C] input of block 0
  std::vector<View1<T>> block_out_;         // [N, C] output of each block
  std::vector<std::unique_ptr<BlockActivations<T>>> acts_;  // one per block, or one shared
  View1<T> lnf_, logits_;
  View1<float> lnf_mean_, lnf_rstd_, losses_;
  View1<std::int32_t> inputs_, targets_;    // copies of the last micro-batch
  // gradient scratch
  View1<T> dres_, dln_, dqkv_, datty_, dfch_, dfch_gelu_;
  Scalar<float> loss_sum_;
};

using Gpt = GptT<float>;
#if MESHTRAIN_HAVE_BF16
using GptBf16 = GptT<bf16>;
using GptFp16 = GptT<fp16>;
#endif

}  // namespace meshtrain::model
