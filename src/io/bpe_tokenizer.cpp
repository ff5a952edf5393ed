// GPT-2's byte-level BPE (Radford et al. 2019; openai/gpt-2 src/encoder.py), reading
// HuggingFace's vocab.json + merges.txt:
//   1. pre-tokenise the text with GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (implemented by hand below; see classify() for how code points are put into classes),
//   2. map each piece's bytes to printable code points (bytes_to_unicode), so every byte string
//      is a string of vocabulary characters,
//   3. merge adjacent symbols, lowest merges.txt rank first, until no ranked pair is left,
//   4. look the symbols up in vocab.json.
// Decoding concatenates the token strings and maps the code points back to bytes.
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "meshtrain/core/error.hpp"
#include "meshtrain/io/json.hpp"
#include "meshtrain/io/tokenizer.hpp"

namespace meshtrain::io {

namespace {

enum class Cls : unsigned char { letter, number, space, other };

// Unicode character classes without a Unicode database (an approximation of GPT-2's \p{L}, \p{N},
// \s). Exact for ASCII, Latin-1, General Punctuation (curly quotes, dashes), currency, arrows and
// mathematical operators, box drawing and symbols, emoji, and whitespace (Unicode's White_Space
// property); every other non-ASCII code point counts as a letter, so for example CJK punctuation
// and non-ASCII digits may be split differently from GPT-2. Bytes that are not valid UTF-8 count
// as letters.
Cls classify(std::uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return Cls::letter;
    if (cp >= '0' && cp <= '9') return Cls::number;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return Cls::space;
    return Cls::other;
  }
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
      cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000)
    return Cls::space;
  if (cp < 0xA0) return Cls::other;  // C1 controls
  if (cp <= 0xBF) {
    if (cp == 0xAA || cp == 0xB5 || cp == 0xBA) return Cls::letter;  // ª µ º
    if (cp == 0xB2 || cp == 0xB3 || cp == 0xB9 || (cp >= 0xBC && cp <= 0xBE)) return Cls::number;
    return Cls::other;  // ¡ ¢ £ « ° ± ¿ ...
  }
  if (cp == 0xD7 || cp == 0xF7) return Cls::other;  // × ÷
  if (cp >= 0x2000 && cp <= 0x206F) return Cls::other;  // ‘ ’ “ ” – — … and format characters
  if (cp >= 0x20A0 && cp <= 0x20CF) return Cls::other;  // currency: € ₹ ...
  if (cp >= 0x2190 && cp <= 0x22FF) return Cls::other;  // arrows, mathematical operators
  if (cp >= 0x2500 && cp <= 0x26FF) return Cls::other;  // box drawing, shapes, symbols
  if (cp >= 0x1F300 && cp <= 0x1FAFF) return Cls::other;  // emoji and pictographs
  return Cls::letter;
}

constexpr std::uint32_t kInvalid = 0xFFFFFFFF;

// Decodes the code point at s[i]; returns its length in bytes (1 for an invalid byte).
std::size_t decode_utf8(std::string_view s, std::size_t i, std::uint32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  std::size_t len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    cp = kInvalid;
    return 1;
  }
  cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b >> 6) != 2) {
      cp = kInvalid;
      return 1;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  return len;
}

struct Ch {
  Cls cls;
  std::size_t len;
};

Ch char_at(std::string_view s, std::size_t i) {
  std::uint32_t cp;
  const std::size_t len = decode_utf8(s, i, cp);
  return {cp == kInvalid ? Cls::letter : classify(cp), len};
}

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

}  // namespace

