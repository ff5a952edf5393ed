// HuggingFace config.json: the text export writes (byte for byte what the hand-built writer
// wrote before nlohmann-json did), reading it back, and malformed files named in the error.
#include <filesystem>
#include <fstream>
#include <string>

#include "io_test_util.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/model/gpt.hpp"

using namespace meshtrain;
using io_test::config_error;
using io_test::has;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

model::GptConfig small() {
  model::GptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 50257;
  c.vocab_pad = 64;
  c.block_size = 1024;
  return c;
}

}  // namespace

TEST_CASE("config.json is written as before and reads back", "[io][hf]") {
  const std::string dir = io_test::temp_name("hf_cfg", "");
  io::write_hf_config(small(), dir, "by\"te");
  REQUIRE(read_all(dir + "/config.json") ==
          "{\n"
          "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
          "  \"model_type\": \"gpt2\",\n"
          "  \"activation_function\": \"gelu_new\",\n"
          "  \"n_layer\": 2,\n"
          "  \"n_head\": 4,\n"
          "  \"n_embd\": 64,\n"
          "  \"vocab_size\": 50257,\n"
          "  \"n_positions\": 1024,\n"
          "  \"n_ctx\": 1024,\n"
          "  \"layer_norm_epsilon\": 1e-05,\n"
          "  \"tie_word_embeddings\": true,\n"
          "  \"resid_pdrop\": 0.0,\n"
          "  \"embd_pdrop\": 0.0,\n"
          "  \"attn_pdrop\": 0.0,\n"
          "  \"torch_dtype\": \"float32\",\n"
          "  \"meshtrain_tokenizer\": \"by\\\"te\"\n"
          "}\n");
  const model::GptConfig back = io::read_hf_config(dir, 64);
  REQUIRE(back.n_layer == 2);
  REQUIRE(back.n_head == 4);
  REQUIRE(back.n_embd == 64);
  REQUIRE(back.vocab_size == 50257);
  REQUIRE(back.block_size == 1024);
  REQUIRE(io::read_hf_tokenizer(dir) == "by\"te");
  std::filesystem::remove_all(dir);
}

TEST_CASE("a malformed config.json is named in the error", "[io][hf]") {
  const std::string dir = io_test::temp_name("hf_bad", "");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/config.json";
  auto error_for = [&](const std::string& text) {
    io_test::write_file(path, text);
    return config_error([&] { io::read_hf_config(dir, 64); });
  };
  const std::string good_tail = R"("n_embd": 64, "vocab_size": 256, "n_positions": 128})";
  std::string w = error_for(R"({"n_layer": 2, "n_head": 4 )" + good_tail);
  INFO(w);
  CHECK(has(w, path + ": JSON error at byte 34 (line 1, column 35)"));
  CHECK(has(w, "expected '}'"));
  CHECK(has(error_for(R"({"n_layer": 2.5, "n_head": 4, )" + good_tail),
            path + ": n_layer: expected an integer, found 2.5"));
  CHECK(has(error_for(R"({"n_layer": 2, )" + good_tail), path + ": key 'n_head' is missing"));
  CHECK(has(error_for(R"({"n_layer": 2, "n_layer": 3, "n_head": 4, )" + good_tail),
            path + ": JSON error: key 'n_layer' appears twice"));
  CHECK(has(error_for(R"({"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256})"),
            path + ": key 'n_ctx' is missing"));  // neither n_positions nor n_ctx
  CHECK(has(error_for("[]"), path + ": expected an object with key 'n_layer', found an array"));
  io_test::write_file(path, R"({"meshtrain_tokenizer": 7})");
  CHECK(has(config_error([&] { io::read_hf_tokenizer(dir); }), path + ": expected a string"));
  CHECK(has(config_error([&] { io::read_hf_config(dir + "/none", 64); }),
            "cannot open HuggingFace config '" + dir + "/none/config.json'"));
  std::filesystem::remove_all(dir);
}

