#pragma once
// Model configuration: one block description for the GPT-2 and Llama families, and named
// presets. The family fixes the parameter names (HuggingFace's for each family) and the weight
// layout (GPT-2: Conv1D [in, out]; Llama: nn.Linear [out, in]); the other fields describe the
// computation of a block.
#include <string>
#include <vector>

#include "meshtrain/kernels/rotary.hpp"

namespace meshtrain::model {

enum class Family { gpt2, llama };
enum class Norm { layernorm, rmsnorm };       // LayerNorm with bias / RMSNorm (no bias)
enum class Positions { learned, rotary };     // wpe table / RoPE on q and k
enum class Mlp { gelu, swiglu };              // fc-GELU-proj / down(silu(gate) * up)

const char* family_name(Family f);
const char* norm_name(Norm n);
const char* positions_name(Positions p);
const char* mlp_name(Mlp m);
// ConfigError naming `key` and the accepted spellings.
Family parse_family(const std::string& s, const char* key);
Norm parse_norm(const std::string& s, const char* key);
Positions parse_positions(const std::string& s, const char* key);
Mlp parse_mlp(const std::string& s, const char* key);

// Mixture of Experts (issue 20, docs/moe.md): every layer_freq-th block (blocks l with
// l % layer_freq == 0) replaces its MLP by `experts` experts of the family's MLP (GELU or
// SwiGLU, no biases) of width `ffn`, top_k of them per token chosen by an fp32 (or fp64) router,
// plus an optional shared expert of width `shared_ffn` that every token goes through.
struct MoeConfig {
  int experts = 0;               // moe.experts (E); 0: a dense model
  int top_k = 2;                 // moe.top_k (k)
  int layer_freq = 1;            // moe.layer_freq
  int ffn = 0;                   // moe.ffn_hidden_size; 0: the dense MLP width
  int shared_ffn = 0;            // moe.shared_expert_size; 0: no shared expert
  std::string router_score = "softmax";  // moe.router_score: softmax | sigmoid
  // DeepSeek-V3's auxiliary-loss-free balancing (sigmoid router only): a per-expert bias that
  // only chooses experts, moved by expert_bias_rate * sign(mean load - load) after each step.
  bool expert_bias = false;      // moe.expert_bias
  double expert_bias_rate = 1e-3;  // moe.expert_bias_rate (DeepSeek-V3's bias update speed)
  bool router_fp64 = false;      // moe.router_fp64: router in double (tests: no tie flips)
  double aux_loss_coeff = 0.01;  // moe.aux_loss_coeff
  // Whose tokens the load-balancing statistics count (moe.aux_loss_scope): "global", the
  // global batch's micro-batch m (every data-parallel rank's m-th micro-batch), or "local", this
  // rank's micro-batch alone.
  std::string aux_loss_scope = "global";
  double z_loss_coeff = 0.0;     // moe.z_loss_coeff
  double capacity_factor = 0.0;  // moe.capacity_factor; 0: dropless
  bool enabled() const { return experts > 0; }
  bool is_moe_layer(int l) const { return experts > 0 && l % layer_freq == 0; }
};

struct GptConfig {
  std::string name = "custom";
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int vocab_size = 256;   // the real vocabulary
  int vocab_pad = 64;     // the embedding is padded to a multiple of this (speed); padding rows
                          // are zero and masked out of the loss
  int block_size = 128;   // maximum sequence length (rows of the position embedding)

  // The block description. Defaults are GPT-2's, so a configuration that sets none of them
  // (every GPT-2 preset, checkpoint and HF folder made before they existed) is GPT-2.
  Family family = Family::gpt2;
  Norm norm = Norm::layernorm;
  Positions positions = Positions::learned;
  Mlp mlp = Mlp::gelu;
  int n_kv_head = 0;          // key-value heads (grouped-query attention); 0: n_head
  int head_dim = 0;           // 0: n_embd / n_head
  int intermediate_size = 0;  // MLP width; 0: 4 n_embd
  bool bias = true;           // biases of the linears (and LayerNorm)
  bool qkv_bias = false;      // llama family: biases on q, k and v only (Qwen2)
  int sliding_window = 0;     // Mistral's attention window (config.json); 0: none. meshtrain
                              // attends over the whole causal context, so a model is refused
                              // for sequences longer than its window
  // The HuggingFace model_type a llama-family model is written as: "" (llama, or qwen2 with
  // q/k/v biases), "mistral" (read from a MistralForCausalLM folder). Names and math coincide.
  std::string hf_model_type;
  bool tied_head = true;      // LM head shares the token embedding
  double norm_eps = 1e-5;
  kernels::RopeConfig rope;   // rotary: rope_theta and Llama 3 frequency scaling
  MoeConfig moe;              // experts in place of the MLP (moe.*)

  int padded_vocab() const { return (vocab_size + vocab_pad - 1) / vocab_pad * vocab_pad; }
  int head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int mlp_width() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  int expert_width() const { return moe.ffn > 0 ? moe.ffn : mlp_width(); }
  int n_moe_layers() const;
  bool is_gpt2() const { return family == Family::gpt2; }
  // Parameters counted once (tied LM head not counted twice), padding rows excluded; every
  // expert counted. active_parameters(): what one token multiplies by (top_k experts of each
  // MoE block), which FLOPs count.
  long long num_parameters() const;
  long long active_parameters() const;
  // Training FLOPs per token: 6 N + 12 n_layer (n_head head_size) T (PaLM appendix B; attention
  // included, its q.k and p.v products over the query heads' width).
  double flops_per_token(int seq_len) const;
  // Throws ConfigError naming model.* options when inconsistent or not implemented.
  void validate() const;
  std::string describe() const;
  // Every field but the name, as text, with the 0 defaults resolved (n_kv_head 0 and n_head
  // are one model): equal keys are the same model (caches and tests key on it).
  std::string key() const;
};

// gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, cpu-bench, demo, llama-tiny, llama-150m,
// llama3.2-1b, llama3.1-8b, llama3.1-70b. ConfigError for unknown names.
GptConfig preset(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace meshtrain::model
