// Tokenizers: bytes, GPT-2 pre-tokenisation, and BPE over a hand-made vocabulary
// (tests/io/data/tiny_vocab.json + tiny_merges.txt, see the README there) whose encodings are
// worked out by hand below.
#include <string>
#include <vector>

#include "io_test_util.hpp"
#include "meshtrain/io/tokenizer.hpp"

using namespace meshtrain::io;
using io_test::config_error;
using io_test::has;
using Ids = std::vector<std::int32_t>;
using Pieces = std::vector<std::string>;

namespace {
const std::string kData = MESHTRAIN_IO_TEST_DATA;
const std::string kVocab = kData + "/tiny_vocab.json";
const std::string kMerges = kData + "/tiny_merges.txt";
}  // namespace

TEST_CASE("byte tokenizer round trip, non-ASCII included", "[io][tokenizer]") {
  ByteTokenizer t;
  REQUIRE(t.vocab_size() == 256);
  REQUIRE(t.eot() == -1);
  const std::string s = "Hi \xC3\xA9t\xC3\xA9 \xE2\x80\x94 \xF0\x9F\x98\x80\n\t\x01\xFF";
  const Ids ids = t.encode(s);
  REQUIRE(ids.size() == s.size());
  REQUIRE(ids[0] == 'H');
  REQUIRE(ids[3] == 0xC3);
  REQUIRE(ids.back() == 255);
  REQUIRE(t.decode(ids) == s);
  REQUIRE(has(config_error([&] { t.decode({65, 256}); }), "token id 256 at position 1"));
  REQUIRE(make_tokenizer("byte", "", "")->name() == "byte");
  REQUIRE(has(config_error([&] { make_tokenizer("wordpiece", "", ""); }), "'wordpiece' is unknown"));
}

TEST_CASE("GPT-2 pre-tokenisation follows the regex", "[io][tokenizer]") {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  CHECK(gpt2_pretokenize("Hello world") == Pieces{"Hello", " world"});
  CHECK(gpt2_pretokenize("I'm don't we'll they've you're he'd it's") ==
        Pieces{"I", "'m", " don", "'t", " we", "'ll", " they", "'ve", " you", "'re", " he", "'d",
               " it", "'s"});
  CHECK(gpt2_pretokenize("'sup") == Pieces{"'s", "up"});    // no word boundary in the regex
  CHECK(gpt2_pretokenize("!'s") == Pieces{"!'", "s"});      // a run of punctuation goes first
  CHECK(gpt2_pretokenize("abc123 456x") == Pieces{"abc", "123", " 456", "x"});
  CHECK(gpt2_pretokenize("a, b!? (c)") == Pieces{"a", ",", " b", "!?", " (", "c", ")"});
  // Whitespace: a run keeps its last char for the next word, unless it ends the text.
  CHECK(gpt2_pretokenize("a   b") == Pieces{"a", "  ", " b"});
  CHECK(gpt2_pretokenize("a \n\nb") == Pieces{"a", " \n", "\n", "b"});
  CHECK(gpt2_pretokenize("a\nb") == Pieces{"a", "\n", "b"});
  CHECK(gpt2_pretokenize("a  \n") == Pieces{"a", "  \n"});
  CHECK(gpt2_pretokenize(" ") == Pieces{" "});
  CHECK(gpt2_pretokenize("\t x") == Pieces{"\t", " x"});
  CHECK(gpt2_pretokenize("") == Pieces{});
  // Non-ASCII: letters join words; curly quotes, dashes and no-break space are not letters.
  CHECK(gpt2_pretokenize("caf\xC3\xA9 na\xC3\xAFve") == Pieces{"caf\xC3\xA9", " na\xC3\xAFve"});
  CHECK(gpt2_pretokenize("\xE6\x97\xA5\xE6\x9C\xAC \xCE\xB1\xCE\xB2") ==
        Pieces{"\xE6\x97\xA5\xE6\x9C\xAC", " \xCE\xB1\xCE\xB2"});
  CHECK(gpt2_pretokenize("a\xE2\x80\x94" "b") == Pieces{"a", "\xE2\x80\x94", "b"});        // em dash
  CHECK(gpt2_pretokenize("\xE2\x80\x9CHi\xE2\x80\x9D") == Pieces{"\xE2\x80\x9C", "Hi", "\xE2\x80\x9D"});
  CHECK(gpt2_pretokenize("a\xC2\xA0" "b") == Pieces{"a", "\xC2\xA0", "b"});                // NBSP
  CHECK(gpt2_pretokenize("x\xFFy") == Pieces{"x\xFFy"});  // invalid UTF-8 byte: a letter
}

