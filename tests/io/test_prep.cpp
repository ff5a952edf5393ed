// `meshtrain prep` as a library function: options, splits, shard sizes, tokenizers, errors.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io_test_util.hpp"
#include "meshtrain/app/prep.hpp"
#include "meshtrain/io/dataset.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/io/tokenizer.hpp"

using namespace meshtrain;
using io_test::config_error;
using io_test::has;

namespace {

const std::string kData = MESHTRAIN_IO_TEST_DATA;

std::vector<std::uint16_t> read_tokens(const std::vector<std::string>& files) {
  std::vector<std::uint16_t> out;
  for (const auto& f : files) {
    io::TokenShard s(f);
    out.insert(out.end(), s.data(), s.data() + s.size());
  }
  return out;
}

app::PrepConfig parse(const std::vector<std::string>& args) {
  return app::prep_config(config::parse(args, app::prep_options()).vm);
}

}  // namespace

TEST_CASE("prep splits the text into train and val shards", "[io][prep]") {
  const std::string dir = io_test::temp_name("prep_out", "");
  const std::string text_path = io_test::temp_name("prep_text", ".txt");
  std::string text;
  for (int i = 0; i < 100; ++i) text += "line " + std::to_string(i % 10) + " caf\xC3\xA9\n";
  REQUIRE(text.size() == 1300);
  io_test::write_file(text_path, text);

  app::PrepConfig c = parse({"--prep.input", text_path, "--prep.output", dir + "/sub/x",
                             "--prep.shard_tokens", "500", "--prep.val_fraction", "0.1"});
  REQUIRE(c.tokenizer == "byte");
  app::PrepSummary s = app::run_prep(c);  // also creates dir/sub
  REQUIRE(s.input_bytes == 1300);
  REQUIRE(s.train_tokens == 1170);  // the first 90 %
  REQUIRE(s.val_tokens == 130);      // the last 10 %
  REQUIRE(s.train_files == std::vector<std::string>{dir + "/sub/x_train_000000.bin",
                                                    dir + "/sub/x_train_000001.bin",
                                                    dir + "/sub/x_train_000002.bin"});
  REQUIRE(s.val_files == std::vector<std::string>{dir + "/sub/x_val_000000.bin"});
  REQUIRE(io::TokenShard(s.train_files[2]).size() == 170);
  auto train = read_tokens(s.train_files), val = read_tokens(s.val_files);
  train.insert(train.end(), val.begin(), val.end());
  REQUIRE(io::ByteTokenizer().decode(std::vector<std::int32_t>(train.begin(), train.end())) == text);
  REQUIRE(io::TokenDataset(dir + "/sub/x_train_*.bin", 15).num_windows() == 31 + 31 + 10);

  // A re-run with bigger shards removes the shards the first run wrote beyond its own.
  c.shard_tokens = 100000;
  s = app::run_prep(c);
  REQUIRE(s.train_files.size() == 1);
  REQUIRE_FALSE(std::filesystem::exists(dir + "/sub/x_train_000001.bin"));
  REQUIRE(io::TokenShard(s.train_files[0]).size() == 1170);

  // val_fraction 0: no validation files.
  c.val_fraction = 0;
  s = app::run_prep(c);
  REQUIRE(s.val_files.empty());
  REQUIRE(s.train_tokens == 1300);
  std::filesystem::remove_all(dir);
  std::remove(text_path.c_str());
}

