#pragma once
// Private to src/io/: byte-level BPE (GPT-2's scheme, which HuggingFace's byte-level BPE
// tokenizers share): the byte-to-symbol map, the vocabulary, the merge ranks, the merge loop and
// the decoding of symbol strings back to bytes. Gpt2BpeTokenizer (vocab.json + merges.txt) and
// HfTokenizer (tokenizer.json) fill one each.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace meshtrain::io::detail {

struct BpeModel {
  std::string source;                          // the file, for messages
  std::string byte_to_sym[256];                // byte -> UTF-8 of its code point
  std::unordered_map<std::uint32_t, unsigned char> cp_to_byte;
  std::unordered_map<std::string, int> vocab;  // token string -> id
  std::vector<std::string> id_to_token;        // "" where unused
  std::vector<bool> id_used;
  std::unordered_map<std::string, int> ranks;  // "a b" -> merge rank (0 = first)
  // HuggingFace's BPE option (Llama 3 sets it): a pre-token that is itself in the vocabulary
  // is that token, without merging.
  bool ignore_merges = false;

  BpeModel();  // builds the byte map (openai/gpt-2 bytes_to_unicode)
  // Adds a vocabulary entry; ConfigError naming `where` for a duplicate token or id.
  void add_token(const std::string& token, std::int64_t id, const std::string& where);
  // Adds merge "a b" at the next rank (a repeated pair keeps its first rank); ConfigError
  // naming `where` unless a, b and ab are in the vocabulary.
  void add_merge(const std::string& a, const std::string& b, const std::string& where);
  // The byte-level symbols of the raw bytes `piece` merged by rank, as ids.
  std::vector<std::int32_t> encode(std::string_view piece) const;
  // The bytes that a concatenation of token strings stands for (characters outside the byte
  // map stand for themselves).
  std::string symbols_to_bytes(const std::string& syms) const;
};

}  // namespace meshtrain::io::detail
