#pragma once
// One string field out of a JSON-lines record (The Pile, Dolma, RedPajama: {"text": "...", ...}
// per line), without building a DOM. The scanner validates the whole line as RFC 8259 JSON (the
// grammar, UTF-8 in strings, \u escapes with surrogate pairs, nesting up to 256 levels: what
// nlohmann-json's parser accepts) and decodes only the one member's string; perf/archive/journal.md
// ("prep: parsing JSON lines") has it against nlohmann's DOM and SAX parsers.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace meshtrain::io {

enum class JsonLineStatus : std::uint8_t {
  ok,          // the member is a string; `out` holds it decoded
  empty,       // the line holds nothing but whitespace
  not_json,    // the line is not one JSON value
  not_object,  // a JSON value, but not an object
  missing,     // an object without the member
  not_string,  // the member's value is not a string
  duplicate,   // the member appears more than once (which one is meant?)
};

// "not JSON", "no field", ...: how `meshtrain prep` reports a line it skips.
const char* describe(JsonLineStatus s);

struct JsonLineResult {
  JsonLineStatus status = JsonLineStatus::ok;
  std::size_t offset = 0;  // not_json: the byte of the line where the grammar broke
  const char* why = "";    // not_json: what broke it
};

// Validates `line` as exactly one JSON value (whitespace around it, and a UTF-8 byte-order mark
// before it, allowed) and, when it is an object whose member `key` is a string, decodes that
// string into `out` (replacing its contents). A key is compared after unescaping.
JsonLineResult json_string_field(std::string_view line, std::string_view key, std::string& out);

}  // namespace meshtrain::io