TEST_CASE("prep with the GPT-2 tokenizer starts each document with <|endoftext|>", "[io][prep]") {
  const std::string a = io_test::temp_name("prep_a", ".txt"), b = io_test::temp_name("prep_b", ".txt");
  io_test::write_file(a, "hello world");
  io_test::write_file(b, "\nhello");
  const std::string out = io_test::temp_name("prep_gpt2", "");
  const auto c = parse({"--prep.input", a + "," + b, "--prep.output", out, "--prep.tokenizer", "gpt2",
                        "--prep.vocab_json", kData + "/tiny_vocab.json", "--prep.merges_txt",
                        kData + "/tiny_merges.txt", "--prep.val_fraction", "0"});
  REQUIRE(c.inputs == std::vector<std::string>{a, b});
  const auto s = app::run_prep(c);
  REQUIRE(s.vocab_size == 34);
  REQUIRE(read_tokens(s.train_files) == std::vector<std::uint16_t>{28, 20, 24, 28, 13, 20});
  std::remove(s.train_files[0].c_str());

  // A vocabulary with ids beyond uint16 cannot be stored in shards.
  const auto big = parse({"--prep.input", a, "--prep.output", out, "--prep.tokenizer", "gpt2",
                          "--prep.vocab_json", kData + "/big_vocab.json", "--prep.merges_txt",
                          kData + "/tiny_merges.txt"});
  const std::string w = config_error([&] { app::run_prep(big); });
  INFO(w);
  REQUIRE(has(w, "70001 ids"));
  REQUIRE(has(w, "at most 65536"));
  REQUIRE(has(w, "big_vocab.json"));
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST_CASE("prep with a tokenizer.json puts EOS after each document", "[io][prep][hf]") {
  const std::string a = io_test::temp_name("prep_hf", ".txt");
  io_test::write_file(a, "hello world\n(hello)\n");
  const std::string out = io_test::temp_name("prep_hf_out", "");
  const std::vector<std::string> base = {"--prep.input", a, "--prep.output", out,
                                         "--prep.tokenizer", "hf", "--prep.tokenizer_json",
                                         kData + "/tiny_llama3_tokenizer.json",
                                         "--prep.val_fraction", "0"};
  // One document per file: the tokenizer's EOS (<|end_of_text|>, 41) after it.
  auto s = app::run_prep(parse(base));
  REQUIRE(s.documents == 1);
  REQUIRE(s.vocab_size == 42);
  REQUIRE(read_tokens(s.train_files) == std::vector<std::uint16_t>{24, 28, 13, 19, 24, 20, 13, 41});
  // A line starting with '(' starts a document; BOS (40) before each as well.
  auto args = base;
  args.insert(args.end(), {"--prep.document_start", "^\\(", "--prep.bos"});
  s = app::run_prep(parse(args));
  REQUIRE(s.documents == 2);
  REQUIRE(read_tokens(s.train_files) ==
          std::vector<std::uint16_t>{40, 24, 28, 13, 41, 40, 19, 24, 20, 13, 41});
  // Other separator tokens by name; none at all.
  args = base;
  args.insert(args.end(), {"--prep.eos_token", "<mask>"});
  s = app::run_prep(parse(args));
  REQUIRE(read_tokens(s.train_files).back() == 39);
  args = base;
  args.insert(args.end(), {"--prep.eos", "false"});
  s = app::run_prep(parse(args));
  REQUIRE(read_tokens(s.train_files) == std::vector<std::uint16_t>{24, 28, 13, 19, 24, 20, 13});
  args = base;
  args.insert(args.end(), {"--prep.eos_token", "<none>"});
  REQUIRE(has(config_error([&] { app::run_prep(parse(args)); }), "the EOS token '<none>'"));
  args = base;
  args.insert(args.end(), {"--prep.document_start", "(("});
  REQUIRE(has(config_error([&] { app::run_prep(parse(args)); }), "prep.document_start"));
  REQUIRE(has(config_error([&] { parse({"--prep.input", a, "--prep.output", out,
                                        "--prep.tokenizer", "hf"}); }),
              "needs prep.tokenizer_json"));
  for (const auto& f : s.train_files) std::remove(f.c_str());
  std::remove(a.c_str());
}

TEST_CASE("the books of the shipped corpus are its documents", "[io][prep]") {
  // inputs/README.md: kjv.txt holds ten books, each opening with its chapter-1 heading
  // ("Genesis 1", ..., "1 Samuel 1"); prep.document_start as given in prep's --help.
  std::ifstream in(kData + "/../../../inputs/kjv.txt", std::ios::binary);
  REQUIRE(in);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto docs = io::split_documents(text, "^(?:[12] )?[A-Z][a-z]+ 1$", "test");
  REQUIRE(docs.size() == 10);
  const char* heads[] = {"Genesis 1\n", "Exodus 1\n", "Leviticus 1\n", "Numbers 1\n",
                         "Deuteronomy 1\n", "Joshua 1\n", "Judges 1\n", "Ruth 1\n",
                         "1 Samuel 1\n", "2 Samuel 1\n"};
  std::size_t total = 0;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    INFO("document " << i);
    CHECK(docs[i].substr(0, std::string(heads[i]).size()) == heads[i]);
    total += docs[i].size();
  }
  REQUIRE(total == text.size());
  // Byte ranges that tile the text (ranks of a parallel prep) give the same documents.
  for (std::size_t piece : {std::size_t{1000}, std::size_t{77777}, text.size() / 3, text.size()}) {
    std::vector<std::string_view> got;
    for (std::size_t b = 0; b < text.size(); b += piece)
      for (auto d : io::split_documents_in_range(text, b, std::min(b + piece, text.size()),
                                                 "^(?:[12] )?[A-Z][a-z]+ 1$", "test"))
        got.push_back(d);
    INFO("pieces of " << piece << " bytes");
    REQUIRE(got == docs);
  }
  REQUIRE(io::split_documents("", "", "test").size() == 1);
  REQUIRE(io::split_documents("a\nb\n", "^b", "test") ==
          std::vector<std::string_view>{"a\n", "b\n"});
}

