// HuggingFace tokenizer.json: the Llama 3 pre-tokenizer regex through PCRE2, HF's Split
// behaviours, added tokens, BOS/EOS, ignore_merges, both merge forms, and encodings of a
// hand-made tokenizer (tests/io/data/tiny_llama3_tokenizer.json) worked out by hand; GPT-2's
// tokenizer.json form against the vocab.json + merges.txt tokenizer; bad files.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io_test_util.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/io/tokenizer.hpp"

using namespace meshtrain::io;
using meshtrain::Json;
using io_test::config_error;
using io_test::has;
using Ids = std::vector<std::int32_t>;
using Pieces = std::vector<std::string>;

namespace {
const std::string kData = MESHTRAIN_IO_TEST_DATA;
const std::string kLlama3 = kData + "/tiny_llama3_tokenizer.json";
const std::string kGpt2Json = kData + "/gpt2_tiny_tokenizer.json";

// A tokenizer.json around one pre-tokenizer (followed by ByteLevel without a regex) over the
// vocabulary {a, b, c, -}.
std::string with_pre(const std::string& pre, const std::string& extra = "") {
  return R"({"added_tokens": [], "normalizer": null, )" + extra +
         R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [)" + pre +
         R"(, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "-": 3}, "merges": []}})";
}

Pieces split_with(const std::string& behavior, bool invert, const std::string& text) {
  const std::string path = io_test::temp_name("split_" + behavior, ".json");
  io_test::write_file(
      path, with_pre(R"({"type": "Split", "pattern": {"String": "-"}, "behavior": ")" + behavior +
                     R"(", "invert": )" + (invert ? "true" : "false") + "}"));
  HfTokenizer t(path);
  std::remove(path.c_str());
  return t.pre_tokenize(text);
}
}  // namespace

TEST_CASE("Llama 3's pre-tokenizer regex runs exactly", "[io][tokenizer][hf]") {
  HfTokenizer t(kLlama3);
  CHECK(t.pre_tokenize("Hello world") == Pieces{"Hello", " world"});
  // Case-insensitive contractions come first; a letter run takes one leading non-letter.
  CHECK(t.pre_tokenize("he'Ms don't") == Pieces{"he", "'M", "s", " don", "'t"});
  CHECK(t.pre_tokenize("(hi)") == Pieces{"(hi", ")"});
  // Numbers in groups of at most three digits, no leading space.
  CHECK(t.pre_tokenize("12345 x") == Pieces{"123", "45", " x"});
  CHECK(t.pre_tokenize("a\n\nb") == Pieces{"a", "\n\n", "b"});
  CHECK(t.pre_tokenize("x  y") == Pieces{"x", " ", " y"});
  CHECK(t.pre_tokenize("hi!!\n") == Pieces{"hi", "!!\n"});
  CHECK(t.pre_tokenize("end  ") == Pieces{"end", "  "});
  // Unicode: letters of any script, digits of any script (\p{N}), curly quotes are not letters.
  CHECK(t.pre_tokenize("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC") ==
        Pieces{"caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC"});
  CHECK(t.pre_tokenize("\xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4") ==  // Arabic-Indic digits 1234
        Pieces{"\xD9\xA1\xD9\xA2\xD9\xA3", "\xD9\xA4"});
  CHECK(t.pre_tokenize("\xE2\x80\x9CHi\xE2\x80\x9D") == Pieces{"\xE2\x80\x9CHi", "\xE2\x80\x9D"});
  // U+0085 (NEL) is White_Space, so \s: it is not a prefix of the following letters' group
  // twice over; with PCRE2's own \s (which lacks it) this would give {"a", NEL NEL, "b"}.
  CHECK(t.pre_tokenize("a\xC2\x85\xC2\x85"
                       "b") == Pieces{"a", "\xC2\x85",
                                      "\xC2\x85"
                                      "b"});
  // Bytes that are not UTF-8 count as letters and are kept.
  CHECK(t.pre_tokenize("x\xFFy z") == Pieces{"x\xFFy", " z"});
  CHECK(t.pre_tokenize("") == Pieces{});
}

TEST_CASE("the PCRE2 pre-tokenizers split as Python's regex module does", "[io][tokenizer][hf]") {
  // tests/io/data/pretokenize_expected.json (make_pretokenize_expected.py): Unicode letters
  // and digits of several scripts, whitespace runs with NEL, NBSP, U+3000 and U+2028, CRLF,
  // contractions in both cases, emoji.
  std::ifstream in(kData + "/pretokenize_expected.json", std::ios::binary);
  REQUIRE(in);
  const std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Json doc = meshtrain::json::parse(body, "pretokenize_expected.json");
  const std::string& text = meshtrain::json::as_string(meshtrain::json::at(doc, "text", "doc"), "text");
  auto pieces = [&](const char* key) {
    Pieces p;
    for (const Json& v : meshtrain::json::at(doc, key, "doc"))
      p.push_back(meshtrain::json::as_string(v, key));
    return p;
  };
  CHECK(HfTokenizer(kLlama3).pre_tokenize(text) == pieces("llama3"));
  CHECK(gpt2_pretokenize(text) == pieces("gpt2"));
}

