// JSON through core/json (nlohmann-json underneath): values, escapes (\u with surrogate pairs ->
// UTF-8), the strict grammar, errors that name the document and the byte offset, typed access,
// and the writer's layouts.
#include <cmath>
#include <limits>
#include <string>

#include "harness.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/json.hpp"

using meshtrain::Json;
namespace json = meshtrain::json;

namespace {

// The message of the ConfigError that f throws, or "<no error>".
template <class F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const meshtrain::ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("JSON values, nesting and key order", "[json]") {
  const Json j = json::parse(
      R"( {"z": [1, -2.5e3, true, false, null, 0, 1E2], "a": {"c": "x", "d": []}, "m": {}} )",
      "t");
  REQUIRE(j.is_object());
  REQUIRE(j.size() == 3);
  REQUIRE(j.begin().key() == "z");  // insertion order, not sorted
  REQUIRE(std::next(j.begin()).key() == "a");
  const Json& z = json::at(j, "z", "t");
  REQUIRE(z.size() == 7);
  REQUIRE(json::as_int(z[0], "t") == 1);
  REQUIRE(json::as_number(z[1], "t") == -2500.0);
  REQUIRE(z[2].is_boolean());
  REQUIRE(z[2].get<bool>());
  REQUIRE_FALSE(z[3].get<bool>());
  REQUIRE(z[4].is_null());
  REQUIRE(json::as_int(z[5], "t") == 0);
  REQUIRE(json::as_int(z[6], "t") == 100);
  REQUIRE(json::as_string(json::at(json::at(j, "a", "t"), "c", "t"), "t") == "x");
  REQUIRE(json::at(json::at(j, "a", "t"), "d", "t").empty());
  REQUIRE(json::at(j, "m", "t").empty());
  REQUIRE(json::find(j, "nope") == nullptr);
  REQUIRE(json::parse("\"top\"", "t").get<std::string>() == "top");
  REQUIRE(json::as_int(json::parse("9007199254740992", "t"), "t") == 9007199254740992LL);
  // Integers are kept exactly, past 2^53 too (a double would round them).
  REQUIRE(json::as_int(json::parse("9007199254740993", "t"), "t") == 9007199254740993LL);
  REQUIRE(json::as_int(json::parse("-9223372036854775808", "t"), "t") ==
          std::numeric_limits<std::int64_t>::min());
}

TEST_CASE("JSON string escapes decode to UTF-8", "[json]") {
  auto str = [](const char* text) { return json::parse(text, "t").get<std::string>(); };
  REQUIRE(str(R"("\"\\\/\b\f\n\r\t")") == "\"\\/\b\f\n\r\t");
  REQUIRE(str(R"("\u00e9")") == "\xC3\xA9");       // é, 2 bytes
  REQUIRE(str(R"("\u20AC")") == "\xE2\x82\xAC");   // €, 3 bytes
  REQUIRE(str(R"("\ud83d\ude00")") == "\xF0\x9F\x98\x80");  // U+1F600, pair
  REQUIRE(str(R"("\u0041\u0000b")") == std::string("A\0b", 3));
  REQUIRE(str("\"h\xC3\xA9llo\"") == "h\xC3\xA9llo");  // raw UTF-8 passes
  // The writer's half: whatever dump produces parses back to the same bytes.
  const std::string s = "q\"b\\s/n\nt\tc\x01 \xC3\xA9";
  REQUIRE(json::parse(json::dump(Json(s)), "t").get<std::string>() == s);
  REQUIRE(json::dump(Json(s)) == "\"q\\\"b\\\\s/n\\nt\\tc\\u0001 \xC3\xA9\"");
}

TEST_CASE("JSON errors name the document and the byte offset", "[json]") {
  // The offset is that of the last character read, which ends the token that broke the grammar
  // (the text's length when it ended early); the words are nlohmann-json's reason.
  struct Case {
    const char* text;
    const char* offset;
    const char* words;
  };
  const Case cases[] = {
      {R"({"a": 1,})", "at byte 8", "expected string literal"},
      {"[1 2]", "at byte 3", "expected ']'"},
      {R"({"a" 1})", "at byte 5", "expected ':'"},
      {R"("abc)", "at byte 4", "missing closing quote"},
      {"01", "at byte 1", "expected end of input"},
      {"1.", "at byte 2", "digit after '.'"},
      {"-", "at byte 1", "expected digit"},
      {"1e+", "at byte 3", "exponent"},
      {R"("\ud800")", "at byte 7", "must be followed by U+DC00..U+DFFF"},
      {R"("\ud800\u0041")", "at byte 12", "must be followed by U+DC00..U+DFFF"},
      {R"("\udc00")", "at byte 6", "must follow U+D800..U+DBFF"},
      {R"("\u12g4")", "at byte 5", "4 hex digits"},
      {R"("\x")", "at byte 2", "after backslash"},
      {"tru", "at byte 3", "invalid literal"},
      {"\"a\nb\"", "at byte 2", "control character"},
      {"", "at byte 0", "unexpected end of input"},
      {"  ", "at byte 2", "unexpected end of input"},
      {"{} x", "at byte 3", "expected end of input"},
      {"[1,]", "at byte 3", "unexpected ']'"},
      {"1e999", "at byte 4", "number overflow"},
      {"\"h\xFF\"", "at byte 2", "ill-formed UTF-8"},
  };
  for (const Case& c : cases) {
    const std::string w = config_error([&] { json::parse(c.text, "doc.json"); });
    INFO("input: " << c.text << "\nerror: " << w);
    CHECK(has(w, "doc.json: JSON error"));
    CHECK(has(w, c.offset));
    CHECK(has(w, c.words));
  }
  // Line and column of the offset, for files people edit.
  REQUIRE(has(config_error([&] { json::parse("{\n  \"a\": [1,\n  2,,]}", "cfg.json"); }),
              "cfg.json: JSON error at byte 17 (line 3, column 5)"));
  const std::string deep(1000, '[');
  REQUIRE(has(config_error([&] { json::parse(deep, "deep"); }), "deep: JSON error: nesting deeper"));
  REQUIRE(json::parse(std::string(256, '[') + std::string(256, ']'), "t").is_array());
  // A second value for a key would silently replace the first: rejected, naming the key.
  REQUIRE(has(config_error([&] { json::parse(R"({"a": 1, "b": {"x": 1, "x": 2}})", "dup.json"); }),
              "dup.json: JSON error: key 'x' appears twice in one object"));
}

TEST_CASE("typed access errors name what was asked for", "[json]") {
  const Json j = json::parse(R"({"n": 3.5, "s": "x", "big": 1e300, "huge": 18446744073709551615})",
                             "cfg");
  REQUIRE(has(config_error([&] { json::as_int(json::at(j, "n", "config.json"), "config.json n_layer"); }),
              "config.json n_layer: expected an integer, found 3.5"));
  REQUIRE(has(config_error([&] { json::as_int(json::at(j, "s", "cfg"), "n_head"); }),
              "n_head: expected an integer, found a string"));
  REQUIRE(has(config_error([&] { json::as_int(json::at(j, "big", "cfg"), "big"); }), "expected an integer"));
  REQUIRE(has(config_error([&] { json::as_int(json::at(j, "huge", "cfg"), "huge"); }),
              "huge: expected a 64-bit integer"));
  REQUIRE(has(config_error([&] { json::as_string(json::at(j, "n", "cfg"), "s"); }),
              "expected a string, found a number"));
  REQUIRE(has(config_error([&] { json::as_number(json::at(j, "s", "cfg"), "s"); }),
              "s: expected a number, found a string"));
  REQUIRE(has(config_error([&] { json::at(j, "missing", "config.json"); }),
              "config.json: key 'missing' is missing"));
  REQUIRE(has(config_error([&] { json::at(json::at(j, "s", "cfg"), "k", "cfg"); }), "expected an object"));
  REQUIRE(json::find(json::at(j, "s", "cfg"), "k") == nullptr);  // not an object: nothing found
}

TEST_CASE("the writer: one line, or indented with short containers kept on a line", "[json]") {
  Json v = Json::object();
  v["step"] = 3;
  v["loss"] = 10.987119674682617;
  v["nan"] = std::numeric_limits<double>::quiet_NaN();
  v["tokens"] = std::uint64_t{1} << 40;
  v["list"] = Json::array({1, 2.5, "x", true, nullptr});
  v["empty"] = Json::object();
  // Python's json.dumps separators; doubles shortest round trip; non-finite numbers null.
  REQUIRE(json::dump(v) ==
          R"({"step": 3, "loss": 10.987119674682617, "nan": null, "tokens": 1099511627776, )"
          R"("list": [1, 2.5, "x", true, null], "empty": {}})");
  REQUIRE(json::parse(json::dump(v), "t")["loss"].get<double>() == 10.987119674682617);
  // Six significant digits, as printf's %g writes them (integers stay exact).
  REQUIRE(json::dump(v, {0, 6}) ==
          R"({"step": 3, "loss": 10.9871, "nan": null, "tokens": 1099511627776, )"
          R"("list": [1, 2.5, "x", true, null], "empty": {}})");
  REQUIRE(json::dump(Json(1e-5)) == "1e-05");
  REQUIRE(json::dump(Json(0.0)) == "0.0");
  // Indented: what does not fit in the width opens up, level by level.
  REQUIRE(json::dump(v, {40, 6}) == "{\n"
                                    "  \"step\": 3,\n"
                                    "  \"loss\": 10.9871,\n"
                                    "  \"nan\": null,\n"
                                    "  \"tokens\": 1099511627776,\n"
                                    "  \"list\": [1, 2.5, \"x\", true, null],\n"
                                    "  \"empty\": {}\n"
                                    "}");
  REQUIRE(json::dump(Json::array({Json::array({1, 2}), "abcdefgh"}), {12, 0}) ==
          "[\n  [1, 2],\n  \"abcdefgh\"\n]");
  REQUIRE(json::dump(Json::array({1, 2}), {100, 0}) == "[1, 2]");
  // Levels that may open: an array of records, one record per line.
  const Json records = Json::array({v, v});
  REQUIRE(json::dump(records, {40, 0, 1}) == "[\n  " + json::dump(v) + ",\n  " + json::dump(v) + "\n]");
  // Whatever the layout, the text reads back as the same value.
  REQUIRE(json::parse(json::dump(v, {10, 0}), "t").dump() == v.dump());
  // A string that is not UTF-8 cannot be written as JSON text.
  REQUIRE_THROWS_AS(json::dump(Json(std::string("\xFF"))), meshtrain::Error);
}