// Splits text into GPT-2 pre-tokens and calls emit(piece) for each, in order.
template <class Emit>
static void pretokenize(std::string_view s, Emit&& emit) {
  static constexpr std::string_view kContractions[] = {"s", "t", "re", "ve", "m", "ll", "d"};
  std::size_t i = 0;
  const std::size_t n = s.size();
  while (i < n) {
    if (s[i] == '\'') {  // 's|'t|'re|'ve|'m|'ll|'d, tried before anything else
      bool matched = false;
      for (auto c : kContractions) {
        if (s.substr(i + 1, c.size()) == c) {
          emit(s.substr(i, 1 + c.size()));
          i += 1 + c.size();
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    const Ch c0 = char_at(s, i);
    std::size_t j = i;
    Cls run = c0.cls;
    if (c0.cls == Cls::space && s[i] == ' ' && i + 1 < n) {
      // " ?\p{L}+" and friends: one leading space joins the run that follows it.
      const Ch c1 = char_at(s, i + 1);
      if (c1.cls != Cls::space) {
        run = c1.cls;
        j = i + 1;
      }
    }
    if (run != Cls::space) {
      while (j < n) {
        const Ch c = char_at(s, j);
        if (c.cls != run) break;
        j += c.len;
      }
      emit(s.substr(i, j - i));
      i = j;
      continue;
    }
    // "\s+(?!\S)|\s+": a whitespace run up to the end of the text is one piece; otherwise its
    // last character is left to prefix the next word (" ?\p{L}+"), unless the run is one
    // character long, which "\s+" then takes alone.
    std::size_t last = i;
    j = i;
    while (j < n) {
      const Ch c = char_at(s, j);
      if (c.cls != Cls::space) break;
      last = j;
      j += c.len;
    }
    const std::size_t end = (j == n || last == i) ? j : last;
    emit(s.substr(i, end - i));
    i = end;
  }
}

std::vector<std::string> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string> out;
  pretokenize(text, [&](std::string_view piece) { out.emplace_back(piece); });
  return out;
}

struct Gpt2BpeTokenizer::Impl {
  std::string vocab_path, merges_path;
  std::string byte_to_sym[256];                             // byte -> UTF-8 of its code point
  std::unordered_map<std::uint32_t, unsigned char> cp_to_byte;
  std::unordered_map<std::string, int> vocab;               // token string -> id
  std::vector<std::string> id_to_token;
  std::vector<bool> id_used;
  std::unordered_map<std::string, int> ranks;               // "a b" (merges.txt line) -> rank
  int eot = -1;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache;

  void init_byte_map() {
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

  void load_vocab(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ConfigError(cat("tokenizer vocabulary '", path, "' cannot be opened"));
    std::stringstream ss;
    ss << in.rdbuf();
    const Json j = Json::parse(ss.str(), cat("tokenizer vocabulary '", path, "'"));
    if (j.kind != Json::Kind::object || j.obj.empty())
      throw ConfigError(cat("tokenizer vocabulary '", path,
                            "' must be a non-empty JSON object {\"token\": id, ...}"));
    for (const auto& [tok, v] : j.obj) {
      const std::int64_t id = v.as_int(cat("tokenizer vocabulary '", path, "', token '", tok, "'"));
      if (id < 0 || id >= std::numeric_limits<std::int32_t>::max())
        throw ConfigError(cat("tokenizer vocabulary '", path, "': token '", tok, "' has id ", id,
                              ", outside [0, 2^31 - 1)"));
      if (!vocab.emplace(tok, static_cast<int>(id)).second)
        throw ConfigError(cat("tokenizer vocabulary '", path, "': token '", tok, "' appears twice"));
      if (static_cast<std::size_t>(id) >= id_to_token.size()) {
        id_to_token.resize(id + 1);
        id_used.resize(id + 1, false);
      }
      if (id_used[id])
        throw ConfigError(cat("tokenizer vocabulary '", path, "': id ", id, " is used by '",
                              id_to_token[id], "' and '", tok, "'"));
      id_to_token[id] = tok;
      id_used[id] = true;
    }
    auto it = vocab.find("<|endoftext|>");
    if (it != vocab.end()) eot = it->second;
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
      auto bad = [&](const std::string& why) {
        return ConfigError(cat("tokenizer merges '", path, "' line ", line_no, " ('", line,
                               "'): ", why));
      };
      if (blank_line) throw bad(cat("follows the blank line ", blank_line));
      const auto sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
          line.find(' ', sp + 1) != std::string::npos)
        throw bad("expected two tokens separated by one space");
      const std::string a = line.substr(0, sp), b = line.substr(sp + 1);
      for (const std::string& t : {a, b, a + b})
        if (!vocab.count(t))
          throw bad(cat("token '", t, "' is not in ", vocab_path,
                        " (vocab.json and merges.txt must come from the same tokenizer)"));
      ranks.emplace(line, static_cast<int>(ranks.size()));  // a repeated pair keeps its first rank
    }
  }

  // BPE of one pre-token; the loop is GPT-2's: merge every occurrence of the best-ranked pair.
  std::vector<std::int32_t> bpe(std::string_view piece) const {
    std::vector<std::string> syms;
    syms.reserve(piece.size());
    for (char c : piece) syms.push_back(byte_to_sym[static_cast<unsigned char>(c)]);
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
        throw ConfigError(cat("tokenizer vocabulary '", vocab_path, "' has no token '", s,
                              "' (a byte-level vocabulary must hold all 256 byte symbols)"));
      ids.push_back(it->second);
    }
    return ids;
  }
};

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string& vocab_json, const std::string& merges_txt)
    : impl_(std::make_unique<Impl>()) {
  impl_->vocab_path = vocab_json;
  impl_->merges_path = merges_txt;
  impl_->init_byte_map();
  impl_->load_vocab(vocab_json);
  impl_->load_merges(merges_txt);
}

Gpt2BpeTokenizer::~Gpt2BpeTokenizer() = default;

int Gpt2BpeTokenizer::vocab_size() const { return static_cast<int>(impl_->id_to_token.size()); }
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
      it = impl_->cache.emplace(std::string(piece), impl_->bpe(piece)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  });
  return out;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<std::int32_t>& tokens) const {
  std::string syms;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int32_t t = tokens[i];
    if (t < 0 || static_cast<std::size_t>(t) >= impl_->id_used.size() || !impl_->id_used[t])
      throw ConfigError(cat("token id ", t, " at position ", i, " is not in the vocabulary '",
                            impl_->vocab_path, "'"));
    syms += impl_->id_to_token[t];
  }
  std::string out;
  out.reserve(syms.size());
  for (std::size_t i = 0; i < syms.size();) {
    std::uint32_t cp;
    const std::size_t len = decode_utf8(syms, i, cp);
    auto it = impl_->cp_to_byte.find(cp);
    if (it != impl_->cp_to_byte.end()) out += static_cast<char>(it->second);
    else out.append(syms, i, len);  // a character outside the byte map stands for itself
    i += len;
  }
  return out;
}

}  // namespace meshtrain::io