TEST_CASE("GPT-2's regex through PCRE2 treats U+0085 as whitespace", "[io][tokenizer][hf]") {
  CHECK(gpt2_pretokenize("a\xC2\x85\xC2\x85"
                         "b") == Pieces{"a", "\xC2\x85", "\xC2\x85", "b"});
  CHECK(gpt2_pretokenize("\xD9\xA1\xD9\xA2x") == Pieces{"\xD9\xA1\xD9\xA2", "x"});  // digits
}

TEST_CASE("Split behaviours follow HF tokenizers", "[io][tokenizer][hf]") {
  // HF's documentation example "the-final--countdown", with single letters.
  CHECK(split_with("Removed", false, "a-b--c") == Pieces{"a", "b", "c"});
  CHECK(split_with("Isolated", false, "a-b--c") == Pieces{"a", "-", "b", "-", "-", "c"});
  CHECK(split_with("MergedWithPrevious", false, "a-b--c") == Pieces{"a-", "b-", "-", "c"});
  CHECK(split_with("MergedWithNext", false, "a-b--c") == Pieces{"a", "-b", "-", "-c"});
  CHECK(split_with("Contiguous", false, "a-b--c") == Pieces{"a", "-", "b", "--", "c"});
  CHECK(split_with("Removed", true, "a-b--c") == Pieces{"-", "-", "-"});
  CHECK(split_with("Isolated", false, "-a-") == Pieces{"-", "a", "-"});
  CHECK(split_with("MergedWithPrevious", false, "-a") == Pieces{"-", "a"});
}