// LlamaForCausalLM's config.json as Meta ships Llama 3.2 1B (transformers 4: rope_theta and
// rope_scaling at the top level) and as transformers 5 writes it (rope_parameters).
TEST_CASE("a LlamaForCausalLM config.json gives the Llama 3 block", "[io][hf][llama]") {
  const std::string dir = io_test::temp_name("hf_llama", "");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/config.json";
  const std::string shape = R"("architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "tie_word_embeddings": true,
    "hidden_act": "silu", "attention_bias": false, "mlp_bias": false,)";
  const std::string scaling = R"("factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192, "rope_type": "llama3")";
  const model::GptConfig meta = model::preset("llama3.2-1b");
  io_test::write_file(path, "{" + shape + R"("rope_theta": 500000.0, "rope_scaling": {)" +
                                scaling + "}}");
  model::GptConfig c = io::read_hf_config(dir, 128);
  CHECK(c.key() == meta.key());
  io_test::write_file(path, "{" + shape + R"("rope_parameters": {"rope_theta": 500000.0, )" +
                                scaling + "}}");
  c = io::read_hf_config(dir, 128);
  CHECK(c.key() == meta.key());
  // What the Llama block does not have is named.
  std::string biased = shape;
  biased.replace(biased.find(R"("attention_bias": false)"), 23, R"("attention_bias": true)");
  io_test::write_file(path, "{" + biased + R"("rope_theta": 5e5})");
  CHECK(has(config_error([&] { io::read_hf_config(dir, 128); }),
            path + ": attention_bias is set; meshtrain's Llama block has biases on q, k and v "
                   "only (Qwen2)"));
  io_test::write_file(path, "{" + shape + R"("rope_scaling": {"rope_type": "yarn"}})");
  CHECK(has(config_error([&] { io::read_hf_config(dir, 128); }),
            path + ": rope_type 'yarn' is not supported"));
}

// Qwen2ForCausalLM (Qwen2.5 0.5B's config.json shape) and MistralForCausalLM: Llama's names with
// q/k/v biases, and with a sliding window; written back as the same model type.
TEST_CASE("Qwen2 and Mistral config.json files give the Llama block", "[io][hf][llama]") {
  const std::string dir = io_test::temp_name("hf_qwen2", "");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/config.json";
  io_test::write_file(path, R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "use_sliding_window": false, "max_window_layers": 21,
    "tie_word_embeddings": true, "hidden_act": "silu", "torch_dtype": "bfloat16"})");
  model::GptConfig c = io::read_hf_config(dir, 128);
  CHECK(c.qkv_bias);
  CHECK(c.sliding_window == 0);
  CHECK(c.kv_heads() == 2);
  CHECK(c.head_size() == 64);
  CHECK(c.tied_head);
  CHECK(c.rope.theta == 1e6);
  CHECK(c.norm_eps == 1e-6);
  // 494M parameters: Qwen2.5-0.5B's count.
  CHECK(c.num_parameters() == 494032768LL);
  // Written back and read again: the same model, Qwen2's architecture.
  const std::string out = dir + "/written";
  io::write_hf_config(c, out, "byte");
  CHECK(io::read_hf_config(out, 128).key() == c.key());
  {
    std::ifstream in(out + "/config.json");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(has(text, R"("model_type": "qwen2")"));
    CHECK(has(text, R"("Qwen2ForCausalLM")"));
    CHECK(has(text, R"("use_sliding_window": false)"));
  }
  // Mistral 7B v0.1: a 4096 window; v0.3: null; no key: MistralConfig's default 4096.
  const std::string mistral = R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "tie_word_embeddings": false, "hidden_act": "silu")";
  io_test::write_file(path, mistral + R"(, "sliding_window": null})");
  c = io::read_hf_config(dir, 128);
  CHECK(!c.qkv_bias);
  CHECK(c.sliding_window == 0);
  CHECK(c.hf_model_type == "mistral");
  CHECK(c.num_parameters() == 7248023552LL);  // Mistral 7B v0.3
  io::write_hf_config(c, out, "byte");
  model::GptConfig back = io::read_hf_config(out, 128);
  CHECK(back.key() == c.key());
  CHECK(back.hf_model_type == "mistral");
  io_test::write_file(path, mistral + R"(, "sliding_window": 4096})");
  CHECK(io::read_hf_config(dir, 128).sliding_window == 4096);
  io_test::write_file(path, mistral + "}");
  c = io::read_hf_config(dir, 128);
  CHECK(c.sliding_window == 4096);
  io::write_hf_config(c, out, "byte");
  CHECK(io::read_hf_config(out, 128).sliding_window == 4096);
  // A window is refused for sequences longer than it, accepted up to its length.
  c.n_layer = 1, c.n_embd = 64, c.n_head = 4, c.n_kv_head = 2, c.intermediate_size = 64;
  c.vocab_size = 64, c.sliding_window = 8, c.block_size = 16;
  CHECK(has(config_error([&] { model::Gpt m(c, 1, 16); }),
            "model.sliding_window=8 (Mistral's attention window) is shorter than "
            "train.seq_len=16"));
  model::Gpt ok(c, 1, 8);
  std::filesystem::remove_all(dir);
}

