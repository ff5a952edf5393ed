#pragma once
// GPT-2 model configuration and named presets.
#include <string>
#include <vector>

namespace meshtrain::model {

struct GptConfig {
  std::string name = "custom";
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int vocab_size = 256;   // the real vocabulary
  int vocab_pad = 64;     // the embedding is padded to a multiple of this (speed); padding rows
                          // are zero and masked out of the loss
  int block_size = 128;   // maximum sequence length (rows of the position embedding)

  int padded_vocab() const { return (vocab_size + vocab_pad - 1) / vocab_pad * vocab_pad; }
  int head_size() const { return n_embd / n_head; }
  // Parameters counted once (tied LM head not counted twice), padding rows excluded.
  long long num_parameters() const;
  // Training FLOPs per token: 6 N + 12 n_layer n_embd T (PaLM appendix B; attention included).
  double flops_per_token(int seq_len) const;
  // Throws ConfigError naming model.* options when inconsistent.
  void validate() const;
  std::string describe() const;
};

// gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, cpu-bench, demo. ConfigError for unknown names.
GptConfig preset(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace meshtrain::model
