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

// HF LlamaConfig's fields (defaults as LlamaConfig's: n_kv_head = n_head, head_dim = hidden /
// heads, rms_norm_eps 1e-6, rope_theta 1e4, untied). rope_theta and rope_scaling at the top
// level (transformers 4) or in rope_parameters (transformers 5).
void read_llama_config(const Json& j, const std::string& path, model::GptConfig& c) {
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
  c.n_kv_head = json::find(j, "num_key_value_heads") ? int_of(j, "num_key_value_heads") : c.n_head;
  const Json* hd = json::find(j, "head_dim");
  c.head_dim = hd && !hd->is_null() ? int_of(j, "head_dim") : 0;
  c.norm_eps = json::find(j, "rms_norm_eps") ? num_of(j, "rms_norm_eps") : 1e-6;
  const Json* tie = json::find(j, "tie_word_embeddings");
  c.tied_head = tie && tie->is_boolean() && tie->get<bool>();
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    const Json* b = json::find(j, key);
    MESHTRAIN_CONFIG_CHECK(!b || (b->is_boolean() && !b->get<bool>()), path, ": ", key,
                           " is set; meshtrain's Llama block has no biases");
  }
  if (const Json* act = json::find(j, "hidden_act")) {
    const std::string& a = json::as_string(*act, path + ": hidden_act");
    MESHTRAIN_CONFIG_CHECK(a == "silu", path, ": hidden_act '", a,
                           "' is not the SwiGLU activation meshtrain implements (silu)");
  }
  const Json* rp = json::find(j, "rope_parameters");
  const Json& rope = rp && rp->is_object() ? *rp : j;
  c.rope = kernels::RopeConfig{};
  c.rope.theta = json::find(rope, "rope_theta") ? num_of(rope, "rope_theta") : 1e4;
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
    MESHTRAIN_CONFIG_CHECK(type == "gpt2" || type == "llama", path, ": model_type '", type,
                           "' is not supported (meshtrain reads GPT2LMHeadModel, model_type "
                           "gpt2, and LlamaForCausalLM, model_type llama)");
    if (type == "llama") {
      read_llama_config(j, path, c);
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
Json llama_config(const model::GptConfig& c) {
  Json j = Json::object();
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.n_embd;
  j["intermediate_size"] = c.mlp_width();
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
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["initializer_range"] = 0.02;
  j["pretraining_tp"] = 1;
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

void write_hf_config(const model::GptConfig& c, const std::string& dir,
                     const std::string& tokenizer, const std::string& dtype) {
  std::filesystem::create_directories(dir);
  Json j = c.is_gpt2() ? gpt2_config(c) : llama_config(c);
  const int eos = eos_of(tokenizer);
  if (eos >= 0 && eos < c.vocab_size) {
    j["bos_token_id"] = eos;
    j["eos_token_id"] = eos;
  }
  j["torch_dtype"] = torch_dtype(dtype);
  j["meshtrain_tokenizer"] = tokenizer;
  write_json(j, dir + "/config.json");
  // generate()'s defaults (GenerationConfig.from_model_config would derive the same).
  Json g = Json::object();
  g["_from_model_config"] = true;
  if (eos >= 0 && eos < c.vocab_size) {
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
