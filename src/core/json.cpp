// nlohmann-json does the grammar (RFC 8259, strictly: no trailing commas, leading zeros, lone
// surrogates or unescaped control characters, and no overflowing numbers). Parsing goes through
// its SAX interface so that an error can report where the offending token starts, and so that a
// duplicate key is an error rather than a silent overwrite.
#include "meshtrain/core/json.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "meshtrain/core/error.hpp"

namespace meshtrain::json {

namespace {

// Deeper nesting than this is not a header, a configuration or a vocabulary; the writer and the
// readers walk documents recursively, so the limit keeps a hostile file off the stack.
constexpr std::size_t kMaxDepth = 256;

const char* kind_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float: return "a number";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return "binary data";
  }
}

// nlohmann's SAX events -> a Json tree. Containers under construction are a stack of pointers;
// a parent gains no element while a child is open, so the pointers stay valid.
class TreeBuilder {
 public:
  explicit TreeBuilder(Json& root) : root_(root) {}

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(Json::number_integer_t v) { return put(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return put(v); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return put(v); }
  bool string(Json::string_t& v) { return put(std::move(v)); }
  bool binary(Json::binary_t& v) { return put(Json::binary(v)); }  // not in JSON text
  bool key(Json::string_t& k) {
    key_ = std::move(k);
    return true;
  }
  bool start_object(std::size_t) { return open(Json::object()); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_object() {
    // Sorting the keys once per object keeps a 50k-token vocabulary linear-logarithmic; a
    // lookup per insertion would be quadratic in an ordered object.
    std::vector<const std::string*> keys;
    for (const auto& kv : stack_.back()->get_ref<const Json::object_t&>()) keys.push_back(&kv.first);
    std::sort(keys.begin(), keys.end(), [](auto* a, auto* b) { return *a < *b; });
    for (std::size_t i = 1; i < keys.size(); ++i)
      if (*keys[i] == *keys[i - 1]) {
        error_ = cat("key '", *keys[i], "' appears twice in one object");
        return false;
      }
    stack_.pop_back();
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const Json::exception& e) {
    // `position` counts the characters read (an early end of input counts as one): the last of
    // them ends the token that broke the grammar. (nlohmann's echo of the token is no guide to where the
    // token starts: it can include the whitespace and separators before it.)
    offset_ = position > 0 ? position - 1 : 0;
    std::string reason = e.what();
    if (const auto p = reason.find("] "); p != std::string::npos) reason.erase(0, p + 2);
    if (reason.rfind("parse error", 0) == 0)  // "parse error at line 1, column 9: <reason>"
      if (const auto p = reason.find(": "); p != std::string::npos) reason.erase(0, p + 2);
    error_ = std::move(reason);
    return false;
  }

  const std::string& error() const { return error_; }
  std::size_t offset() const { return offset_; }
  bool has_offset() const { return offset_ != kNoOffset; }

 private:
  static constexpr std::size_t kNoOffset = static_cast<std::size_t>(-1);

  // Adds v to the innermost open container (or makes it the document); returns where it went.
  Json* insert(Json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& parent = *stack_.back();
    if (parent.is_array()) {
      auto& arr = parent.get_ref<Json::array_t&>();
      arr.push_back(std::move(v));
      return &arr.back();
    }
    // Append without ordered_map's linear search for the key; end_object checks duplicates.
    auto& obj = static_cast<Json::object_t::Container&>(parent.get_ref<Json::object_t&>());
    obj.emplace_back(std::move(key_), std::move(v));
    return &obj.back().second;
  }
  bool put(Json&& v) {
    insert(std::move(v));
    return true;
  }
  bool open(Json&& container) {
    if (stack_.size() >= kMaxDepth) {
      error_ = cat("nesting deeper than ", kMaxDepth, " levels");
      return false;
    }
    stack_.push_back(insert(std::move(container)));
    return true;
  }

  Json& root_;
  std::vector<Json*> stack_;
  std::string key_, error_;
  std::size_t offset_ = kNoOffset;
};

std::string number_text(double d, int significant) {
  if (!std::isfinite(d)) return "null";
  char b[40];
  std::snprintf(b, sizeof b, "%.*g", significant, d);
  return b;
}

std::string scalar_text(const Json& v, const Style& s) {
  if (v.is_number_float() && s.significant > 0) return number_text(v.get<double>(), s.significant);
  try {
    return v.dump();  // escapes strings, writes integers exactly and doubles shortest
  } catch (const Json::exception& e) {
    throw Error(cat("writing JSON: ", e.what()));  // a string that is not UTF-8
  }
}

std::string one_line(const Json& v, const Style& s) {
  if (v.is_array()) {
    std::string out = "[";
    for (const Json& e : v) out += cat(out.size() > 1 ? ", " : "", one_line(e, s));
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    for (const auto& [k, e] : v.items())
      out += cat(out.size() > 1 ? ", " : "", scalar_text(Json(k), s), ": ", one_line(e, s));
    return out + "}";
  }
  return scalar_text(v, s);
}

// `lead`: the columns this value's line already holds (indentation, key); `depth`: its level.
std::string pretty(const Json& v, const Style& s, int depth, std::size_t lead) {
  std::string line = one_line(v, s);
  // +1: the comma that may follow.
  if (!v.is_structured() || v.empty() || depth >= s.open_depth ||
      lead + line.size() + 1 <= static_cast<std::size_t>(s.width))
    return line;
  const std::size_t indent = 2 * static_cast<std::size_t>(depth);
  const std::string pad(indent + 2, ' ');
  std::string out(1, v.is_array() ? '[' : '{');
  bool first = true;
  for (const auto& [k, e] : v.items()) {
    out += first ? "\n" : ",\n";
    first = false;
    out += pad;
    if (v.is_object()) out += scalar_text(Json(k), s) + ": ";
    out += pretty(e, s, depth + 1, out.size() - out.rfind('\n') - 1);
  }
  return out + "\n" + std::string(indent, ' ') + (v.is_array() ? ']' : '}');
}

}  // namespace

Json parse(std::string_view text, const std::string& what) {
  Json root;
  TreeBuilder b(root);
  if (Json::sax_parse(text.begin(), text.end(), &b)) return root;
  if (!b.has_offset()) throw ConfigError(cat(what, ": JSON error: ", b.error()));
  const std::size_t at = std::min(b.offset(), text.size());
  const std::string_view before = text.substr(0, at);
  const std::size_t line = 1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
  const std::size_t nl = before.rfind('\n');
  const std::size_t column = at - (nl == std::string_view::npos ? 0 : nl + 1) + 1;
  throw ConfigError(cat(what, ": JSON error at byte ", at, " (line ", line, ", column ", column,
                        "): ", b.error()));
}

const Json* find(const Json& o, const std::string& key) {
  if (!o.is_object()) return nullptr;
  const auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

const Json& at(const Json& o, const std::string& key, const std::string& what) {
  if (!o.is_object())
    throw ConfigError(cat(what, ": expected an object with key '", key, "', found ", kind_name(o)));
  const Json* v = find(o, key);
  if (!v) throw ConfigError(cat(what, ": key '", key, "' is missing"));
  return *v;
}

std::int64_t as_int(const Json& v, const std::string& what) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<std::int64_t>();
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u <= static_cast<std::uint64_t>(INT64_MAX)) return static_cast<std::int64_t>(u);
    throw ConfigError(cat(what, ": expected a 64-bit integer, found ", u));
  }
  if (!v.is_number_float())
    throw ConfigError(cat(what, ": expected an integer, found ", kind_name(v)));
  // 2^53: beyond it a double no longer holds every integer, so the value may not be the file's.
  constexpr double kExact = 9007199254740992.0;
  const double d = v.get<double>();
  if (d != std::floor(d) || std::fabs(d) > kExact)
    throw ConfigError(cat(what, ": expected an integer, found ", d));
  return static_cast<std::int64_t>(d);
}

double as_number(const Json& v, const std::string& what) {
  if (!v.is_number()) throw ConfigError(cat(what, ": expected a number, found ", kind_name(v)));
  return v.get<double>();
}

const std::string& as_string(const Json& v, const std::string& what) {
  if (!v.is_string()) throw ConfigError(cat(what, ": expected a string, found ", kind_name(v)));
  return v.get_ref<const std::string&>();
}

std::string dump(const Json& v, const Style& style) {
  return style.width > 0 ? pretty(v, style, 0, 0) : one_line(v, style);
}

}  // namespace meshtrain::json