TEST_CASE("GPT-2 BPE on a hand-made vocabulary", "[io][tokenizer]") {
  const auto tok = make_tokenizer("gpt2", kVocab, kMerges);
  REQUIRE(tok->name() == "gpt2-bpe");
  REQUIRE(tok->vocab_size() == 34);
  REQUIRE(tok->eot() == 28);
  struct Case {
    std::string text;
    Ids ids;
  };
  const Case cases[] = {
      // h e l l o: "h e"(0), "l l"(1), "ll o"(2), "he llo"(3) -> hello
      {"hello", {20}},
      // " world": "Ġ w"(4), "o r"(5), "l d"(6), "Ġw or"(7), "Ġwor ld"(8)
      {"hello world", {20, 24}},
      // " hello": "h e"(0) outranks "Ġ h"(10), so Ġ stays alone
      {" hello", {12, 20}},
      {"hello, hello!", {20, 1, 12, 20, 0}},
      // "don" has no merges; "'t" is a contraction piece merged by "' t"(9); " 42" by "4 2"(11)
      {"don't 42", {3, 7, 10, 26, 12, 29}},
      // whitespace run to the end of the text is one piece: Ġ Ġ Ċ
      {"hi  \n", {5, 16, 12, 12, 13}},
      {"hi   world", {5, 16, 12, 12, 24}},
      {"\nhello", {13, 20}},
      // é = C3 A9 = "Ã©": "Ã ©"(12) then "h Ã©"(13) -> one token, since é is a letter
      {"h\xC3\xA9", {33}},
      // " hé": "Ġ h"(10) comes before "Ã ©"(12), and "Ġh Ã©" is no merge
      {"hello h\xC3\xA9", {20, 27, 32}},
      {"", {}},
  };
  for (const Case& c : cases) {
    INFO("text: '" << c.text << "'");
    CHECK(tok->encode(c.text) == c.ids);
    CHECK(tok->decode(c.ids) == c.text);
  }
  CHECK(tok->encode("hello world") == Ids{20, 24});  // second time from the cache
  CHECK(tok->decode({28}) == "<|endoftext|>");
  CHECK(tok->decode({21, 22, 25}) == " world");
  const std::string w = config_error([&] { tok->encode("xyz"); });
  INFO(w);
  CHECK(has(w, "tiny_vocab.json' has no token 'x'"));
  CHECK(has(config_error([&] { tok->decode({5, 34}); }), "token id 34 at position 1"));
  CHECK(has(config_error([&] { tok->decode({-1}); }), "token id -1"));
}

TEST_CASE("BPE files: missing or malformed files are named with the line", "[io][tokenizer]") {
  REQUIRE(has(config_error([&] { Gpt2BpeTokenizer t("no/vocab.json", kMerges); }),
              "'no/vocab.json' cannot be opened"));
  REQUIRE(has(config_error([&] { Gpt2BpeTokenizer t(kVocab, "no/merges.txt"); }),
              "'no/merges.txt' cannot be opened"));
  REQUIRE(has(config_error([&] { make_tokenizer("gpt2", "", kMerges); }), "needs both"));

  const std::string merges = io_test::temp_name("bad_merges", ".txt");
  io_test::write_file(merges, "#version: 0.2\nh e\nl l x\n");
  std::string w = config_error([&] { Gpt2BpeTokenizer t(kVocab, merges); });
  INFO(w);
  CHECK(has(w, merges));
  CHECK(has(w, "line 3 ('l l x')"));
  CHECK(has(w, "two tokens separated by one space"));

  io_test::write_file(merges, "h e\n\nl l\n");  // no #version line: line 1 is a merge
  w = config_error([&] { Gpt2BpeTokenizer t(kVocab, merges); });
  CHECK(has(w, "line 3"));
  CHECK(has(w, "blank line 2"));

  io_test::write_file(merges, "#version: 0.2\nh e\nq z\n");
  w = config_error([&] { Gpt2BpeTokenizer t(kVocab, merges); });
  CHECK(has(w, "line 3"));
  CHECK(has(w, "token 'q' is not in"));

  io_test::write_file(merges, "h e\r\nl l\r\n\r\n");  // CRLF and a trailing blank line are fine
  Gpt2BpeTokenizer crlf(kVocab, merges);
  CHECK(crlf.encode("hell") == Ids{17, 18});

  const std::string vocab = io_test::temp_name("bad_vocab", ".json");
  io_test::write_file(vocab, R"({"a": 0, "b": 0})");
  CHECK(has(config_error([&] { Gpt2BpeTokenizer t(vocab, merges); }), "id 0 is used by 'a' and 'b'"));
  io_test::write_file(vocab, R"({"a": 0, "b": 1.5})");
  CHECK(has(config_error([&] { Gpt2BpeTokenizer t(vocab, merges); }), "token 'b': expected an integer"));
  io_test::write_file(vocab, R"({"a": 0, "b" 1})");
  w = config_error([&] { Gpt2BpeTokenizer t(vocab, merges); });
  CHECK(has(w, vocab));
  CHECK(has(w, "JSON error at byte 13"));
  io_test::write_file(vocab, "[1, 2]");
  CHECK(has(config_error([&] { Gpt2BpeTokenizer t(vocab, merges); }), "must be a non-empty JSON object"));
  std::remove(merges.c_str());
  std::remove(vocab.c_str());
}
