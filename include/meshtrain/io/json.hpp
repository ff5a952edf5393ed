#pragma once
// A small JSON reader (objects, arrays, strings with \u escapes, numbers, true/false/null) for
// safetensors headers, HuggingFace config.json and vocab.json. Not a general library: it
// reads whole documents into a tree and reports errors with the byte offset.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::io {

class Json {
 public:
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> arr;
  std::vector<std::pair<std::string, Json>> obj;  // insertion order kept

  // Throws ConfigError("<what>: JSON error at byte N: ...").
  static Json parse(std::string_view text, const std::string& what);
  const Json* find(const std::string& key) const;
  const Json& at(const std::string& key, const std::string& what) const;  // ConfigError if absent
  std::int64_t as_int(const std::string& what) const;
  double as_number(const std::string& what) const;
  const std::string& as_string(const std::string& what) const;
};

// Escape a string for writing JSON.
std::string json_escape(std::string_view s);

}  // namespace meshtrain::io
