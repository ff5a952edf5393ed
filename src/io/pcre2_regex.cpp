// PCRE2 pattern wrapper for the tokenizers (pcre2_regex.hpp): compile with UTF + UCP, JIT when
// available, find-all iteration in the manner of pcre2demo.c (after an empty match, retry at the
// same offset with PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED, else advance one character).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "pcre2_regex.hpp"

#include <pcre2.h>

#include <memory>
#include <vector>

#include "meshtrain/core/error.hpp"

namespace meshtrain::io::detail {

namespace {

pcre2_code* code_of(void* p) { return static_cast<pcre2_code*>(p); }

// \s -> [\s\x{85}] and \S -> [^\s\x{85}] outside classes; inside a class \s gains \x{85}
// (a negated class such as [^\s\p{L}] then excludes it too). \S inside a class (which would need
// a class difference) does not occur in the tokenizers' patterns and is refused.
std::string with_unicode_space(const std::string& p, const std::string& what) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[++i];
      if (n == 's')
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      else if (n == 'S' && !in_class)
        out += "[^\\s\\x{85}]";
      else if (n == 'S')
        throw ConfigError(
            cat(what, ": \\S inside a character class is not supported (pattern '", p, "')"));
      else if (n == 'Q')
        throw ConfigError(cat(what, ": \\Q...\\E quoting is not supported (pattern '", p, "')"));
      else {
        out += c;
        out += n;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const auto end = p.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(p, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const std::size_t n = s.size();
  const unsigned c = b(i);
  auto cont = [&](std::size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return k < n && b(k) >= lo && b(k) <= hi;
  };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80,
                   hi = c == 0xED ? 0x9F : 0xBF;  // overlong, surrogates
    return cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80,
                   hi = c == 0xF4 ? 0x8F : 0xBF;  // overlong, > U+10FFFF
    return cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

Pcre2Regex::Pcre2Regex(const std::string& pattern, const std::string& what)
    : pattern_(pattern), what_(what) {
  const std::string p = with_unicode_space(pattern, what);
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw ConfigError(cat(what, ": the regex '", pattern,
                          "' does not compile (PCRE2: ", reinterpret_cast<const char*>(msg),
                          ", at offset ", offset, " of the rewritten pattern '", p, "')"));
  }
  code_ = code;
  // The JIT is an optimisation only: without it (no JIT support in the library, or a pattern
  // it declines) pcre2_match interprets the same pattern with the same results.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Pcre2Regex::~Pcre2Regex() { pcre2_code_free(code_of(code_)); }

void Pcre2Regex::match_all(std::string_view text, void* ctx, Callback cb) const {
  // Valid UTF-8 (the normal case) is matched as is; otherwise each invalid byte is replaced by
  // U+00AA (a letter, 2 bytes) and the offsets are mapped back.
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t len = utf8_length(text, i);
    if (len == 0) break;
    i += len;
  }
  if (i == text.size()) {
    match_valid(text, ctx, cb);
    return;
  }
  std::string fixed;
  std::vector<std::size_t> orig;  // orig[k]: the offset in text of byte k of fixed
  fixed.reserve(text.size() + 16);
  orig.reserve(text.size() + 17);
  for (std::size_t k = 0; k < text.size();) {
    const std::size_t len = utf8_length(text, k);
    if (len == 0) {
      fixed += "\xC2\xAA";
      orig.push_back(k);
      orig.push_back(k);
      ++k;
    } else {
      fixed.append(text.substr(k, len));
      for (std::size_t j = 0; j < len; ++j) orig.push_back(k + j);
      k += len;
    }
  }
  orig.push_back(text.size());
  struct Remap {
    const std::vector<std::size_t>* orig;
    void* ctx;
    Callback cb;
  } remap{&orig, ctx, cb};
  match_valid(fixed, &remap, [](void* c, std::size_t b, std::size_t e) {
    auto* r = static_cast<Remap*>(c);
    r->cb(r->ctx, (*r->orig)[b], (*r->orig)[e]);
  });
}

void Pcre2Regex::match_valid(std::string_view text, void* ctx, Callback cb) const {
  pcre2_code* code = code_of(code_);
  // Freed on every exit, including a throw from the callback.
  const std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> holder(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  pcre2_match_data* md = holder.get();
  MESHTRAIN_CHECK(md != nullptr, "pcre2_match_data_create_from_pattern failed (out of memory)");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const PCRE2_SIZE n = text.size();
  PCRE2_SIZE start = 0;
  std::uint32_t flags = 0;
  while (start <= n) {
    // The subject was checked above with PCRE2's own rules: skip its UTF re-check, which would
    // otherwise run over the rest of the text at every call.
    const int rc = pcre2_match(code, subject, n, start, flags | PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      if (flags == 0) break;
      // No non-empty match at the position of an empty one: step one character and go on.
      flags = 0;
      start += start < n ? utf8_length(text, start) : 1;
      continue;
    }
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw ConfigError(cat(what_, ": matching the regex '", pattern_, "' failed at byte ", start,
                            " (PCRE2: ", reinterpret_cast<const char*>(msg), ")"));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t b = ov[0], e = ov[1];
    cb(ctx, b, e);
    start = e;
    flags = b == e ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
  }
}

}  // namespace meshtrain::io::detail
