// A recursive-descent JSON reader (RFC 8259) that keeps just enough to read safetensors headers,
// HuggingFace config.json and vocab.json. Strictness is deliberate: a header that another tool
// would reject should be rejected here too, with the byte offset so the file can be inspected.
#include "meshtrain/io/json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "meshtrain/core/error.hpp"

namespace meshtrain::io {

namespace {

// Deeper nesting than this is not a header or a vocabulary; the limit keeps a hostile file from
// exhausting the stack.
constexpr int kMaxDepth = 256;

const char* kind_name(Json::Kind k) {
  switch (k) {
    case Json::Kind::null: return "null";
    case Json::Kind::boolean: return "a boolean";
    case Json::Kind::number: return "a number";
    case Json::Kind::string: return "a string";
    case Json::Kind::array: return "an array";
    case Json::Kind::object: return "an object";
  }
  return "?";
}

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

class Parser {
 public:
  Parser(std::string_view text, const std::string& what) : s_(text), what_(what) {}

  Json document() {
    skip_ws();
    Json v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const { fail_at(pos_, msg); }
  [[noreturn]] void fail_at(std::size_t at, const std::string& msg) const {
    throw ConfigError(cat(what_, ": JSON error at byte ", at, ": ", msg));
  }

  std::string describe_here() const {
    if (pos_ >= s_.size()) return "end of input";
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c >= 0x20 && c < 0x7F) return cat("'", static_cast<char>(c), "'");
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02X", c);
    return cat("byte ", buf);
  }

  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  void expect_literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) fail(cat("expected '", lit, "', found ", describe_here()));
    pos_ += lit.size();
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail(cat("nesting deeper than ", kMaxDepth, " levels"));
    if (pos_ >= s_.size()) fail("unexpected end of input, expected a value");
    Json v;
    switch (s_[pos_]) {
      case '{': object(v, depth); break;
      case '[': array(v, depth); break;
      case '"':
        v.kind = Json::Kind::string;
        v.str = string();
        break;
      case 't':
        expect_literal("true");
        v.kind = Json::Kind::boolean;
        v.b = true;
        break;
      case 'f':
        expect_literal("false");
        v.kind = Json::Kind::boolean;
        break;
      case 'n': expect_literal("null"); break;
      default:
        if (s_[pos_] == '-' || (s_[pos_] >= '0' && s_[pos_] <= '9')) {
          v.kind = Json::Kind::number;
          v.num = number();
        } else {
          fail(cat("expected a value, found ", describe_here()));
        }
    }
    return v;
  }

  void object(Json& v, int depth) {
    v.kind = Json::Kind::object;
    ++pos_;  // '{'
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return;
    }
    while (true) {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != '"')
        fail(cat("expected a string key, found ", describe_here()));
      std::string key = string();
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != ':') fail(cat("expected ':', found ", describe_here()));
      ++pos_;
      skip_ws();
      v.obj.emplace_back(std::move(key), value(depth + 1));
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return;
      }
      fail(cat("expected ',' or '}' in an object, found ", describe_here()));
    }
  }

  void array(Json& v, int depth) {
    v.kind = Json::Kind::array;
    ++pos_;  // '['
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return;
    }
    while (true) {
      skip_ws();
      v.arr.push_back(value(depth + 1));
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return;
      }
      fail(cat("expected ',' or ']' in an array, found ", describe_here()));
    }
  }

  std::uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else fail_at(pos_ + i, "bad hex digit in \\u escape");
    }
    pos_ += 4;
    return v;
  }

  std::string string() {
    const std::size_t start = pos_;
    ++pos_;  // '"'
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail_at(start, "unterminated string");
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string (must be escaped)");
      if (c != '\\') {
        out += c;  // UTF-8 passes through byte by byte
        ++pos_;
        continue;
      }
      const std::size_t esc = pos_;
      ++pos_;
      if (pos_ >= s_.size()) fail_at(start, "unterminated string");
      switch (s_[pos_++]) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(esc, "unpaired low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // Characters outside the BMP arrive as a UTF-16 surrogate pair: \uD83D\uDE00.
            if (s_.substr(pos_, 2) != "\\u") fail_at(esc, "high surrogate not followed by \\u");
            pos_ += 2;
            const std::uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail_at(esc, "high surrogate not followed by a low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail_at(esc, cat("unknown escape '\\", s_[pos_ - 1], "'"));
      }
    }
  }

  double number() {
    // Validate the RFC 8259 grammar first; from_chars alone would accept "01" or "1.".
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - d;
    };
    if (s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;
    } else if (digits() == 0) {
      fail("expected digits in a number");
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) fail("expected digits after '.' in a number");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) fail("expected digits in the exponent of a number");
    }
    double v = 0;
    auto [p, ec] = std::from_chars(s_.data() + start, s_.data() + pos_, v);
    if (ec != std::errc() || p != s_.data() + pos_)
      fail_at(start, cat("number '", s_.substr(start, pos_ - start), "' is out of range"));
    return v;
  }

  std::string_view s_;
  const std::string& what_;
  std::size_t pos_ = 0;
};

}  // namespace

Json Json::parse(std::string_view text, const std::string& what) {
  return Parser(text, what).document();
}

const Json* Json::find(const std::string& key) const {
  if (kind != Kind::object) return nullptr;
  for (const auto& [k, v] : obj)
    if (k == key) return &v;
  return nullptr;
}

const Json& Json::at(const std::string& key, const std::string& what) const {
  if (kind != Kind::object)
    throw ConfigError(cat(what, ": expected an object with key '", key, "', found ", kind_name(kind)));
  const Json* v = find(key);
  if (!v) throw ConfigError(cat(what, ": key '", key, "' is missing"));
  return *v;
}

std::int64_t Json::as_int(const std::string& what) const {
  // 2^53: beyond it a double no longer holds every integer, so the value may not be the file's.
  constexpr double kExact = 9007199254740992.0;
  if (kind != Kind::number)
    throw ConfigError(cat(what, ": expected an integer, found ", kind_name(kind)));
  if (num != std::floor(num) || std::fabs(num) > kExact)
    throw ConfigError(cat(what, ": expected an integer, found ", num));
  return static_cast<std::int64_t>(num);
}

double Json::as_number(const std::string& what) const {
  if (kind != Kind::number)
    throw ConfigError(cat(what, ": expected a number, found ", kind_name(kind)));
  return num;
}

const std::string& Json::as_string(const std::string& what) const {
  if (kind != Kind::string)
    throw ConfigError(cat(what, ": expected a string, found ", kind_name(kind)));
  return str;
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace meshtrain::io