TEST_CASE("ByteLevel with add_prefix_space and GPT-2's regex", "[io][tokenizer][hf]") {
  const std::string path = io_test::temp_name("prefix_space", ".json");
  io_test::write_file(path, R"({"normalizer": null,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true},
      "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  HfTokenizer t(path);
  std::remove(path.c_str());
  CHECK(t.pre_tokenize("hello world") == Pieces{" hello", " world"});
  CHECK(t.pre_tokenize(" x") == Pieces{" x"});
}

TEST_CASE("A hand-made Llama 3 style tokenizer.json encodes as worked out by hand",
          "[io][tokenizer][hf]") {
  const auto tok = make_tokenizer("hf", kLlama3, "");
  REQUIRE(tok->name() == "hf");
  REQUIRE(tok->vocab_size() == 42);
  REQUIRE(tok->bos() == 40);  // the template's first special token
  REQUIRE(tok->eot() == 41);  // <|end_of_text|>
  struct Case {
    std::string text;
    Ids ids;
  };
  const Case cases[] = {
      // ignore_merges: a piece that is a vocabulary entry is that token.
      {"hello world", {24, 28}},
      {"lo", {34}},  // no merge makes "lo"; without ignore_merges it would be l, o
      // Merges by rank: h e (0), l l (1) -> he ll
      {"hell", {21, 22}},
      // "(hello" is one piece; "h e" outranks "( h", so "(" stays alone
      {"(hello)", {19, 24, 20}},
      {"don't", {3, 7, 10, 30}},
      {"he'Ms", {21, 36, 37}},
      {"12345", {32, 17, 18}},
      // "world" without its space: o r (5), l d (6) -> w or ld
      {"hello\n\nworld", {24, 13, 13, 9, 26, 29}},
      {" world  ", {28, 12, 12}},
      {"<|begin_of_text|>hello<|end_of_text|>", {40, 24, 41}},
      {"hello<|end_of_text|><|begin_of_text|>", {24, 41, 40}},
      {"", {}},
  };
  for (const Case& c : cases) {
    INFO("text: '" << c.text << "'");
    CHECK(tok->encode(c.text) == c.ids);
    CHECK(tok->decode(c.ids) == c.text);
  }
  // <mask> has lstrip: the space before it is part of the token.
  CHECK(tok->encode("he <mask>") == Ids{21, 39});
  CHECK(tok->decode({21, 39}) == "he<mask>");
  const auto* hf = dynamic_cast<const HfTokenizer*>(tok.get());
  REQUIRE(hf != nullptr);
  CHECK(hf->token_id("hello") == 24);
  CHECK(hf->token_id("<|end_of_text|>") == 41);
  CHECK(hf->token_id("zzz") == -1);
  CHECK(has(config_error([&] { tok->encode("xyz"); }), "has no token 'x'"));
  CHECK(has(config_error([&] { tok->decode({5, 38}); }), "token id 38 at position 1"));
}

TEST_CASE("GPT-2's tokenizer.json encodes as its vocab.json + merges.txt", "[io][tokenizer][hf]") {
  const auto a = make_tokenizer("gpt2", kData + "/tiny_vocab.json", kData + "/tiny_merges.txt");
  const auto b = make_tokenizer("hf", kGpt2Json, "");
  // A tokenizer.json given as the gpt2 kind's only file is read as one.
  const auto c = make_tokenizer("gpt2", kGpt2Json, "");
  REQUIRE(c->name() == "hf");
  REQUIRE(b->vocab_size() == a->vocab_size());
  REQUIRE(b->eot() == a->eot());
  for (const std::string text :
       {"hello", "hello world", " hello", "hello, hello!", "don't 42", "hi  \n", "hi   world",
        "\nhello", "h\xC3\xA9", "hello h\xC3\xA9", "hello<|endoftext|>hello"}) {
    INFO("text: '" << text << "'");
    if (std::string(text).find("<|") == std::string::npos)
      CHECK(b->encode(text) == a->encode(text));
    CHECK(b->decode(b->encode(text)) == text);
  }
  // The added token is matched in the text (the vocab.json tokenizer has no such rule).
  CHECK(b->encode("hello<|endoftext|>") == Ids{20, 28});
}

TEST_CASE("BOS and EOS: explicit names, tokenizer_config.json", "[io][tokenizer][hf]") {
  HfTokenizer named(kLlama3, "<|end_of_text|>", "<mask>");
  CHECK(named.bos() == 41);
  CHECK(named.eot() == 39);
  CHECK(has(config_error([&] { HfTokenizer t(kLlama3, "", "<nope>"); }),
            "the EOS token '<nope>' is not in the vocabulary"));

  namespace fs = std::filesystem;
  const fs::path dir = io_test::temp_name("hf_dir", "");
  fs::create_directories(dir);
  fs::copy_file(kLlama3, dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  io_test::write_file((dir / "tokenizer_config.json").string(),
                      R"({"bos_token": {"content": "<|begin_of_text|>"}, "eos_token": "<mask>"})");
  HfTokenizer from_dir(dir.string());  // a folder holding tokenizer.json
  CHECK(from_dir.bos() == 40);
  CHECK(from_dir.eot() == 39);
  CHECK(from_dir.path() == (dir / "tokenizer.json").string());
  fs::remove_all(dir);
}

TEST_CASE("tokenizer.json: unsupported or broken files are named with the part",
          "[io][tokenizer][hf]") {
  const std::string path = io_test::temp_name("bad_tokenizer", ".json");
  auto error_for = [&](const std::string& text) {
    io_test::write_file(path, text);
    return config_error([&] { HfTokenizer t(path); });
  };
  std::string w = error_for(
      with_pre(R"({"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated"})"));
  INFO(w);
  CHECK(has(w, path));
  CHECK(has(w, "does not compile"));
  CHECK(has(error_for(with_pre(R"({"type": "Whitespace"})")),
            "pre-tokenizer 'Whitespace' is not supported"));
  CHECK(has(error_for(with_pre(
                R"({"type": "Split", "pattern": {"String": "-"}, "behavior": "Sideways"})")),
            "behavior 'Sideways' is unknown"));
  CHECK(has(error_for(R"({"normalizer": {"type": "NFC"}, "model": {}})"),
            "normalizer 'NFC' is not supported"));
  CHECK(has(error_for(R"({"pre_tokenizer": {"type": "ByteLevel"},
                         "model": {"type": "WordPiece", "vocab": {"a": 0}}})"),
            "model type 'WordPiece' is not supported"));
  w = error_for(R"({"pre_tokenizer": {"type": "ByteLevel"},
                   "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a", "q"]]}})");
  CHECK(has(w, "model.merges[0]"));
  CHECK(has(w, "token 'q' is not in"));
  CHECK(has(error_for(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})"),
            "must end with ByteLevel"));
  CHECK(has(error_for(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}})"),
            "id 0 is used by"));
  CHECK(has(error_for("{\"model\": "), "JSON error"));
  std::remove(path.c_str());
  CHECK(has(config_error([&] { HfTokenizer t("no/such/tokenizer.json"); }), "cannot be opened"));
  CHECK(has(config_error([&] { make_tokenizer("hf", "", ""); }),
            "needs a HuggingFace tokenizer.json"));
}
