#include "meshtrain/io/hf_checkpoint.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/io/hf_export.hpp"
#include "meshtrain/io/hf_import.hpp"

namespace meshtrain::io {

namespace {

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(cat("cannot open ", what, " '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The defaults of a family's config class for keys a config.json may leave out.
struct LlamaDefaults {
  double rms_norm_eps = 1e-6, rope_theta = 1e4;
  int kv_heads = 0;  // 0: num_attention_heads
};

// HF LlamaConfig's fields (defaults as LlamaConfig's: n_kv_head = n_head, head_dim = hidden /
// heads, rms_norm_eps 1e-6, rope_theta 1e4, untied; MixtralConfig's differ, `d`). rope_theta and
// rope_scaling at the top level (transformers 4) or in rope_parameters (transformers 5).
void read_llama_config(const Json& j, const std::string& path, model::GptConfig& c,
                       const LlamaDefaults& d = {}) {
  auto int_of = [&](const Json& o, const char* key) {
    return static_cast<int>(json::as_int(json::at(o, key, path), cat(path, ": ", key)));
  };
  auto num_of = [&](const Json& o, const char* key) {
    return json::as_number(json::at(o, key, path), cat(path, ": ", key));
  };
  const model::GptConfig base = model::preset("llama-tiny");
  c.family = base.family;
  c.norm = base.norm;
  c.positions = base.positions;
  c.mlp = base.mlp;
  c.bias = false;
  c.n_layer = int_of(j, "num_hidden_layers");
  c.n_head = int_of(j, "num_attention_heads");
  c.n_embd = int_of(j, "hidden_size");
  c.intermediate_size = int_of(j, "intermediate_size");
  c.vocab_size = int_of(j, "vocab_size");
  c.block_size = int_of(j, "max_position_embeddings");
  const Json* kv = json::find(j, "num_key_value_heads");
  c.n_kv_head = kv && !kv->is_null() ? int_of(j, "num_key_value_heads")
                                     : d.kv_heads > 0 ? d.kv_heads : c.n_head;
  const Json* hd = json::find(j, "head_dim");
  c.head_dim = hd && !hd->is_null() ? int_of(j, "head_dim") : 0;
  c.norm_eps = json::find(j, "rms_norm_eps") ? num_of(j, "rms_norm_eps") : d.rms_norm_eps;
  const Json* tie = json::find(j, "tie_word_embeddings");
  c.tied_head = tie && tie->is_boolean() && tie->get<bool>();
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    const Json* b = json::find(j, key);
    MESHTRAIN_CONFIG_CHECK(!b || (b->is_boolean() && !b->get<bool>()), path, ": ", key,
                           " is set; meshtrain's Llama block has biases on q, k and v only "
                           "(Qwen2), not on the output projection or the MLP");
  }
  if (const Json* act = json::find(j, "hidden_act")) {
    const std::string& a = json::as_string(*act, path + ": hidden_act");
    MESHTRAIN_CONFIG_CHECK(a == "silu", path, ": hidden_act '", a,
                           "' is not the SwiGLU activation meshtrain implements (silu)");
  }
  const Json* rp = json::find(j, "rope_parameters");
  const Json& rope = rp && rp->is_object() ? *rp : j;
  c.rope = kernels::RopeConfig{};
  c.rope.theta = json::find(rope, "rope_theta") ? num_of(rope, "rope_theta") : d.rope_theta;
  const Json* sc = rp && rp->is_object() ? rp : json::find(j, "rope_scaling");
  if (sc && sc->is_object()) {
    const Json* type = json::find(*sc, "rope_type");
    if (!type) type = json::find(*sc, "type");
    const std::string t = type ? json::as_string(*type, path + ": rope_type") : "default";
    MESHTRAIN_CONFIG_CHECK(t == "default" || t == "llama3", path, ": rope_type '", t,
                           "' is not supported (default or llama3)");
    if (t == "llama3") {
      c.rope.llama3_scaling = true;
      c.rope.factor = num_of(*sc, "factor");
      c.rope.low_freq_factor = num_of(*sc, "low_freq_factor");
      c.rope.high_freq_factor = num_of(*sc, "high_freq_factor");
      c.rope.original_max_position_embeddings = int_of(*sc, "original_max_position_embeddings");
    }
  }
}

// Qwen2Config: q, k and v always have biases (Qwen2Attention), o_proj and the MLP none; the
// sliding window applies only with use_sliding_window (off in every released Qwen2 / 2.5).
void read_qwen2_extras(const Json& j, const std::string& path, model::GptConfig& c) {
  c.qkv_bias = true;
  c.hf_model_type = "qwen2";
  const Json* use = json::find(j, "use_sliding_window");
  if (use && use->is_boolean() && use->get<bool>()) {
    const Json* w = json::find(j, "sliding_window");
    MESHTRAIN_CONFIG_CHECK(w && w->is_number_integer(), path,
                           ": use_sliding_window is true but sliding_window is not a number");
    // max_window_layers: the layers from this one on use the window; none does at n_layer.
    const Json* mw = json::find(j, "max_window_layers");
    const bool none = mw && mw->is_number_integer() && mw->get<int>() >= c.n_layer;
    if (!none) c.sliding_window = w->get<int>();
  }
}

// MistralConfig: Llama's names and math, and a sliding window (default 4096 when the key is
// absent, as MistralConfig's; null: none).
void read_mistral_extras(const Json& j, const std::string& path, model::GptConfig& c) {
  c.hf_model_type = "mistral";
  const Json* w = json::find(j, "sliding_window");
  if (!w) c.sliding_window = 4096;
  else if (!w->is_null())
    c.sliding_window = static_cast<int>(json::as_int(*w, path + ": sliding_window"));
}

// MixtralConfig (transformers 5 defaults: 8 experts, top-2, router_aux_loss_coef 0.001, no
// sliding window): every block an MoE block of SwiGLU experts intermediate_size wide, softmax
// top-k renormalised, dropless. router_jitter_noise and output_router_logits are training
// switches of HF's own loop, not of the model's function.
void read_mixtral_extras(const Json& j, const std::string& path, model::GptConfig& c) {
  auto int_or = [&](const char* key, int def) {
    const Json* v = json::find(j, key);
    return v && !v->is_null() ? static_cast<int>(json::as_int(*v, cat(path, ": ", key))) : def;
  };
  const Json* w = json::find(j, "sliding_window");
  c.sliding_window = w && !w->is_null()
                         ? static_cast<int>(json::as_int(*w, path + ": sliding_window"))
                         : 0;
  c.moe = model::MoeConfig{};
  c.moe.experts = int_or("num_local_experts", 8);
  c.moe.top_k = int_or("num_experts_per_tok", 2);
  c.moe.layer_freq = 1;
  c.moe.ffn = c.intermediate_size;
  c.moe.z_loss_coeff = 0.0;
  const Json* aux = json::find(j, "router_aux_loss_coef");
  c.moe.aux_loss_coeff =
      aux && !aux->is_null() ? json::as_number(*aux, path + ": router_aux_loss_coef") : 0.001;
  MESHTRAIN_CONFIG_CHECK(c.moe.experts >= 1, path, ": num_local_experts=", c.moe.experts,
                         " must be positive");
  MESHTRAIN_CONFIG_CHECK(c.moe.top_k >= 2, path, ": num_experts_per_tok=", c.moe.top_k,
                         ": Mixtral renormalises the chosen probabilities, so one choice "
                         "weighs 1; meshtrain's top-1 router weighs it by its probability "
                         "(Switch), another function (top-k of 2 or more agree)");
  MESHTRAIN_CONFIG_CHECK(c.moe.top_k <= c.moe.experts && c.moe.top_k <= 8, path,
                         ": num_experts_per_tok=", c.moe.top_k, " must be at most "
                         "num_local_experts=", c.moe.experts, " and 8 (meshtrain's moe.top_k)");
}

}  // namespace

model::GptConfig read_hf_config(const std::string& dir, int vocab_pad) {
  const std::string path = dir + "/config.json";
  const Json j = json::parse(read_file(path, "HuggingFace config"), path);
  model::GptConfig c;
  c.name = std::filesystem::path(dir).filename().string();
  // GPT2LMHeadModel (model_type gpt2, or none: older files) and LlamaForCausalLM; any other
  // architecture is named instead of failing on a missing key.
  if (const Json* t = json::find(j, "model_type")) {
    const std::string& type = json::as_string(*t, path + ": model_type");
    MESHTRAIN_CONFIG_CHECK(type == "gpt2" || type == "llama" || type == "qwen2" ||
                               type == "mistral" || type == "mixtral",
                           path, ": model_type '", type,
                           "' is not supported (meshtrain reads GPT2LMHeadModel, model_type "
                           "gpt2, LlamaForCausalLM, llama, Qwen2ForCausalLM, qwen2, "
                           "MistralForCausalLM, mistral, and MixtralForCausalLM, mixtral)");
    if (type != "gpt2") {
      LlamaDefaults d;
      if (type == "mixtral") d = LlamaDefaults{1e-5, 1e6, 8};  // MixtralConfig's
      read_llama_config(j, path, c, d);
      if (type == "qwen2") read_qwen2_extras(j, path, c);
      if (type == "mistral") read_mistral_extras(j, path, c);
      if (type == "mixtral") read_mixtral_extras(j, path, c);
      c.vocab_pad = vocab_pad;
      c.validate();
      return c;
    }
  }
  auto int_of = [&](const char* key) {
    return static_cast<int>(json::as_int(json::at(j, key, path), cat(path, ": ", key)));
  };
  c.n_layer = int_of("n_layer");
  c.n_head = int_of("n_head");
  c.n_embd = int_of("n_embd");
  c.vocab_size = int_of("vocab_size");
  const Json* pos = json::find(j, "n_positions");
  c.block_size = static_cast<int>(
      json::as_int(pos ? *pos : json::at(j, "n_ctx", path), path + ": n_positions"));
  if (const Json* act = json::find(j, "activation_function")) {
    const std::string& a = json::as_string(*act, path + ": activation_function");
    MESHTRAIN_CONFIG_CHECK(a == "gelu_new" || a == "gelu_pytorch_tanh", path,
                           ": activation_function '", a,
                           "' is not the tanh GELU meshtrain implements (gelu_new)");
  }
  c.vocab_pad = vocab_pad;
  c.validate();
  return c;
}

std::string read_hf_tokenizer(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const Json j = json::parse(read_file(path, "HuggingFace config"), path);
  if (const Json* t = json::find(j, "meshtrain_tokenizer")) return json::as_string(*t, path);
  return "gpt2";
}

template <class T>
void import_hf(model::GptT<T>& m, const std::string& dir) {
  MESHTRAIN_CHECK(m.registry().tp_size() == 1 && m.registry().has_embedding() &&
                      m.registry().has_head() && m.params().span() > 0,
                  "import_hf loads a whole model (one rank, parameters allocated)");
  import_hf_slices(m.registry(), dir, m.params());
}

namespace {

// torch_dtype of a safetensors dtype.
std::string torch_dtype(const std::string& dtype) { return dtype == "BF16" ? "bfloat16" : "float32"; }

// GPT2Config's keys; meshtrain_tokenizer tells `generate` how to decode.
Json gpt2_config(const model::GptConfig& c) {
  Json j = Json::object();
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["activation_function"] = "gelu_new";
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_embd"] = c.n_embd;
  j["vocab_size"] = c.vocab_size;
  j["n_positions"] = c.block_size;
  j["n_ctx"] = c.block_size;
  j["layer_norm_epsilon"] = 1e-5;
  j["tie_word_embeddings"] = true;
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  return j;
}

// LlamaConfig's keys as transformers 4 writes them (transformers 5 reads rope_theta and
// rope_scaling at the top level too and converts them to its rope_parameters).
// The model_type a llama-family model is written as: q/k/v biases are Qwen2's.
std::string hf_type_of(const model::GptConfig& c) {
  if (c.moe.enabled()) return "mixtral";  // io/hf_mixtral.hpp: the one MoE family written
  if (c.qkv_bias) return "qwen2";
  return c.hf_model_type.empty() ? "llama" : c.hf_model_type;
}

Json llama_config(const model::GptConfig& c) {
  const std::string type = hf_type_of(c);
  Json j = Json::object();
  j["architectures"] = {hf_architecture(c)};
  j["model_type"] = type;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.n_embd;
  // Mixtral: the experts' width (every block is an MoE block; the dense width is unused).
  j["intermediate_size"] = type == "mixtral" ? c.expert_width() : c.mlp_width();
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.kv_heads();
  j["head_dim"] = c.head_size();
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.block_size;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope.theta;
  if (c.rope.llama3_scaling) {
    Json s = Json::object();
    s["rope_type"] = "llama3";
    s["factor"] = c.rope.factor;
    s["low_freq_factor"] = c.rope.low_freq_factor;
    s["high_freq_factor"] = c.rope.high_freq_factor;
    s["original_max_position_embeddings"] = c.rope.original_max_position_embeddings;
    j["rope_scaling"] = s;
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tied_head;
  j["attention_dropout"] = 0.0;
  if (type == "llama") {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  } else if (type == "qwen2") {  // q/k/v biases are implied by the architecture
    j["use_sliding_window"] = c.sliding_window > 0;
    j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
    j["max_window_layers"] = c.sliding_window > 0 ? 0 : c.n_layer;
  } else if (type == "mixtral") {
    j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
    j["num_local_experts"] = c.moe.experts;
    j["num_experts_per_tok"] = c.moe.top_k;
    // The coefficient as is; HF's loss is the Switch loss over all layers' tokens at once
    // (load_balancing_loss_func), meshtrain's one per block summed (docs/moe.md).
    j["router_aux_loss_coef"] = c.moe.aux_loss_coeff;
    j["output_router_logits"] = false;
    j["router_jitter_noise"] = 0.0;
  } else {  // mistral
    j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
  }
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  return j;
}

// The end-of-text token of a tokenizer kind that has a fixed one (GPT-2's <|endoftext|>).
int eos_of(const std::string& tokenizer) { return tokenizer == "gpt2" ? 50256 : -1; }

void write_json(const Json& j, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw ConfigError(cat("cannot write ", tmp));
    out << json::dump(j, {100, 0}) << "\n";
    out.close();
    if (!out) throw ConfigError(cat("writing ", tmp, " failed (disk full?)"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw ConfigError(cat("cannot rename ", tmp, " to ", path));
}

}  // namespace

std::string hf_architecture(const model::GptConfig& c) {
  if (c.is_gpt2()) return "GPT2LMHeadModel";
  const std::string t = hf_type_of(c);
  if (t == "mixtral") return "MixtralForCausalLM";
  return t == "qwen2" ? "Qwen2ForCausalLM" : t == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM";
}

void write_hf_config(const model::GptConfig& c, const std::string& dir,
                     const std::string& tokenizer, const std::string& dtype) {
  std::filesystem::create_directories(dir);
  Json j = c.is_gpt2() ? gpt2_config(c) : llama_config(c);
  // Llama family: no end-of-text id known is null, not LlamaConfig's defaults 1 and 2 (which
  // would stop transformers' generate at byte 2). GPT-2's file stays as it was (GPT2Config's
  // default 50256 is GPT-2's tokenizer's end of text).
  const int eos = eos_of(tokenizer);
  const bool known = eos >= 0 && eos < c.vocab_size;
  if (!c.is_gpt2()) {
    j["bos_token_id"] = known ? Json(eos) : Json(nullptr);
    j["eos_token_id"] = known ? Json(eos) : Json(nullptr);
  }
  j["torch_dtype"] = torch_dtype(dtype);
  j["meshtrain_tokenizer"] = tokenizer;
  write_json(j, dir + "/config.json");
  // generate()'s defaults (GenerationConfig.from_model_config would derive the same).
  Json g = Json::object();
  g["_from_model_config"] = true;
  if (known) {
    g["bos_token_id"] = eos;
    g["eos_token_id"] = eos;
  }
  write_json(g, dir + "/generation_config.json");
}

template <class T>
void export_hf(const model::GptT<T>& m, const std::string& dir, const std::string& tokenizer,
               const HfExportOptions& options) {
  const auto& reg = m.registry();
  MESHTRAIN_CHECK(reg.tp_size() == 1 && reg.has_embedding() && reg.has_head() &&
                      m.params().span() > 0,
                  "export_hf writes a whole model (one rank, parameters allocated); the engine's "
                  "export_hf streams a distributed one");
  HfExportOptions opt = options;
  opt.tokenizer = tokenizer;
  HfFolderWriter w(m.config(), dir, opt);
  // One tensor at a time through host memory (the model's registry is the whole model's).
  for (const auto& p : w.registry().params()) {
    const model::ParamInfo& mine = reg.get(p.name);
    HostView1<float> h("meshtrain::export.tensor", mine.numel);
    auto src = Kokkos::subview(m.params(), std::make_pair(mine.offset, mine.offset + mine.numel));
    auto copy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, src);
    for (std::size_t i = 0; i < mine.numel; ++i) h(i) = static_cast<float>(copy(i));
    w.append(p, h.data());
  }
  w.finish();
}

template void import_hf<float>(model::GptT<float>&, const std::string&);
template void export_hf<float>(const model::GptT<float>&, const std::string&, const std::string&,
                               const HfExportOptions&);
#if MESHTRAIN_HAVE_BF16
template void import_hf<bf16>(model::GptT<bf16>&, const std::string&);
template void export_hf<bf16>(const model::GptT<bf16>&, const std::string&, const std::string&,
                              const HfExportOptions&);
template void import_hf<fp16>(model::GptT<fp16>&, const std::string&);
template void export_hf<fp16>(const model::GptT<fp16>&, const std::string&, const std::string&,
                              const HfExportOptions&);
#endif

}  // namespace meshtrain::io
