#include "meshtrain/model/config.hpp"

#include "meshtrain/core/error.hpp"

namespace meshtrain::model {

long long GptConfig::num_parameters() const {
  const long long C = n_embd, L = n_layer;
  const long long per_block = 2 * C            // ln_1
                              + C * 3 * C + 3 * C  // c_attn
                              + C * C + C          // attn.c_proj
                              + 2 * C              // ln_2
                              + C * 4 * C + 4 * C  // c_fc
                              + 4 * C * C + C;     // mlp.c_proj
  return static_cast<long long>(vocab_size) * C + static_cast<long long>(block_size) * C +
         L * per_block + 2 * C;
}

double GptConfig::flops_per_token(int seq_len) const {
  return 6.0 * static_cast<double>(num_parameters()) +
         12.0 * n_layer * static_cast<double>(n_embd) * seq_len;
}

void GptConfig::validate() const {
  MESHTRAIN_CONFIG_CHECK(n_layer > 0, "model.n_layer=", n_layer, " must be positive");
  MESHTRAIN_CONFIG_CHECK(n_head > 0, "model.n_head=", n_head, " must be positive");
  MESHTRAIN_CONFIG_CHECK(n_embd > 0 && n_embd % n_head == 0, "model.n_embd=", n_embd,
                         " must be a positive multiple of model.n_head=", n_head);
  MESHTRAIN_CONFIG_CHECK(vocab_size > 0, "model.vocab_size=", vocab_size, " must be positive");
  MESHTRAIN_CONFIG_CHECK(vocab_pad > 0, "model.vocab_pad=", vocab_pad, " must be positive");
  MESHTRAIN_CONFIG_CHECK(block_size > 0, "model.block_size=", block_size, " must be positive");
}

std::string GptConfig::describe() const {
  return cat(name, ": ", n_layer, " layers, ", n_head, " heads, n_embd ", n_embd, ", vocab ",
             vocab_size, " (padded ", padded_vocab(), "), block ", block_size, ", ",
             num_parameters() / 1e6, "M parameters");
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
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError(cat("model.preset='", name, "' is not one of ", names, ", custom"));
}

std::vector<std::string> preset_names() {
  return {"gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "cpu-bench", "demo"};
}

}  // namespace meshtrain::model
