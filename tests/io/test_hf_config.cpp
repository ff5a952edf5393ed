// HuggingFace config.json: the text export writes (byte for byte what the hand-built writer
// wrote before nlohmann-json did), reading it back, and malformed files named in the error.
#include <filesystem>
#include <fstream>
#include <string>

#include "io_test_util.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"

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
            path + ": attention_bias is set; meshtrain's Llama block has no biases"));
  io_test::write_file(path, "{" + shape + R"("rope_scaling": {"rope_type": "yarn"}})");
  CHECK(has(config_error([&] { io::read_hf_config(dir, 128); }),
            path + ": rope_type 'yarn' is not supported"));
}
