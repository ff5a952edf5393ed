// The byte tokenizer and the tokenizer factory. The GPT-2 BPE tokenizer is in bpe_tokenizer.cpp.
#include "meshtrain/io/tokenizer.hpp"

#include "meshtrain/core/error.hpp"

namespace meshtrain::io {

std::vector<std::int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::decode(const std::vector<std::int32_t>& tokens) const {
  std::string out(tokens.size(), '\0');
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 255)
      throw ConfigError(cat("byte tokenizer: token id ", tokens[i], " at position ", i,
                            " is not a byte (0..255); was the model trained with another tokenizer?"));
    out[i] = static_cast<char>(tokens[i]);
  }
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_json,
                                          const std::string& merges_txt) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (kind == "gpt2") {
    if (vocab_json.empty() || merges_txt.empty())
      throw ConfigError("tokenizer 'gpt2' needs both a vocab.json and a merges.txt file");
    return std::make_unique<Gpt2BpeTokenizer>(vocab_json, merges_txt);
  }
  throw ConfigError(cat("tokenizer '", kind, "' is unknown; expected 'byte' or 'gpt2'"));
}

}  // namespace meshtrain::io
