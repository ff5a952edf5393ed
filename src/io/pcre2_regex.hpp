#pragma once
// Private to src/io/: a compiled PCRE2 pattern for the tokenizers' pre-tokenizer regexes (GPT-2's
// and the Split patterns of HuggingFace tokenizer.json files), with Unicode properties
// (PCRE2_UTF | PCRE2_UCP) and the JIT where the library has one.
//
// Two adjustments make PCRE2 match what the tokenizers' own engines (Oniguruma in HuggingFace
// tokenizers, Python's regex for GPT-2) match:
//  - \s and \S: PCRE2's UCP \s is "Z or tab, NL, VT, FF, CR", which leaves out U+0085 (NEL);
//    Unicode's White_Space property, and those engines' \s, include it. The pattern is
//    rewritten so that \s also matches U+0085 (and \S does not).
//  - Invalid UTF-8: those engines only ever see valid UTF-8 (Rust str, Python str), so bytes
//    that are not have no reference behaviour. Each such byte is matched as if it were a
//    letter (U+00AA), the rule the hand-written GPT-2 splitter had, and keeps its place in the
//    output, so no byte is lost.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace meshtrain::io::detail {

class Pcre2Regex {
 public:
  // ConfigError naming `what` (e.g. the tokenizer.json file and the pre-tokenizer) and the
  // offset of a syntax error.
  Pcre2Regex(const std::string& pattern, const std::string& what);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  // Calls f(begin, end) (byte offsets into text) for each successive non-overlapping match,
  // left to right, as a find-all iterator does (an empty match advances by one character).
  template <class F>
  void for_each_match(std::string_view text, F&& f) const {
    using Fn = std::remove_reference_t<F>;
    match_all(text, const_cast<void*>(static_cast<const void*>(&f)),
              [](void* ctx, std::size_t b, std::size_t e) { (*static_cast<Fn*>(ctx))(b, e); });
  }
  bool jit() const { return jit_; }
  const std::string& pattern() const { return pattern_; }

 private:
  using Callback = void (*)(void*, std::size_t, std::size_t);
  void match_all(std::string_view text, void* ctx, Callback cb) const;
  void match_valid(std::string_view text, void* ctx, Callback cb) const;
  std::string pattern_, what_;
  void* code_ = nullptr;  // pcre2_code_8*, kept out of this header
  bool jit_ = false;
};

// Byte length of a valid UTF-8 sequence at s[i] (PCRE2's rules: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 when the bytes there are not one.
std::size_t utf8_length(std::string_view s, std::size_t i);

}  // namespace meshtrain::io::detail
