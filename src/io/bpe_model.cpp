// Byte-level BPE shared by the GPT-2 and HuggingFace tokenizers (bpe_model.hpp).
#include "bpe_model.hpp"

#include <limits>

#include "meshtrain/core/error.hpp"
#include "pcre2_regex.hpp"

namespace meshtrain::io::detail {

namespace {

std::string utf8(std::uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {  // bytes_to_unicode only produces code points below 0x800
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// The code point of the valid UTF-8 sequence of `len` bytes at s[i].
std::uint32_t code_point(std::string_view s, std::size_t i, std::size_t len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  std::uint32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (std::size_t k = 1; k < len; ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

}  // namespace

BpeModel::BpeModel() {
  // openai/gpt-2 bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68
  // bytes to 256, 257, ... in byte order, so no token contains whitespace or control chars.
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const std::uint32_t cp = printable ? static_cast<std::uint32_t>(b) : next++;
    byte_to_sym[b] = utf8(cp);
    cp_to_byte[cp] = static_cast<unsigned char>(b);
  }
}

void BpeModel::add_token(const std::string& tok, std::int64_t id, const std::string& where) {
  if (id < 0 || id >= std::numeric_limits<std::int32_t>::max())
    throw ConfigError(cat(where, ": token '", tok, "' has id ", id, ", outside [0, 2^31 - 1)"));
  if (!vocab.emplace(tok, static_cast<int>(id)).second)
    throw ConfigError(cat(where, ": token '", tok, "' appears twice"));
  if (static_cast<std::size_t>(id) >= id_to_token.size()) {
    id_to_token.resize(id + 1);
    id_used.resize(id + 1, false);
  }
  if (id_used[id])
    throw ConfigError(
        cat(where, ": id ", id, " is used by '", id_to_token[id], "' and '", tok, "'"));
  id_to_token[id] = tok;
  id_used[id] = true;
}

void BpeModel::add_merge(const std::string& a, const std::string& b, const std::string& where) {
  for (const std::string& t : {a, b, a + b})
    if (!vocab.count(t))
      throw ConfigError(cat(where, ": token '", t, "' is not in the vocabulary of ", source,
                            " (the vocabulary and the merges must come from the same tokenizer)"));
  ranks.emplace(a + " " + b, static_cast<int>(ranks.size()));
}

std::vector<std::int32_t> BpeModel::encode(std::string_view piece) const {
  std::vector<std::string> syms;
  syms.reserve(piece.size());
  for (char c : piece) syms.push_back(byte_to_sym[static_cast<unsigned char>(c)]);
  if (ignore_merges) {
    std::string whole;
    for (const auto& s : syms) whole += s;
    auto it = vocab.find(whole);
    if (it != vocab.end()) return {it->second};
  }
  // GPT-2's loop: merge every occurrence of the best-ranked pair, left to right, until no
  // ranked pair is left. HuggingFace's BPE (a queue of (rank, position)) merges the same pairs.
  std::string key;
  while (syms.size() > 1) {
    int best = std::numeric_limits<int>::max();
    std::size_t best_i = 0;
    for (std::size_t i = 0; i + 1 < syms.size(); ++i) {
      key.assign(syms[i]).append(" ").append(syms[i + 1]);
      auto it = ranks.find(key);
      if (it != ranks.end() && it->second < best) {
        best = it->second;
        best_i = i;
      }
    }
    if (best == std::numeric_limits<int>::max()) break;
    const std::string a = syms[best_i], b = syms[best_i + 1];
    std::vector<std::string> merged;
    merged.reserve(syms.size());
    for (std::size_t i = 0; i < syms.size();) {
      if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
        merged.push_back(a + b);
        i += 2;
      } else {
        merged.push_back(std::move(syms[i]));
        ++i;
      }
    }
    syms = std::move(merged);
  }
  std::vector<std::int32_t> ids;
  ids.reserve(syms.size());
  for (const auto& s : syms) {
    auto it = vocab.find(s);
    if (it == vocab.end())
      throw ConfigError(cat("tokenizer vocabulary '", source, "' has no token '", s,
                            "' (a byte-level vocabulary must hold all 256 byte symbols)"));
    ids.push_back(it->second);
  }
  return ids;
}

std::string BpeModel::symbols_to_bytes(const std::string& syms) const {
  std::string out;
  out.reserve(syms.size());
  for (std::size_t i = 0; i < syms.size();) {
    const std::size_t len = utf8_length(syms, i);
    if (len == 0) {  // not UTF-8: cannot be a byte symbol, stands for itself
      out += syms[i++];
      continue;
    }
    auto it = cp_to_byte.find(code_point(syms, i, len));
    if (it != cp_to_byte.end())
      out += static_cast<char>(it->second);
    else
      out.append(syms, i, len);
    i += len;
  }
  return out;
}

}  // namespace meshtrain::io::detail
