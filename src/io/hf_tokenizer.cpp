// HuggingFace tokenizer.json, byte-level BPE (tokenizer.hpp). The pipeline of HF tokenizers'
// encode(text, add_special_tokens=False), for what byte-level BPE tokenizers use:
//   1. added tokens: occurrences in the text (leftmost, longest; single_word, lstrip, rstrip)
//      become their ids; the text between them goes on;
//   2. normalizer: none (others are refused: NFC and friends would need Unicode tables);
//   3. pre-tokenizer: Sequence of Split (a regex or a literal, with HF's five behaviours and
//      invert) and ByteLevel (add_prefix_space, use_regex = GPT-2's pattern), last;
//   4. model: BPE on each piece's bytes (bpe_model.cpp), ignore_merges as Llama 3 sets it;
// and decoding through the ByteLevel decoder. Regexes run through PCRE2 (pcre2_regex.hpp).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "bpe_model.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/io/tokenizer.hpp"
#include "pcre2_regex.hpp"

namespace meshtrain::io {

namespace {

// HF SplitDelimiterBehavior.
enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreStep {
  bool byte_level = false;
  std::unique_ptr<detail::Pcre2Regex> regex;  // Split {Regex}, or ByteLevel with use_regex
  std::string literal;                        // Split {String}
  Behavior behavior = Behavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;
};

struct AddedToken {
  std::string content;
  int id = -1;
  bool single_word = false, lstrip = false, rstrip = false;
};

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(cat(what, " '", path, "' cannot be opened"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool flag(const Json& j, const char* key, bool fallback) {
  const Json* v = json::find(j, key);
  return v && v->is_boolean() ? v->get<bool>() : fallback;
}

std::string str_or_empty(const Json& j, const char* key) {
  const Json* v = json::find(j, key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool is_word_byte(unsigned char c) {  // \w, counting every non-ASCII byte as a word character
  return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') ||
         ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

}  // namespace

struct HfTokenizer::Impl {
  std::string path;
  detail::BpeModel bpe;
  std::vector<PreStep> steps;
  std::vector<AddedToken> added;  // longest content first
  std::unordered_map<int, std::string> added_content;
  bool starts_added[256] = {};  // first bytes of added tokens: the scan skips other positions
  int size = 0, bos = -1, eos = -1;
  std::string bos_name;  // the post-processor template's first special token
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache;

  std::string where(const std::string& part) const { return cat("tokenizer '", path, "': ", part); }

  void load_model(const Json& m) {
    const std::string type = str_or_empty(m, "type");
    if (!type.empty() && type != "BPE")
      throw ConfigError(
          where(cat("model type '", type, "' is not supported (byte-level BPE only)")));
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (!str_or_empty(m, k).empty())
        throw ConfigError(where(cat("model.", k, " = '", str_or_empty(m, k),
                                    "' is not supported (byte-level BPE has none)")));
    if (const Json* d = json::find(m, "dropout"); d && d->is_number() && d->get<double>() != 0)
      throw ConfigError(where("model.dropout is set: BPE dropout makes encoding random"));
    bpe.ignore_merges = flag(m, "ignore_merges", false);
    bpe.source = path;
    const Json& vocab = json::at(m, "vocab", where("model"));
    if (!vocab.is_object() || vocab.empty())
      throw ConfigError(where("model.vocab must be a non-empty object {\"token\": id, ...}"));
    for (const auto& [tok, v] : vocab.items())
      bpe.add_token(tok, json::as_int(v, where(cat("model.vocab '", tok, "'"))),
                    where("model.vocab"));
    const Json& merges = json::at(m, "merges", where("model"));
    if (!merges.is_array()) throw ConfigError(where("model.merges must be an array"));
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const Json& e = merges[i];
      const std::string w = where(cat("model.merges[", i, "]"));
      std::string a, b;
      if (e.is_string()) {  // "a b" (tokenizers < 0.20)
        const std::string& str = e.get_ref<const std::string&>();
        const auto sp = str.find(' ');
        if (sp == std::string::npos || sp == 0 || sp + 1 == str.size() ||
            str.find(' ', sp + 1) != std::string::npos)
          throw ConfigError(cat(w, " ('", str, "'): expected two tokens separated by one space"));
        a = str.substr(0, sp);
        b = str.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2) {  // ["a", "b"]
        a = json::as_string(e[0], w);
        b = json::as_string(e[1], w);
        if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos)
          throw ConfigError(
              cat(w, ": a token with a space is not byte-level ('", a, "', '", b, "')"));
      } else {
        throw ConfigError(cat(w, ": expected \"a b\" or [\"a\", \"b\"]"));
      }
      bpe.add_merge(a, b, w);
    }
  }

  void load_added(const Json& list) {
    if (!list.is_array()) throw ConfigError(where("added_tokens must be an array"));
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Json& t = list[i];
      const std::string w = where(cat("added_tokens[", i, "]"));
      AddedToken a;
      a.content = json::as_string(json::at(t, "content", w), w + " content");
      const std::int64_t id = json::as_int(json::at(t, "id", w), w + " id");
      if (id < 0 || id >= (std::int64_t(1) << 31) - 1)
        throw ConfigError(cat(w, ": id ", id, " out of range"));
      if (a.content.empty()) throw ConfigError(cat(w, ": empty content"));
      a.id = static_cast<int>(id);
      a.single_word = flag(t, "single_word", false);
      a.lstrip = flag(t, "lstrip", false);
      a.rstrip = flag(t, "rstrip", false);
      added_content[a.id] = a.content;
      starts_added[static_cast<unsigned char>(a.content[0])] = true;
      added.push_back(std::move(a));
    }
    std::stable_sort(added.begin(), added.end(), [](const AddedToken& x, const AddedToken& y) {
      return x.content.size() > y.content.size();
    });
  }

  void load_pre_tokenizer(const Json& p, const std::string& at) {
    const std::string type = json::as_string(json::at(p, "type", where(at)), where(at + ".type"));
    if (type == "Sequence") {
      const Json& list = json::at(p, "pretokenizers", where(at));
      if (!list.is_array()) throw ConfigError(where(at + ".pretokenizers must be an array"));
      for (std::size_t i = 0; i < list.size(); ++i)
        load_pre_tokenizer(list[i], cat(at, ".pretokenizers[", i, "]"));
      return;
    }
    if (!steps.empty() && steps.back().byte_level)
      throw ConfigError(where(cat(at, ": a pre-tokenizer after ByteLevel is not supported")));
    PreStep s;
    if (type == "ByteLevel") {
      s.byte_level = true;
      s.add_prefix_space = flag(p, "add_prefix_space", true);  // HF's defaults
      if (flag(p, "use_regex", true))
        s.regex = std::make_unique<detail::Pcre2Regex>(gpt2_pattern(), where(at + " (ByteLevel)"));
    } else if (type == "Split") {
      const Json& pat = json::at(p, "pattern", where(at));
      if (const Json* r = json::find(pat, "Regex"))
        s.regex = std::make_unique<detail::Pcre2Regex>(json::as_string(*r, where(at)),
                                                       where(at + " (Split)"));
      else if (const Json* l = json::find(pat, "String"))
        s.literal = json::as_string(*l, where(at));
      else
        throw ConfigError(
            where(cat(at, ".pattern: expected {\"Regex\": ...} or {\"String\": ...}")));
      const std::string b =
          json::as_string(json::at(p, "behavior", where(at)), where(at + ".behavior"));
      if (b == "Removed")
        s.behavior = Behavior::removed;
      else if (b == "Isolated")
        s.behavior = Behavior::isolated;
      else if (b == "MergedWithPrevious")
        s.behavior = Behavior::merged_with_previous;
      else if (b == "MergedWithNext")
        s.behavior = Behavior::merged_with_next;
      else if (b == "Contiguous")
        s.behavior = Behavior::contiguous;
      else
        throw ConfigError(where(cat(at, ".behavior '", b, "' is unknown")));
      s.invert = flag(p, "invert", false);
    } else {
      throw ConfigError(where(cat(at, ": pre-tokenizer '", type,
                                  "' is not supported (Sequence, Split and ByteLevel are)")));
    }
    steps.push_back(std::move(s));
  }

  // BOS and EOS: explicit names, else tokenizer_config.json beside the file, else the template's
  // first special token and the usual EOS names.
  void choose_specials(const std::string& bos_token, const std::string& eos_token) {
    std::string b = bos_token, e = eos_token;
    const auto cfg = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
    if ((b.empty() || e.empty()) && std::filesystem::exists(cfg)) {
      const Json c = json::parse(read_text(cfg.string(), "tokenizer config"), cfg.string());
      auto name = [&](const char* key) -> std::string {
        const Json* v = json::find(c, key);
        if (!v) return "";
        if (v->is_string()) return v->get<std::string>();
        if (v->is_object()) return str_or_empty(*v, "content");
        return "";
      };
      if (b.empty()) b = name("bos_token");
      if (e.empty()) e = name("eos_token");
    }
    if (b.empty()) b = bos_name;
    if (e.empty())
      for (const char* n : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"})
        if (added_content_id(n) >= 0) {
          e = n;
          break;
        }
    auto lookup = [&](const std::string& n, const char* what) {
      if (n.empty()) return -1;
      const int id = token_id(n);
      if (id < 0) throw ConfigError(where(cat(what, " token '", n, "' is not in the vocabulary")));
      return id;
    };
    bos = lookup(b, "the BOS");
    eos = lookup(e, "the EOS");
  }

  int added_content_id(const std::string& c) const {
    for (const auto& a : added)
      if (a.content == c) return a.id;
    return -1;
  }
  int token_id(const std::string& c) const {
    const int a = added_content_id(c);
    if (a >= 0) return a;
    auto it = bpe.vocab.find(c);
    return it == bpe.vocab.end() ? -1 : it->second;
  }

  // HF's Split on one piece: the matches and the gaps between them, in order, then the
  // behaviour; empty pieces are dropped.
  void split(const PreStep& s, const std::string& piece, std::vector<std::string>& out) const {
    struct Seg {
      std::size_t b, e;
      bool match;
    };
    std::vector<Seg> segs;
    std::size_t prev = 0;
    auto on_match = [&](std::size_t b, std::size_t e) {
      if (b != prev) segs.push_back({prev, b, false});
      segs.push_back({b, e, true});
      prev = e;
    };
    if (s.regex) {
      s.regex->for_each_match(piece, on_match);
    } else if (!s.literal.empty()) {
      for (std::size_t at = piece.find(s.literal); at != std::string::npos;
           at = piece.find(s.literal, at + s.literal.size()))
        on_match(at, at + s.literal.size());
    }
    if (prev != piece.size()) segs.push_back({prev, piece.size(), false});
    if (s.invert)
      for (auto& g : segs) g.match = !g.match;
    std::vector<Seg>
        kept;  // HF tokenizers' split_off rules (normalizer.rs, SplitDelimiterBehavior)
    bool previous_match = false;
    switch (s.behavior) {
      case Behavior::removed:
        for (const auto& g : segs)
          if (!g.match) kept.push_back(g);
        break;
      case Behavior::isolated:
        kept = segs;
        break;
      case Behavior::merged_with_previous:
        for (const auto& g : segs) {
          if (g.match && !previous_match && !kept.empty())
            kept.back().e = g.e;
          else
            kept.push_back(g);
          previous_match = g.match;
        }
        break;
      case Behavior::merged_with_next:
        for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
          if (it->match && !previous_match && !kept.empty())
            kept.back().b = it->b;
          else
            kept.push_back(*it);
          previous_match = it->match;
        }
        std::reverse(kept.begin(), kept.end());
        break;
      case Behavior::contiguous:
        for (const auto& g : segs) {
          if (g.match == previous_match && !kept.empty())
            kept.back().e = g.e;
          else
            kept.push_back(g);
          previous_match = g.match;
        }
        break;
    }
    for (const auto& g : kept)
      if (g.e > g.b) out.push_back(piece.substr(g.b, g.e - g.b));
  }

  std::vector<std::string> pre_tokenize(std::string_view text) const {
    std::vector<std::string> pieces{std::string(text)}, next;
    for (const PreStep& s : steps) {
      next.clear();
      for (auto& p : pieces) {
        if (s.byte_level) {
          if (s.add_prefix_space && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
          if (!s.regex) {
            next.push_back(std::move(p));
            continue;
          }
        }
        split(s, p, next);  // ByteLevel's regex: Isolated, not inverted (its PreStep's defaults)
      }
      pieces.swap(next);
    }
    return pieces;
  }

  void encode_text(std::string_view text, std::vector<std::int32_t>& out) const {
    // Words repeat (Zipf): a bounded cache of piece -> ids skips most BPE loops.
    constexpr std::size_t kCacheMax = 1 << 18;
    for (const auto& p : pre_tokenize(text)) {
      auto it = cache.find(p);
      if (it == cache.end()) {
        if (cache.size() >= kCacheMax) cache.clear();
        it = cache.emplace(p, bpe.encode(p)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  }
};

HfTokenizer::HfTokenizer(const std::string& path, const std::string& bos_token,
                         const std::string& eos_token)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.path = std::filesystem::is_directory(path)
               ? (std::filesystem::path(path) / "tokenizer.json").string()
               : path;
  const Json j = json::parse(read_text(d.path, "HuggingFace tokenizer"), d.where("JSON"));
  if (!j.is_object()) throw ConfigError(d.where("not a JSON object"));
  if (const Json* n = json::find(j, "normalizer"); n && !n->is_null())
    throw ConfigError(d.where(cat("normalizer '", str_or_empty(*n, "type"),
                                  "' is not supported (only tokenizers without one, as Llama 3's "
                                  "and GPT-2's)")));
  d.load_model(json::at(j, "model", d.where("top level")));
  if (const Json* a = json::find(j, "added_tokens")) d.load_added(*a);
  const Json* pre = json::find(j, "pre_tokenizer");
  if (pre && !pre->is_null()) d.load_pre_tokenizer(*pre, "pre_tokenizer");
  if (d.steps.empty() || !d.steps.back().byte_level)
    throw ConfigError(d.where("the pre_tokenizer must end with ByteLevel (byte-level BPE)"));
  if (const Json* dec = json::find(j, "decoder"); dec && !dec->is_null()) {
    const std::string t = str_or_empty(*dec, "type");
    if (t != "ByteLevel")
      throw ConfigError(d.where(cat("decoder '", t, "' is not supported (ByteLevel is)")));
  }
  if (const Json* post = json::find(j, "post_processor");
      post && post->is_object() &&
      str_or_empty(*post, "type") == "TemplateProcessing") {
    const Json* single = json::find(*post, "single");
    if (single && single->is_array() && !single->empty())
      if (const Json* sp = json::find((*single)[0], "SpecialToken"))
        d.bos_name = str_or_empty(*sp, "id");
  }
  d.size = static_cast<int>(d.bpe.id_to_token.size());
  for (const auto& a : d.added) d.size = std::max(d.size, a.id + 1);
  d.choose_specials(bos_token, eos_token);
}

HfTokenizer::~HfTokenizer() = default;
int HfTokenizer::vocab_size() const { return impl_->size; }
int HfTokenizer::eot() const { return impl_->eos; }
int HfTokenizer::bos() const { return impl_->bos; }
const std::string& HfTokenizer::path() const { return impl_->path; }
int HfTokenizer::token_id(const std::string& content) const { return impl_->token_id(content); }

std::vector<std::int32_t> HfTokenizer::encode(std::string_view text) const {
  const Impl& d = *impl_;
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3);
  std::lock_guard<std::mutex> lock(d.cache_mutex);
  std::size_t done = 0;  // text[0, done) is encoded
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (!d.starts_added[static_cast<unsigned char>(text[i])]) continue;
    const AddedToken* hit = nullptr;
    for (const auto& a : d.added) {  // longest first: the first that fits is the longest
      if (text.compare(i, a.content.size(), a.content) != 0) continue;
      const std::size_t e = i + a.content.size();
      if (a.single_word &&
          ((i > 0 && is_word_byte(text[i - 1])) || (e < text.size() && is_word_byte(text[e]))))
        continue;
      hit = &a;
      break;
    }
    if (!hit) continue;
    std::size_t b = i, e = i + hit->content.size();
    if (hit->lstrip)
      while (b > done && is_space(text[b - 1])) --b;
    if (hit->rstrip)
      while (e < text.size() && is_space(text[e])) ++e;
    if (b > done) d.encode_text(text.substr(done, b - done), out);
    out.push_back(hit->id);
    done = e;
    i = e - 1;
  }
  if (done < text.size()) d.encode_text(text.substr(done), out);
  return out;
}

std::vector<std::string> HfTokenizer::pre_tokenize(std::string_view text) const {
  return impl_->pre_tokenize(text);
}

std::string HfTokenizer::decode(const std::vector<std::int32_t>& tokens) const {
  const Impl& d = *impl_;
  std::string out;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int32_t t = tokens[i];
    if (auto it = d.added_content.find(t); it != d.added_content.end()) {
      out += it->second;  // added tokens decode to their content
      continue;
    }
    if (t < 0 || static_cast<std::size_t>(t) >= d.bpe.id_used.size() || !d.bpe.id_used[t])
      throw ConfigError(
          cat("token id ", t, " at position ", i, " is not in the vocabulary of '", d.path, "'"));
    out += d.bpe.symbols_to_bytes(d.bpe.id_to_token[t]);
  }
  return out;
}

}  // namespace meshtrain::io