TEST_CASE("prep options and inputs are checked", "[io][prep]") {
  REQUIRE(has(config_error([&] { parse({"--prep.output", "x"}); }), "prep.input is required"));
  REQUIRE(has(config_error([&] { parse({"--prep.input", "a"}); }), "prep.output is required"));
  REQUIRE(has(config_error([&] { parse({"--prep.input", "a", "--prep.output", "x",
                                        "--prep.val_fraction", "1"}); }),
              "prep.val_fraction=1 must be in [0, 1)"));
  REQUIRE(has(config_error([&] { parse({"--prep.input", "a", "--prep.output", "x",
                                        "--prep.shard_tokens", "0"}); }),
              "prep.shard_tokens=0"));
  REQUIRE(has(config_error([&] { parse({"--prep.input", "a", "--prep.output", "x",
                                        "--prep.tokenizer", "bpe"}); }),
              "prep.tokenizer='bpe'"));
  REQUIRE(has(config_error([&] { parse({"--prep.input", "a", "--prep.output", "x",
                                        "--prep.tokenizer", "gpt2"}); }),
              "needs prep.vocab_json and prep.merges_txt"));
  const auto c = parse({"--prep.input", "a,b", "--prep.input", "c", "--prep.output", "x"});
  REQUIRE(c.inputs == std::vector<std::string>{"a", "b", "c"});
  // Globs expand to their files in sorted order; one that matches nothing is an error.
  const std::string dir = io_test::temp_name("prep_glob", "");
  std::filesystem::create_directories(dir);
  for (const char* f : {"b.jsonl", "a.jsonl", "c.txt"}) io_test::write_file(dir + "/" + f, "x");
  REQUIRE(parse({"--prep.input", dir + "/*.jsonl," + dir + "/c.txt", "--prep.output", "x"}).inputs ==
          std::vector<std::string>{dir + "/a.jsonl", dir + "/b.jsonl", dir + "/c.txt"});
  REQUIRE(has(config_error([&] { parse({"--prep.input", dir + "/*.zst", "--prep.output", "x"}); }),
              "prep.input: no file matches '" + dir + "/*.zst'"));
  std::filesystem::remove_all(dir);
  const auto missing = parse({"--prep.input", "no_such_input.txt", "--prep.output", "x"});
  REQUIRE(has(config_error([&] { app::run_prep(missing); }),
              "prep.input: cannot open 'no_such_input.txt'"));
  const std::string empty = io_test::temp_name("prep_empty", ".txt");
  io_test::write_file(empty, "");
  REQUIRE(has(config_error([&] { app::run_prep(parse({"--prep.input", empty, "--prep.output", "x"})); }),
              "empty"));
  std::remove(empty.c_str());
}

TEST_CASE("prep keeps the earlier shards until every new one is written", "[io][prep]") {
  namespace fs = std::filesystem;
  const std::string dir = io_test::temp_name("prep_keep", "");
  const std::string text_path = io_test::temp_name("prep_keep_text", ".txt");
  io_test::write_file(text_path, std::string(1000, 'a'));
  app::PrepConfig c = parse({"--prep.input", text_path, "--prep.output", dir + "/x",
                             "--prep.val_fraction", "0.1"});
  const app::PrepSummary first = app::run_prep(c);
  REQUIRE(io::TokenShard(first.train_files[0]).size() == 900);
  // The second run cannot write its validation shard (a folder sits where its file goes).
  io_test::write_file(text_path, std::string(2000, 'b'));
  fs::create_directories(dir + "/x_val_000000.bin.new/blocker");
  REQUIRE_THROWS_AS(app::run_prep(c), ConfigError);
  // The earlier data is as it was, and nothing of the failed run is left behind.
  REQUIRE(io::TokenShard(dir + "/x_train_000000.bin").size() == 900);
  REQUIRE(io::TokenShard(dir + "/x_train_000000.bin")[0] == 'a');
  REQUIRE(io::TokenShard(dir + "/x_val_000000.bin").size() == 100);
  REQUIRE_FALSE(fs::exists(dir + "/x_train_000000.bin.new"));
  fs::remove_all(dir + "/x_val_000000.bin.new");
  const app::PrepSummary second = app::run_prep(c);
  REQUIRE(io::TokenShard(second.train_files[0]).size() == 1800);
  REQUIRE(io::TokenShard(second.train_files[0])[0] == 'b');
  fs::remove_all(dir);
  std::remove(text_path.c_str());
}
