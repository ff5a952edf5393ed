#include "meshtrain/model/config.hpp"

#include <algorithm>

#include "meshtrain/core/error.hpp"

namespace meshtrain::model {

const char* family_name(Family f) { return f == Family::gpt2 ? "gpt2" : "llama"; }
const char* norm_name(Norm n) { return n == Norm::layernorm ? "layernorm" : "rmsnorm"; }
const char* positions_name(Positions p) { return p == Positions::learned ? "learned" : "rotary"; }
const char* mlp_name(Mlp m) { return m == Mlp::gelu ? "gelu" : "swiglu"; }

namespace {
template <class E>
E parse_enum(const std::string& s, const char* key, std::initializer_list<E> values,
             const char* (*name)(E)) {
  std::string names;
  for (E v : values) {
    if (s == name(v)) return v;
    names += cat(names.empty() ? "" : ", ", name(v));
  }
  throw ConfigError(cat(key, "='", s, "' is not one of ", names));
}
}  // namespace

Family parse_family(const std::string& s, const char* key) {
  return parse_enum(s, key, {Family::gpt2, Family::llama}, family_name);
}
Norm parse_norm(const std::string& s, const char* key) {
  return parse_enum(s, key, {Norm::layernorm, Norm::rmsnorm}, norm_name);
}
Positions parse_positions(const std::string& s, const char* key) {
  return parse_enum(s, key, {Positions::learned, Positions::rotary}, positions_name);
}
Mlp parse_mlp(const std::string& s, const char* key) {
  return parse_enum(s, key, {Mlp::gelu, Mlp::swiglu}, mlp_name);
}

namespace {
// Parameters with `experts` experts counted per MoE block (all of them, or the top_k a token
// uses).
long long count_parameters(const GptConfig& g, long long experts) {
  const long long C = g.n_embd, I = g.mlp_width();
  const long long Q = static_cast<long long>(g.n_head) * g.head_size();
  const long long KV = static_cast<long long>(g.kv_heads()) * g.head_size();
  const long long nrm = g.norm == Norm::layernorm ? 2 * C : C;  // weight (and bias)
  const bool swiglu = g.mlp == Mlp::swiglu;
  auto mlp = [&](long long width) { return (swiglu ? 3 : 2) * C * width; };
  long long attn = 2 * nrm + C * (Q + 2 * KV) + Q * C;  // norms, q/k/v, output projection
  if (g.bias) attn += (Q + 2 * KV) + C;
  if (g.qkv_bias) attn += Q + 2 * KV;  // Qwen2
  long long dense = mlp(I) + (g.bias ? (swiglu ? 2 * I : I) + C : 0);  // experts have no bias
  long long moe = C * g.moe.experts + experts * mlp(g.expert_width()) + mlp(g.moe.shared_ffn);
  const long long L = g.n_layer, Lm = g.n_moe_layers();
  const long long V = g.vocab_size;
  return V * C * (g.tied_head ? 1 : 2) +
         (g.positions == Positions::learned ? static_cast<long long>(g.block_size) * C : 0) +
         L * attn + (L - Lm) * dense + Lm * moe + nrm;
}
}  // namespace

int GptConfig::n_moe_layers() const {
  int n = 0;
  for (int l = 0; l < n_layer; ++l) n += moe.is_moe_layer(l) ? 1 : 0;
  return n;
}

long long GptConfig::num_parameters() const { return count_parameters(*this, moe.experts); }

long long GptConfig::active_parameters() const {
  return count_parameters(*this, std::min(moe.top_k, moe.experts));
}

double GptConfig::flops_per_token(int seq_len) const {
  return 6.0 * static_cast<double>(active_parameters()) +
         12.0 * n_layer * static_cast<double>(n_head) * head_size() * seq_len;
}

void GptConfig::validate() const {
  MESHTRAIN_CONFIG_CHECK(n_layer > 0, "model.n_layer=", n_layer, " must be positive");
  MESHTRAIN_CONFIG_CHECK(n_head > 0, "model.n_head=", n_head, " must be positive");
  MESHTRAIN_CONFIG_CHECK(vocab_size > 0, "model.vocab_size=", vocab_size, " must be positive");
  MESHTRAIN_CONFIG_CHECK(vocab_pad > 0, "model.vocab_pad=", vocab_pad, " must be positive");
  MESHTRAIN_CONFIG_CHECK(block_size > 0, "model.block_size=", block_size, " must be positive");
  MESHTRAIN_CONFIG_CHECK(n_kv_head >= 0 && n_head % kv_heads() == 0, "model.n_kv_head=",
                         n_kv_head, " must divide model.n_head=", n_head,
                         " (each key-value head serves a group of query heads)");
  MESHTRAIN_CONFIG_CHECK(intermediate_size >= 0, "model.intermediate_size=", intermediate_size,
                         " must be positive (0: 4 x model.n_embd)");
  MESHTRAIN_CONFIG_CHECK(norm_eps > 0, "model.norm_eps=", norm_eps, " must be positive");
  if (moe.experts != 0) {
    MESHTRAIN_CONFIG_CHECK(moe.experts > 0, "moe.experts=", moe.experts,
                           " must be positive (0: a dense model)");
    MESHTRAIN_CONFIG_CHECK(moe.top_k >= 1 && moe.top_k <= 8 && moe.top_k <= moe.experts,
                           "moe.top_k=", moe.top_k, " must be in [1, min(8, moe.experts=",
                           moe.experts, ")]");
    MESHTRAIN_CONFIG_CHECK(moe.layer_freq >= 1, "moe.layer_freq=", moe.layer_freq,
                           " must be positive (1: every block is an MoE block)");
    MESHTRAIN_CONFIG_CHECK(moe.ffn >= 0, "moe.ffn_hidden_size=", moe.ffn,
                           " must be positive (0: the dense MLP width)");
    MESHTRAIN_CONFIG_CHECK(moe.shared_ffn >= 0, "moe.shared_expert_size=", moe.shared_ffn,
                           " must be positive (0: no shared expert)");
    MESHTRAIN_CONFIG_CHECK(moe.router_score == "softmax" || moe.router_score == "sigmoid",
                           "moe.router_score='", moe.router_score,
                           "' must be softmax or sigmoid");
    MESHTRAIN_CONFIG_CHECK(!moe.expert_bias || moe.router_score == "sigmoid",
                           "moe.expert_bias needs moe.router_score=sigmoid (the bias is added to "
                           "sigmoid scores to choose experts; it has no meaning for softmax)");
    MESHTRAIN_CONFIG_CHECK(moe.expert_bias_rate >= 0, "moe.expert_bias_rate=",
                           moe.expert_bias_rate, " must be >= 0");
    MESHTRAIN_CONFIG_CHECK(moe.aux_loss_coeff >= 0, "moe.aux_loss_coeff=", moe.aux_loss_coeff,
                           " must be >= 0");
    MESHTRAIN_CONFIG_CHECK(moe.aux_loss_scope == "global" || moe.aux_loss_scope == "local",
                           "moe.aux_loss_scope='", moe.aux_loss_scope,
                           "' must be global or local");
    MESHTRAIN_CONFIG_CHECK(moe.z_loss_coeff >= 0, "moe.z_loss_coeff=", moe.z_loss_coeff,
                           " must be >= 0");
    MESHTRAIN_CONFIG_CHECK(moe.capacity_factor >= 0, "moe.capacity_factor=",
                           moe.capacity_factor, " must be positive (0: dropless)");
  }
  if (family == Family::gpt2) {
    MESHTRAIN_CONFIG_CHECK(n_embd > 0 && n_embd % n_head == 0, "model.n_embd=", n_embd,
                           " must be a positive multiple of model.n_head=", n_head);
    // The GPT-2 family's fused c_attn holds equal q, k and v parts of n_embd columns each.
    MESHTRAIN_CONFIG_CHECK(head_size() * n_head == n_embd && kv_heads() == n_head,
                           "model.family=gpt2 has n_head key-value heads of n_embd / n_head "
                           "(model.n_kv_head=", n_kv_head, ", model.head_dim=", head_dim,
                           "); grouped-query attention is model.family=llama");
    MESHTRAIN_CONFIG_CHECK(norm == Norm::layernorm && positions == Positions::learned &&
                               mlp == Mlp::gelu && bias && tied_head,
                           "model.family=gpt2 is implemented with model.norm=layernorm, "
                           "model.positions=learned, model.mlp=gelu, model.bias=true, "
                           "model.tied_head=true (got ", norm_name(norm), ", ",
                           positions_name(positions), ", ", mlp_name(mlp), ", ", bias, ", ",
                           tied_head, "); the Llama block is model.family=llama");
    MESHTRAIN_CONFIG_CHECK(!qkv_bias && sliding_window == 0 && hf_model_type.empty(),
                           "model.qkv_bias, model.sliding_window and a HuggingFace model type "
                           "are model.family=llama's (GPT-2's biases are model.bias)");
  } else {
    MESHTRAIN_CONFIG_CHECK(n_embd > 0 && head_size() > 0 && head_size() % 2 == 0,
                           "model.head_dim=", head_size(), " must be positive and even (rotary "
                           "pairs element i with i + head_dim / 2)");
    MESHTRAIN_CONFIG_CHECK(norm == Norm::rmsnorm && positions == Positions::rotary &&
                               mlp == Mlp::swiglu && !bias,
                           "model.family=llama is implemented with model.norm=rmsnorm, "
                           "model.positions=rotary, model.mlp=swiglu, model.bias=false (got ",
                           norm_name(norm), ", ", positions_name(positions), ", ", mlp_name(mlp),
                           ", ", bias, ")");
    MESHTRAIN_CONFIG_CHECK(rope.theta > 0, "model.rope_theta=", rope.theta, " must be positive");
    MESHTRAIN_CONFIG_CHECK(sliding_window >= 0, "model.sliding_window=", sliding_window,
                           " must be 0 (none) or positive");
    MESHTRAIN_CONFIG_CHECK(hf_model_type.empty() || hf_model_type == "llama" ||
                               hf_model_type == "mistral" || hf_model_type == "qwen2",
                           "HuggingFace model type '", hf_model_type,
                           "' is not llama, mistral or qwen2");
    MESHTRAIN_CONFIG_CHECK(!qkv_bias || (hf_model_type != "mistral" && hf_model_type != "llama"),
                           "q/k/v biases without an output bias are Qwen2's; a ", hf_model_type,
                           " config.json cannot describe them (model.qkv_bias)");
  }
}

std::string GptConfig::describe() const {
  std::string s = cat(name, ": ", n_layer, " layers, ", n_head, " heads");
  if (kv_heads() != n_head) s += cat(" (", kv_heads(), " key-value)");
  s += cat(", n_embd ", n_embd, ", vocab ", vocab_size, " (padded ", padded_vocab(), "), block ",
           block_size);
  if (family != Family::gpt2)
    s += cat(", ", family_name(family), " block (", norm_name(norm), ", ",
             positions_name(positions), ", ", mlp_name(mlp), " ", mlp_width(),
             qkv_bias ? ", q/k/v biases" : "",
             sliding_window > 0 ? cat(", window ", sliding_window) : std::string(),
             tied_head ? ", tied head" : ", untied head", ")");
  if (moe.enabled())
    s += cat(", MoE every ", moe.layer_freq, " block(s): ", moe.experts, " experts of width ",
             expert_width(), ", top-", moe.top_k,
             moe.shared_ffn > 0 ? cat(", shared expert ", moe.shared_ffn) : std::string(), " (",
             active_parameters() / 1e6, "M active)");
  return s + cat(", ", num_parameters() / 1e6, "M parameters");
}

std::string GptConfig::key() const {
  return cat(n_layer, ' ', n_head, ' ', n_embd, ' ', vocab_size, ' ', vocab_pad, ' ', block_size,
             ' ', family_name(family), ' ', norm_name(norm), ' ', positions_name(positions), ' ',
             mlp_name(mlp), ' ', kv_heads(), ' ', head_size(), ' ', mlp_width(), ' ', bias, ' ',
             tied_head, ' ', norm_eps, ' ', rope.theta, ' ', rope.llama3_scaling, ' ', rope.factor,
             ' ', rope.low_freq_factor, ' ', rope.high_freq_factor, ' ',
             rope.original_max_position_embeddings, ' ', qkv_bias, ' ', sliding_window,
             moe.enabled() ? cat(" moe ", moe.experts, ' ', moe.top_k, ' ', moe.layer_freq, ' ',
                                 expert_width(), ' ', moe.shared_ffn, ' ', moe.router_score, ' ',
                                 moe.router_fp64, ' ', moe.aux_loss_coeff, ' ', moe.aux_loss_scope, ' ', moe.z_loss_coeff,
                                 ' ', moe.capacity_factor,
                                 moe.expert_bias ? cat(" bias ", moe.expert_bias_rate)
                                                 : std::string())
                           : std::string());
}

namespace {
GptConfig make(const char* name, int L, int H, int C, int V, int pad, int T) {
  GptConfig c;
  c.name = name;
  c.n_layer = L;
  c.n_head = H;
  c.n_embd = C;
  c.vocab_size = V;
  c.vocab_pad = pad;
  c.block_size = T;
  return c;
}
// A Llama block: RMSNorm, rotary, SwiGLU of width I, KV key-value heads, no biases.
GptConfig llama(const char* name, int L, int H, int KV, int C, int I, int V, int pad, int T,
                bool tied, double theta) {
  GptConfig c = make(name, L, H, C, V, pad, T);
  c.family = Family::llama;
  c.norm = Norm::rmsnorm;
  c.positions = Positions::rotary;
  c.mlp = Mlp::swiglu;
  c.n_kv_head = KV;
  c.intermediate_size = I;
  c.bias = false;
  c.tied_head = tied;
  c.rope.theta = theta;
  return c;
}
// Llama 3.1's rope_scaling (config.json of Llama 3.1 and 3.2: rope_type llama3, low 1, high 4,
// original_max_position_embeddings 8192; factor 8 for 3.1, 32 for 3.2).
GptConfig llama3(GptConfig c, double factor) {
  c.rope.llama3_scaling = true;
  c.rope.factor = factor;
  c.rope.low_freq_factor = 1.0;
  c.rope.high_freq_factor = 4.0;
  c.rope.original_max_position_embeddings = 8192;
  return c;
}
}  // namespace

GptConfig preset(const std::string& name) {
  // GPT-2 family: Radford et al. 2019, Table 2; vocab padded to 50304 (a multiple of 128).
  if (name == "gpt2-124m") return make("gpt2-124m", 12, 12, 768, 50257, 128, 1024);
  if (name == "gpt2-350m") return make("gpt2-350m", 24, 16, 1024, 50257, 128, 1024);
  if (name == "gpt2-774m") return make("gpt2-774m", 36, 20, 1280, 50257, 128, 1024);
  if (name == "gpt2-1.5b") return make("gpt2-1.5b", 48, 25, 1600, 50257, 128, 1024);
  // Small models for CPUs: the benchmark shape of the issues, and the README demo.
  if (name == "cpu-bench") return make("cpu-bench", 4, 4, 256, 4096, 64, 128);
  if (name == "demo") return make("demo", 4, 4, 128, 256, 64, 128);
  // Llama family. llama-tiny: the demo's, 0.8M parameters as `demo` (byte vocabulary, 2 query
  // heads per key-value head, untied head). llama-150m: a one-GPU model on the GPT-2 tokenizer.
  if (name == "llama-tiny") return llama("llama-tiny", 4, 4, 2, 128, 352, 256, 64, 128, false, 1e4);
  if (name == "llama-150m")
    return llama("llama-150m", 12, 12, 4, 768, 2048, 50257, 128, 2048, false, 5e5);
  // Meta's config.json of each (Llama 3.2 ties its head; max_position_embeddings 131072).
  if (name == "llama3.2-1b")
    return llama3(llama("llama3.2-1b", 16, 32, 8, 2048, 8192, 128256, 128, 131072, true, 5e5), 32);
  if (name == "llama3.1-8b")
    return llama3(llama("llama3.1-8b", 32, 32, 8, 4096, 14336, 128256, 128, 131072, false, 5e5), 8);
  if (name == "llama3.1-70b")
    return llama3(llama("llama3.1-70b", 80, 64, 8, 8192, 28672, 128256, 128, 131072, false, 5e5),
                  8);
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError(cat("model.preset='", name, "' is not one of ", names, ", custom"));
}

std::vector<std::string> preset_names() {
  return {"gpt2-124m", "gpt2-350m",   "gpt2-774m",   "gpt2-1.5b",  "cpu-bench",   "demo",
          "llama-tiny", "llama-150m", "llama3.2-1b", "llama3.1-8b", "llama3.1-70b"};
}

}  // namespace meshtrain::model