// MixtralForCausalLM: Mixtral-8x7B-v0.1's config.json (transformers 4 spelling) and the same
// model as transformers 5 writes it (rope_parameters) with keys left to MixtralConfig's defaults.
TEST_CASE("a Mixtral config.json gives the Llama block with MoE blocks", "[io][hf][moe]") {
  const std::string dir = io_test::temp_name("hf_mixtral", "");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/config.json";
  io_test::write_file(path, R"({"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": true,
    "vocab_size": 32000})");
  model::GptConfig c = io::read_hf_config(dir, 128);
  CHECK(!c.is_gpt2());
  CHECK(c.moe.experts == 8);
  CHECK(c.moe.top_k == 2);
  CHECK(c.moe.layer_freq == 1);
  CHECK(c.expert_width() == 14336);
  CHECK(c.moe.aux_loss_coeff == 0.02);
  CHECK(c.moe.capacity_factor == 0.0);
  CHECK(c.moe.router_score == "softmax");
  CHECK(c.moe.shared_ffn == 0);
  CHECK(c.sliding_window == 0);
  CHECK(c.kv_heads() == 8);
  CHECK(c.rope.theta == 1e6);
  CHECK(!c.tied_head);
  CHECK(c.num_parameters() == 46702792704LL);  // Mixtral 8x7B's 46.7B
  CHECK(io::hf_architecture(c) == "MixtralForCausalLM");
  const std::string out = dir + "/written";
  io::write_hf_config(c, out, "byte");
  CHECK(io::read_hf_config(out, 128).key() == c.key());
  {
    const std::string text = read_all(out + "/config.json");
    CHECK(has(text, R"("MixtralForCausalLM")"));
    CHECK(has(text, R"("model_type": "mixtral")"));
    CHECK(has(text, R"("num_local_experts": 8)"));
    CHECK(has(text, R"("num_experts_per_tok": 2)"));
    CHECK(has(text, R"("intermediate_size": 14336)"));
    CHECK(has(text, R"("router_aux_loss_coef": 0.02)"));
    CHECK(has(text, R"("output_router_logits": false)"));
    CHECK(has(text, R"("sliding_window": null)"));
  }
  // transformers 5: rope_parameters; num_key_value_heads, rms_norm_eps, the experts' keys and
  // sliding_window left out are MixtralConfig's defaults (8, 1e-5, 8 of top-2, 0.001, none).
  io_test::write_file(path, R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 8, "vocab_size": 100, "max_position_embeddings": 64,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "dtype": "float32"})");
  c = io::read_hf_config(dir, 64);
  CHECK(c.kv_heads() == 8);
  CHECK(c.norm_eps == 1e-5);
  CHECK(c.rope.theta == 5e5);
  CHECK(c.moe.experts == 8);
  CHECK(c.moe.top_k == 2);
  CHECK(c.moe.aux_loss_coeff == 0.001);
  CHECK(c.expert_width() == 96);
  CHECK(c.sliding_window == 0);
  // A window is kept; top-1 routing (Mixtral weighs its one choice by 1) is refused by name.
  io_test::write_file(path, R"({"model_type": "mixtral", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8,
    "vocab_size": 100, "max_position_embeddings": 64, "sliding_window": 32})");
  CHECK(io::read_hf_config(dir, 64).sliding_window == 32);
  io_test::write_file(path, R"({"model_type": "mixtral", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8,
    "vocab_size": 100, "max_position_embeddings": 64, "num_experts_per_tok": 1})");
  CHECK(has(config_error([&] { io::read_hf_config(dir, 64); }),
            "config.json: num_experts_per_tok=1: Mixtral renormalises"));
  std::filesystem::remove_all(dir);
}
