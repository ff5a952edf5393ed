// The JSON reader: values, escapes (\u with surrogate pairs -> UTF-8) and error offsets.
#include <string>

#include "io_test_util.hpp"
#include "meshtrain/io/json.hpp"

using meshtrain::io::Json;
using io_test::config_error;
using io_test::has;

TEST_CASE("JSON values, nesting and key order", "[io][json]") {
  const Json j = Json::parse(
      R"( {"z": [1, -2.5e3, true, false, null, 0, 1E2], "a": {"c": "x", "d": []}, "m": {}} )",
      "t");
  REQUIRE(j.kind == Json::Kind::object);
  REQUIRE(j.obj.size() == 3);
  REQUIRE(j.obj[0].first == "z");  // insertion order, not sorted
  REQUIRE(j.obj[1].first == "a");
  const Json& z = j.at("z", "t");
  REQUIRE(z.arr.size() == 7);
  REQUIRE(z.arr[0].as_int("t") == 1);
  REQUIRE(z.arr[1].as_number("t") == -2500.0);
  REQUIRE(z.arr[2].kind == Json::Kind::boolean);
  REQUIRE(z.arr[2].b);
  REQUIRE_FALSE(z.arr[3].b);
  REQUIRE(z.arr[4].kind == Json::Kind::null);
  REQUIRE(z.arr[5].as_int("t") == 0);
  REQUIRE(z.arr[6].as_int("t") == 100);
  REQUIRE(j.at("a", "t").at("c", "t").as_string("t") == "x");
  REQUIRE(j.at("a", "t").at("d", "t").arr.empty());
  REQUIRE(j.at("m", "t").obj.empty());
  REQUIRE(j.find("nope") == nullptr);
  REQUIRE(Json::parse("\"top\"", "t").str == "top");
  REQUIRE(Json::parse("9007199254740992", "t").as_int("t") == 9007199254740992LL);
}

TEST_CASE("JSON string escapes decode to UTF-8", "[io][json]") {
  REQUIRE(Json::parse(R"("\"\\\/\b\f\n\r\t")", "t").str == "\"\\/\b\f\n\r\t");
  REQUIRE(Json::parse(R"("\u00e9")", "t").str == "\xC3\xA9");       // é, 2 bytes
  REQUIRE(Json::parse(R"("\u20AC")", "t").str == "\xE2\x82\xAC");   // €, 3 bytes
  REQUIRE(Json::parse(R"("\ud83d\ude00")", "t").str == "\xF0\x9F\x98\x80");  // U+1F600, pair
  REQUIRE(Json::parse(R"("\u0041\u0000b")", "t").str == std::string("A\0b", 3));
  REQUIRE(Json::parse("\"h\xC3\xA9llo\"", "t").str == "h\xC3\xA9llo");  // raw UTF-8 passes
  // json_escape is the writer's half: whatever it produces parses back to the same bytes.
  const std::string s = "q\"b\\s/n\nt\tc\x01 \xC3\xA9";
  REQUIRE(Json::parse("\"" + meshtrain::io::json_escape(s) + "\"", "t").str == s);
}

TEST_CASE("JSON errors name the document and the byte offset", "[io][json]") {
  struct Case {
    const char* text;
    const char* offset;
    const char* words;
  };
  const Case cases[] = {
      {R"({"a": 1,})", "at byte 8", "expected a string key"},
      {"[1 2]", "at byte 3", "expected ',' or ']'"},
      {R"({"a" 1})", "at byte 5", "expected ':'"},
      {R"("abc)", "at byte 0", "unterminated string"},
      {"01", "at byte 1", "unexpected text after"},
      {"1.", "at byte 2", "digits after '.'"},
      {"-", "at byte 1", "expected digits"},
      {"1e+", "at byte 3", "exponent"},
      {R"("\ud800")", "at byte 1", "high surrogate"},
      {R"("\ud800\u0041")", "at byte 1", "not followed by a low one"},
      {R"("\udc00")", "at byte 1", "unpaired low surrogate"},
      {R"("\u12g4")", "at byte 5", "bad hex digit"},
      {R"("\x")", "at byte 1", "unknown escape"},
      {"tru", "at byte 0", "expected 'true'"},
      {"\"a\nb\"", "at byte 2", "control character"},
      {"", "at byte 0", "unexpected end of input"},
      {"  ", "at byte 2", "unexpected end of input"},
      {"{} x", "at byte 3", "unexpected text after"},
      {"[1,]", "at byte 3", "expected a value"},
      {"1e999", "at byte 0", "out of range"},
  };
  for (const Case& c : cases) {
    const std::string w = config_error([&] { Json::parse(c.text, "doc.json"); });
    INFO("input: " << c.text << "\nerror: " << w);
    CHECK(has(w, "doc.json: JSON error"));
    CHECK(has(w, c.offset));
    CHECK(has(w, c.words));
  }
  const std::string deep(1000, '[');
  REQUIRE(has(config_error([&] { Json::parse(deep, "deep"); }), "nesting deeper"));
}

TEST_CASE("typed access errors name what was asked for", "[io][json]") {
  const Json j = Json::parse(R"({"n": 3.5, "s": "x", "big": 1e300})", "cfg");
  REQUIRE(has(config_error([&] { j.at("n", "config.json").as_int("config.json n_layer"); }),
              "config.json n_layer: expected an integer, found 3.5"));
  REQUIRE(has(config_error([&] { j.at("s", "cfg").as_int("n_head"); }), "n_head: expected an integer, found a string"));
  REQUIRE(has(config_error([&] { j.at("big", "cfg").as_int("big"); }), "expected an integer"));
  REQUIRE(has(config_error([&] { j.at("n", "cfg").as_string("s"); }), "expected a string, found a number"));
  REQUIRE(has(config_error([&] { j.at("missing", "config.json"); }), "config.json: key 'missing' is missing"));
  REQUIRE(has(config_error([&] { j.at("s", "cfg").at("k", "cfg"); }), "expected an object"));
}
