#pragma once
// JSON documents through nlohmann-json, with the project's error policy on top: a malformed file
// is a ConfigError that names the document and points at the offending character, typed access says
// what was asked for, and the writer lays out what people read (JSON-lines records, indented
// files) the way Python's json.dumps does.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace meshtrain {

// Objects keep their keys in document (or insertion) order: files we write read in the order the
// code builds them, and a header is walked in the order it was written.
using Json = nlohmann::ordered_json;

namespace json {

// A whole document. Errors: ConfigError("<what>: JSON error at byte N (line L, column C): ...")
// where N is the 0-based offset of the last character read: the end of the token that broke the
// grammar (the text's length when it ended early); nesting deeper than 256 levels and a key given twice in one object are
// errors too (a second value would otherwise silently win).
Json parse(std::string_view text, const std::string& what);

// Member `key` of `o`; nullptr when `o` is not an object or has no such member.
const Json* find(const Json& o, const std::string& key);
// ConfigError("<what>: key 'k' is missing") or ("<what>: expected an object with key 'k', ...").
const Json& at(const Json& o, const std::string& key, const std::string& what);
// A number that is an integer, exactly: 3.5, 1e300 and strings are ConfigErrors naming `what`.
std::int64_t as_int(const Json& v, const std::string& what);
double as_number(const Json& v, const std::string& what);
const std::string& as_string(const Json& v, const std::string& what);

struct Style {
  // 0: the whole value on one line (a JSON-lines record). Otherwise indented by two spaces per
  // level, an array or object kept on one line where that line fits in `width` columns.
  int width = 0;
  // Floating-point numbers: 0 writes the shortest text that reads back as the same double; N > 0
  // rounds to N significant digits (printf's %.Ng), for figures meaningful to that precision.
  int significant = 0;
  // How many levels may open: deeper containers stay on one line whatever the width (1: an
  // array of records, one record per line).
  int open_depth = 1 << 20;
};
// Separators ", " and ": ". Non-finite numbers are written as null (JSON has no NaN).
std::string dump(const Json& v, const Style& style = {});

}  // namespace json
}  // namespace meshtrain
