// io::json_string_field: the JSON-lines field extractor of `meshtrain prep`, by hand-made cases
// and against nlohmann-json's parser (the oracle) on randomly damaged records.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "harness.hpp"
#include "meshtrain/io/json_lines.hpp"

using namespace meshtrain::io;

namespace {

struct Got {
  JsonLineStatus status;
  std::string text;
};

Got field(const std::string& line, const std::string& key = "text") {
  std::string out = "<untouched>";
  const JsonLineResult r = json_string_field(line, key, out);
  return {r.status, r.status == JsonLineStatus::ok ? out : std::string()};
}

}  // namespace

TEST_CASE("the text member of a JSON line is decoded", "[io][jsonl]") {
  CHECK(field(R"({"text": "hello"})").text == "hello");
  CHECK(field(R"(  {"id": 3, "text": "a\"b\\c\/d\b\f\n\r\t", "meta": {"x": [1, 2.5e-3, null, true]}}  )")
            .text == "a\"b\\c/d\b\f\n\r\t");
  // \u escapes: BMP, a surrogate pair (U+1F600), NUL; raw UTF-8 passes through.
  CHECK(field(R"({"text": "caf\u00e9 \u20ac \ud83d\ude00 \u0000!"})").text ==
        std::string("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 ") + std::string(1, '\0') + "!");
  CHECK(field("{\"text\": \"caf\xC3\xA9 \xF0\x9F\x98\x80\"}").text == "caf\xC3\xA9 \xF0\x9F\x98\x80");
  // A key is compared after unescaping; other fields' names may equal our value.
  CHECK(field(R"({"te\u0078t": "esc"})").text == "esc");
  CHECK(field(R"({"content": "text", "text": ""})").text.empty());
  CHECK(field(R"({"body": "x"})", "body").text == "x");
  // A byte-order mark and a CR before the newline (CRLF files) are fine.
  CHECK(field("\xEF\xBB\xBF{\"text\": \"bom\"}\r").text == "bom");
  CHECK(field(R"({"text":"a","text2":"b"})").status == JsonLineStatus::ok);
}

TEST_CASE("JSON lines that are not usable say why", "[io][jsonl]") {
  using S = JsonLineStatus;
  CHECK(field("").status == S::empty);
  CHECK(field(" \t\r").status == S::empty);
  CHECK(field(R"(["text", "x"])").status == S::not_object);
  CHECK(field(R"("text")").status == S::not_object);
  CHECK(field("42").status == S::not_object);
  CHECK(field(R"({"txt": "x"})").status == S::missing);
  CHECK(field("{}").status == S::missing);
  CHECK(field(R"({"meta": {"text": "nested"}})").status == S::missing);
  CHECK(field(R"({"text": 5})").status == S::not_string);
  CHECK(field(R"({"text": null})").status == S::not_string);
  CHECK(field(R"({"text": ["a"]})").status == S::not_string);
  CHECK(field(R"({"text": "a", "text": "b"})").status == S::duplicate);
  for (const char* bad : {
           R"({"text": "x",})",          // trailing comma
           R"({'text': 'x'})",           // single quotes
           R"({"text": "x")",            // unterminated object
           R"({"text": "x)",             // unterminated string
           R"({"text": "x"} {})",        // two values
           R"({"text" "x"})",            // no colon
           R"({text: "x"})",             // bare key
           R"({"text": "\x"})",          // bad escape
           R"({"text": "\u12"})",        // short \u
           R"({"text": "\ud83d"})",      // lone high surrogate
           R"({"text": "\ude00"})",      // lone low surrogate
           R"({"text": "\ud83d\u0041"})",  // high surrogate, then no low one
           R"({"n": 01, "text": "x"})",  // leading zero
           R"({"n": 1., "text": "x"})",
           R"({"n": .5, "text": "x"})",
           R"({"n": +1, "text": "x"})",
           R"({"n": tru, "text": "x"})",
           R"({"n": [1 2], "text": "x"})",
       }) {
    INFO(bad);
    CHECK(field(bad).status == S::not_json);
  }
  // Control characters and broken UTF-8 inside strings (RFC 8259 / 3629).
  CHECK(field("{\"text\": \"a\tb\"}").status == S::not_json);
  CHECK(field("{\"text\": \"\xC3\"}").status == S::not_json);        // truncated sequence
  CHECK(field("{\"text\": \"\xC0\xAF\"}").status == S::not_json);    // overlong
  CHECK(field("{\"text\": \"\xED\xA0\x80\"}").status == S::not_json);  // encoded surrogate
  CHECK(field("{\"text\": \"\xF4\x90\x80\x80\"}").status == S::not_json);  // above U+10FFFF
  CHECK(field("{\"text\": \"\xFF\"}").status == S::not_json);
  // Where and why.
  std::string out;
  const JsonLineResult r = json_string_field(R"({"text": "x",})", "text", out);
  CHECK(r.offset == 13);
  CHECK(std::string(r.why) == "expected a key");
  std::string deep(300, '[');
  CHECK(field("{\"a\": " + deep + "}").status == S::not_json);
  CHECK(std::string(describe(S::missing)) == "no such field");
}

TEST_CASE("the extractor agrees with nlohmann-json on damaged records", "[io][jsonl]") {
  const std::vector<std::string> seeds = {
      R"({"id": "doc-1", "text": "Plain text.\nSecond line.", "meta": {"lang": "en", "score": 0.93}})",
      R"({"text": "caf\u00e9 \ud83d\ude00 \"quoted\" \\ \/ tab\t", "n": [1, -2.5e+3, true, false, null]})",
      "{\"text\": \"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80 na\xC3\xAFve\", \"x\": {}}",
      R"({"a": [], "b": [[{}]], "text": "", "c": -0.0})",
      R"({"text": 12, "other": "text"})",
      R"(["not", "an", "object"])",
  };
  // Damage: JSON punctuation, escapes, digits, letters and bytes that are not UTF-8.
  const std::string alphabet = "{}[]:,\"\\/ubfnrt0123456789-+.eEaxz \t\n\x01\x7F\xC3\xA9\xED\xF0\xFF";
  std::mt19937_64 rng(38);
  int agreed = 0, valid = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string line = seeds[trial % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < edits && !line.empty(); ++k) {
      const std::size_t at = rng() % line.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: line[at] = c; break;
        case 1: line.insert(line.begin() + static_cast<std::ptrdiff_t>(at), c); break;
        default: line.erase(at, 1);
      }
    }
    std::string out;
    const JsonLineResult r = json_string_field(line, "text", out);
    nlohmann::json j;
    bool parsed = true;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error&) {
      parsed = false;
    }
    INFO("line: " << line);
    const bool ours = r.status != JsonLineStatus::not_json && r.status != JsonLineStatus::empty;
    REQUIRE(ours == parsed);
    if (!parsed) continue;
    ++valid;
    if (r.status == JsonLineStatus::duplicate) continue;  // nlohmann keeps the last value
    const bool is_obj = j.is_object();
    REQUIRE((r.status != JsonLineStatus::not_object) == is_obj);
    if (!is_obj) continue;
    const auto it = j.find("text");
    REQUIRE((r.status != JsonLineStatus::missing) == (it != j.end()));
    if (it == j.end()) continue;
    REQUIRE((r.status == JsonLineStatus::ok) == it->is_string());
    if (it->is_string()) REQUIRE(out == it->get<std::string>());
    ++agreed;
  }
  INFO(valid << " valid damaged lines, " << agreed << " with a text member compared");
  CHECK(valid > 1000);
  CHECK(agreed > 500);
}
