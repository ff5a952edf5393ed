// GPT-2's byte-level BPE (Radford et al. 2019; openai/gpt-2 src/encoder.py), reading
// HuggingFace's vocab.json + merges.txt:
//   1. pre-tokenise the text with GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      run by PCRE2 with Unicode properties (pcre2_regex.hpp),
//   2. map each piece's bytes to printable code points (bytes_to_unicode), so every byte string
//      is a string of vocabulary characters,
//   3. merge adjacent symbols, lowest merges.txt rank first, until no ranked pair is left,
//   4. look the symbols up in vocab.json (bpe_model.cpp).
// Decoding concatenates the token strings and maps the code points back to bytes.
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "bpe_model.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/io/tokenizer.hpp"
#include "pcre2_regex.hpp"

namespace meshtrain::io {

const std::string& gpt2_pattern() {
  static const std::string p =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  return p;
}

namespace {
const detail::Pcre2Regex& gpt2_regex() {
  static const detail::Pcre2Regex re(gpt2_pattern(), "GPT-2 pre-tokenizer");
  return re;
}
}  // namespace

// Splits text into GPT-2 pre-tokens and calls emit(piece) for each, in order. The pattern's last
// alternative \s+ matches any whitespace, so together the matches cover the text.
template <class Emit>
static void pretokenize(std::string_view s, Emit&& emit) {
  gpt2_regex().for_each_match(s, [&](std::size_t b, std::size_t e) { emit(s.substr(b, e - b)); });
}

std::vector<std::string> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string> out;
  pretokenize(text, [&](std::string_view piece) { out.emplace_back(piece); });
  return out;
}

struct Gpt2BpeTokenizer::Impl {
  std::string vocab_path, merges_path;
  detail::BpeModel bpe;
  int eot = -1;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache;

  void load_vocab(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ConfigError(cat("tokenizer vocabulary '", path, "' cannot be opened"));
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string where = cat("tokenizer vocabulary '", path, "'");
    const Json j = json::parse(ss.str(), where);
    if (!j.is_object() || j.empty())
      throw ConfigError(cat(where, " must be a non-empty JSON object {\"token\": id, ...}"));
    bpe.source = path;
    for (const auto& [tok, v] : j.items())
      bpe.add_token(tok, json::as_int(v, cat(where, ", token '", tok, "'")), where);
    auto it = bpe.vocab.find("<|endoftext|>");
    if (it != bpe.vocab.end()) eot = it->second;
  }

  void load_merges(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ConfigError(cat("tokenizer merges '", path, "' cannot be opened"));
    std::string line;
    int line_no = 0;
    int blank_line = 0;  // a blank line is fine only at the end of the file
    while (std::getline(in, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line_no == 1 && line.rfind("#version", 0) == 0) continue;
      if (line.empty()) {
        if (!blank_line) blank_line = line_no;
        continue;
      }
      const std::string where = cat("tokenizer merges '", path, "' line ", line_no, " ('", line, "')");
      if (blank_line) throw ConfigError(cat(where, ": follows the blank line ", blank_line));
      const auto sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
          line.find(' ', sp + 1) != std::string::npos)
        throw ConfigError(cat(where, ": expected two tokens separated by one space"));
      bpe.add_merge(line.substr(0, sp), line.substr(sp + 1), where);
    }
  }
};

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string& vocab_json, const std::string& merges_txt)
    : impl_(std::make_unique<Impl>()) {
  impl_->vocab_path = vocab_json;
  impl_->merges_path = merges_txt;
  impl_->load_vocab(vocab_json);
  impl_->load_merges(merges_txt);
}

Gpt2BpeTokenizer::~Gpt2BpeTokenizer() = default;

int Gpt2BpeTokenizer::vocab_size() const { return static_cast<int>(impl_->bpe.id_to_token.size()); }
int Gpt2BpeTokenizer::eot() const { return impl_->eot; }

std::vector<std::int32_t> Gpt2BpeTokenizer::encode(std::string_view text) const {
  // Words repeat (Zipf), so a cache of pre-token -> ids skips most BPE loops. Bounded: cleared
  // when full rather than LRU, which is simple and costs little on natural text.
  constexpr std::size_t kCacheMax = 1 << 18;
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3);
  std::lock_guard<std::mutex> lock(impl_->cache_mutex);
  pretokenize(text, [&](std::string_view piece) {
    auto it = impl_->cache.find(std::string(piece));
    if (it == impl_->cache.end()) {
      if (impl_->cache.size() >= kCacheMax) impl_->cache.clear();
      it = impl_->cache.emplace(std::string(piece), impl_->bpe.encode(piece)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  });
  return out;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<std::int32_t>& tokens) const {
  const auto& b = impl_->bpe;
  std::string syms;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int32_t t = tokens[i];
    if (t < 0 || static_cast<std::size_t>(t) >= b.id_used.size() || !b.id_used[t])
      throw ConfigError(cat("token id ", t, " at position ", i, " is not in the vocabulary '",
                            impl_->vocab_path, "'"));
    syms += b.id_to_token[t];
  }
  return b.symbols_to_bytes(syms);
}

}  // namespace meshtrain::io
