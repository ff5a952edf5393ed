// A validating single-pass JSON scanner that decodes one top-level string member. Strings that
// are not wanted are checked but not copied; the wanted one is appended in runs of plain bytes,
// so a record costs about one pass over its bytes.
#include "meshtrain/io/json_lines.hpp"

#include <array>

namespace meshtrain::io {

const char* describe(JsonLineStatus s) {
  switch (s) {
    case JsonLineStatus::ok: return "ok";
    case JsonLineStatus::empty: return "empty line";
    case JsonLineStatus::not_json: return "not JSON";
    case JsonLineStatus::not_object: return "not a JSON object";
    case JsonLineStatus::missing: return "no such field";
    case JsonLineStatus::not_string: return "field is not a string";
    case JsonLineStatus::duplicate: return "field given twice";
  }
  return "?";
}

namespace {

constexpr int kMaxDepth = 256;  // as core/json's parse

// Bytes a string may hold as they are: printable ASCII other than '"' and '\\'.
constexpr std::array<bool, 256> plain_table() {
  std::array<bool, 256> t{};
  for (int c = 0x20; c < 0x80; ++c) t[c] = c != '"' && c != '\\';
  return t;
}
constexpr std::array<bool, 256> kPlain = plain_table();

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Scanner {
 public:
  explicit Scanner(std::string_view s)
      : b_(reinterpret_cast<const unsigned char*>(s.data())), p_(b_), e_(b_ + s.size()) {}

  JsonLineResult run(std::string_view key, std::string& out) {
    JsonLineResult r;
    if (e_ - p_ >= 3 && p_[0] == 0xEF && p_[1] == 0xBB && p_[2] == 0xBF) p_ += 3;
    ws();
    if (p_ == e_) {
      r.status = JsonLineStatus::empty;
      return r;
    }
    int found = 0;          // how many times the member appeared
    bool is_string = false;  // whether its (last) value was a string
    bool ok;
    const bool object = *p_ == '{';
    if (object) ok = top_object(key, out, found, is_string);
    else ok = value(0);
    if (ok) {
      ws();
      if (p_ != e_) ok = fail("text after the value");
    }
    if (!ok) {
      r.status = JsonLineStatus::not_json;
      r.offset = static_cast<std::size_t>(err_ - b_);
      r.why = why_;
      return r;
    }
    if (!object) r.status = JsonLineStatus::not_object;
    else if (found == 0) r.status = JsonLineStatus::missing;
    else if (found > 1) r.status = JsonLineStatus::duplicate;
    else if (!is_string) r.status = JsonLineStatus::not_string;
    return r;
  }

 private:
  bool fail(const char* why) {
    if (!why_[0]) {
      why_ = why;
      err_ = p_ < e_ ? p_ : e_;
    }
    return false;
  }

  void ws() {
    while (p_ < e_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  // The top-level object: like object(), but each key is compared with `key` and that
  // member's string value is decoded into `out`.
  bool top_object(std::string_view key, std::string& out, int& found, bool& is_string) {
    ++p_;  // '{'
    ws();
    if (p_ < e_ && *p_ == '}') {
      ++p_;
      return true;
    }
    std::string key_buf;
    for (;;) {
      if (p_ >= e_ || *p_ != '"') return fail("expected a key");
      // Keys are short and rarely escaped: compare the raw bytes unless there is an escape.
      const unsigned char* k0 = p_ + 1;
      if (!string(nullptr)) return false;
      const std::string_view raw(reinterpret_cast<const char*>(k0),
                                 static_cast<std::size_t>(p_ - 1 - k0));
      bool match;
      if (raw.find('\\') == std::string_view::npos) {
        match = raw == key;
      } else {
        const unsigned char* after = p_;
        p_ = k0 - 1;
        key_buf.clear();
        string(&key_buf);  // validated above
        p_ = after;
        match = key_buf == key;
      }
      ws();
      if (p_ >= e_ || *p_ != ':') return fail("expected ':' after a key");
      ++p_;
      ws();
      if (match) {
        ++found;
        is_string = p_ < e_ && *p_ == '"';
        if (is_string) {
          out.clear();
          if (!string(&out)) return false;
        } else if (!value(1)) {
          return false;
        }
      } else if (!value(1)) {
        return false;
      }
      ws();
      if (p_ >= e_) return fail("unterminated object");
      if (*p_ == ',') {
        ++p_;
        ws();
        continue;
      }
      if (*p_ == '}') {
        ++p_;
        return true;
      }
      return fail("expected ',' or '}' in an object");
    }
  }

  bool value(int depth) {
    if (p_ >= e_) return fail("expected a value");
    switch (*p_) {
      case '{': return object(depth + 1);
      case '[': return array(depth + 1);
      case '"': return string(nullptr);
      case 't': return literal("true");
      case 'f': return literal("false");
      case 'n': return literal("null");
      default:
        if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return number();
        return fail("expected a value");
    }
  }

  bool literal(const char* word) {
    for (const char* w = word; *w; ++w, ++p_)
      if (p_ >= e_ || *p_ != static_cast<unsigned char>(*w)) return fail("invalid literal");
    return true;
  }

  bool digits() {
    if (p_ >= e_ || *p_ < '0' || *p_ > '9') return fail("expected a digit");
    while (p_ < e_ && *p_ >= '0' && *p_ <= '9') ++p_;
    return true;
  }

  bool number() {
    if (*p_ == '-') ++p_;
    if (p_ < e_ && *p_ == '0') {
      ++p_;  // no leading zeros
    } else if (!digits()) {
      return false;
    }
    if (p_ < e_ && *p_ == '.') {
      ++p_;
      if (!digits()) return false;
    }
    if (p_ < e_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ < e_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digits()) return false;
    }
    return true;
  }

  bool array(int depth) {
    if (depth > kMaxDepth) return fail("nesting deeper than 256 levels");
    ++p_;
    ws();
    if (p_ < e_ && *p_ == ']') {
      ++p_;
      return true;
    }
    for (;;) {
      if (!value(depth)) return false;
      ws();
      if (p_ >= e_) return fail("unterminated array");
      if (*p_ == ',') {
        ++p_;
        ws();
        continue;
      }
      if (*p_ == ']') {
        ++p_;
        return true;
      }
      return fail("expected ',' or ']' in an array");
    }
  }

  bool object(int depth) {
    if (depth > kMaxDepth) return fail("nesting deeper than 256 levels");
    ++p_;
    ws();
    if (p_ < e_ && *p_ == '}') {
      ++p_;
      return true;
    }
    for (;;) {
      if (p_ >= e_ || *p_ != '"') return fail("expected a key");
      if (!string(nullptr)) return false;
      ws();
      if (p_ >= e_ || *p_ != ':') return fail("expected ':' after a key");
      ++p_;
      ws();
      if (!value(depth)) return false;
      ws();
      if (p_ >= e_) return fail("unterminated object");
      if (*p_ == ',') {
        ++p_;
        ws();
        continue;
      }
      if (*p_ == '}') {
        ++p_;
        return true;
      }
      return fail("expected ',' or '}' in an object");
    }
  }

  bool hex4(std::uint32_t& v) {
    v = 0;
    for (int i = 0; i < 4; ++i, ++p_) {
      if (p_ >= e_) return fail("truncated \\u escape");
      const unsigned char c = *p_;
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else return fail("invalid hex digit in a \\u escape");
    }
    return true;
  }

  // p_ at a backslash.
  bool escape(std::string* out) {
    ++p_;
    if (p_ >= e_) return fail("unterminated string");
    const unsigned char c = *p_++;
    char plain = 0;
    switch (c) {
      case '"': plain = '"'; break;
      case '\\': plain = '\\'; break;
      case '/': plain = '/'; break;
      case 'b': plain = '\b'; break;
      case 'f': plain = '\f'; break;
      case 'n': plain = '\n'; break;
      case 'r': plain = '\r'; break;
      case 't': plain = '\t'; break;
      case 'u': {
        std::uint32_t cp;
        if (!hex4(cp)) return false;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("lone low surrogate in a \\u escape");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          // A high surrogate must be followed by \u and a low one (nlohmann and RFC 8259).
          if (e_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u')
            return fail("high surrogate not followed by a low one");
          p_ += 2;
          std::uint32_t lo;
          if (!hex4(lo)) return false;
          if (lo < 0xDC00 || lo > 0xDFFF) return fail("high surrogate not followed by a low one");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (out) append_utf8(*out, cp);
        return true;
      }
      default:
        --p_;
        return fail("invalid escape");
    }
    if (out) *out += plain;
    return true;
  }

  // A multi-byte UTF-8 sequence at p_ (RFC 3629: no overlong forms, no surrogates, at most
  // U+10FFFF); advances past it.
  bool utf8() {
    const unsigned char c = *p_;
    int n;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return fail("invalid UTF-8 byte in a string");
    }
    if (e_ - p_ <= n) return fail("truncated UTF-8 sequence in a string");
    if (p_[1] < lo || p_[1] > hi) return fail("invalid UTF-8 sequence in a string");
    for (int i = 2; i <= n; ++i)
      if (p_[i] < 0x80 || p_[i] > 0xBF) return fail("invalid UTF-8 sequence in a string");
    p_ += n + 1;
    return true;
  }

  // p_ at the opening quote; ends after the closing one. `out`: where to decode it, or null.
  bool string(std::string* out) {
    ++p_;
    for (;;) {
      const unsigned char* run = p_;
      while (p_ < e_ && kPlain[*p_]) ++p_;
      if (p_ >= e_) return fail("unterminated string");
      const unsigned char c = *p_;
      if (c >= 0x80) {
        // UTF-8 text: validated here, copied with the run it belongs to.
        while (p_ < e_ && (kPlain[*p_] || *p_ >= 0x80)) {
          if (*p_ >= 0x80) {
            if (!utf8()) return false;
          } else {
            ++p_;
          }
        }
        if (out) out->append(reinterpret_cast<const char*>(run), static_cast<std::size_t>(p_ - run));
        continue;
      }
      if (out) out->append(reinterpret_cast<const char*>(run), static_cast<std::size_t>(p_ - run));
      if (c == '"') {
        ++p_;
        return true;
      }
      if (c == '\\') {
        if (!escape(out)) return false;
        continue;
      }
      return fail("control character in a string");
    }
  }

  const unsigned char* b_;
  const unsigned char* p_;
  const unsigned char* e_;
  const unsigned char* err_ = nullptr;
  const char* why_ = "";
};

}  // namespace

JsonLineResult json_string_field(std::string_view line, std::string_view key, std::string& out) {
  return Scanner(line).run(key, out);
}

}  // namespace meshtrain::io
