// `meshtrain prep` on JSON lines (plain, gzip, zstd): documents, malformed lines (skipped and
// listed, or an error under prep.strict), the text field, the document index.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "compress_util.hpp"
#include "io_test_util.hpp"
#include "meshtrain/app/prep.hpp"
#include "meshtrain/io/json_lines.hpp"
#include "meshtrain/io/token_shard.hpp"

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

std::vector<std::uint16_t> bytes(const std::string& s) {
  std::vector<std::uint16_t> out;
  for (char c : s) out.push_back(static_cast<unsigned char>(c));
  return out;
}

app::PrepConfig parse(std::vector<std::string> args) {
  return app::prep_config(config::parse(args, app::prep_options()).vm);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Lines 1-9: good, good, not JSON, no "text", "text" not a string, empty, good (escapes),
// duplicate field, good (empty text). The good ones' texts are kGood.
const std::string kCorpus =
    "{\"text\": \"alpha\", \"id\": 1}\n"
    "{\"id\": 2, \"text\": \"beta\\ngamma\"}\n"
    "{\"text\": \"broken\",}\n"
    "{\"body\": \"no text\"}\n"
    "{\"text\": 42}\n"
    "\n"
    "{\"text\": \"caf\\u00e9 \\ud83d\\ude00\"}\r\n"
    "{\"text\": \"a\", \"text\": \"b\"}\n"
    "{\"text\": \"\"}";
const std::vector<std::string> kGood = {"alpha", "beta\ngamma", "caf\xC3\xA9 \xF0\x9F\x98\x80", ""};

}  // namespace

TEST_CASE("prep reads JSON lines and reports the lines it skips", "[io][prep][jsonl]") {
  const std::string in = io_test::temp_name("jsonl_corpus", ".jsonl");
  const std::string out = io_test::temp_name("jsonl_out", "") + "/c";
  io_test::write_file(in, kCorpus);
  const app::PrepSummary s =
      app::run_prep(parse({"--prep.input", in, "--prep.output", out, "--prep.val_fraction", "0"}));
  std::string all;
  for (const auto& g : kGood) all += g;
  REQUIRE(read_tokens(s.train_files) == bytes(all));
  CHECK(s.documents == 4);
  CHECK(s.json_lines == 9);
  CHECK(s.skipped_lines == 5);
  CHECK(s.skipped_by_status[static_cast<int>(io::JsonLineStatus::not_json)] == 1);
  CHECK(s.skipped_by_status[static_cast<int>(io::JsonLineStatus::missing)] == 1);
  CHECK(s.skipped_by_status[static_cast<int>(io::JsonLineStatus::not_string)] == 1);
  CHECK(s.skipped_by_status[static_cast<int>(io::JsonLineStatus::empty)] == 1);
  CHECK(s.skipped_by_status[static_cast<int>(io::JsonLineStatus::duplicate)] == 1);
  // Every skipped line is listed with its file and line.
  REQUIRE(s.skipped_report == out + "_skipped_lines.txt");
  const std::string report = slurp(s.skipped_report);
  INFO(report);
  CHECK(has(report, in + ":3: not JSON (expected a key at byte 18)"));
  CHECK(has(report, in + ":4: no field \"text\""));
  CHECK(has(report, in + ":5: field \"text\" is not a string"));
  CHECK(has(report, in + ":6: empty line"));
  CHECK(has(report, in + ":8: field \"text\" given twice"));
  REQUIRE(s.first_skipped.size() == 5);
  CHECK(s.first_skipped[0].rfind(in + ":3: ", 0) == 0);

  // Another field; a clean corpus leaves no report behind.
  io_test::write_file(in, "{\"content\": \"x\"}\n{\"content\": \"yz\"}\n");
  const app::PrepSummary t = app::run_prep(parse({"--prep.input", in, "--prep.output", out,
                                                  "--prep.val_fraction", "0",
                                                  "--prep.text_field", "content"}));
  CHECK(read_tokens(t.train_files) == bytes("xyz"));
  CHECK(t.skipped_lines == 0);
  CHECK_FALSE(std::filesystem::exists(out + "_skipped_lines.txt"));
  std::filesystem::remove_all(std::filesystem::path(out).parent_path());
  std::remove(in.c_str());
}

TEST_CASE("prep.strict stops at the first malformed line, naming it", "[io][prep][jsonl]") {
  const std::string in = io_test::temp_name("jsonl_strict", ".jsonl.gz");
  const std::string out = io_test::temp_name("jsonl_strict_out", "") + "/c";
  io_test::write_file(in, io_test::gzip(kCorpus));
  const std::string w = config_error([&] {
    app::run_prep(parse({"--prep.input", in, "--prep.output", out, "--prep.strict"}));
  });
  INFO(w);
  CHECK(has(w, "prep.strict: " + in + ":3: not JSON"));
  CHECK_FALSE(std::filesystem::exists(out + "_train_000000.bin"));
  // Without the bad lines it passes.
  io_test::write_file(in, io_test::gzip("{\"text\": \"ok\"}\n"));
  CHECK(read_tokens(app::run_prep(parse({"--prep.input", in, "--prep.output", out, "--prep.strict",
                                         "--prep.val_fraction", "0"})).train_files) == bytes("ok"));
  std::filesystem::remove_all(std::filesystem::path(out).parent_path());
  std::remove(in.c_str());
}

TEST_CASE("compressed JSON lines give the plain file's shards; truncated ones stop", "[io][prep][jsonl]") {
  std::string corpus;
  for (int i = 0; i < 3000; ++i)
    corpus += "{\"id\": " + std::to_string(i) + ", \"text\": \"document " + std::to_string(i) +
              " \\u00e9\"}\n";
  const std::string plain = io_test::temp_name("jsonl_z", ".jsonl");
  const std::string gz = io_test::temp_name("jsonl_z", ".jsonl.gz");
  const std::string zst = io_test::temp_name("jsonl_z", ".jsonl.zst");
  const std::string txt = io_test::temp_name("jsonl_z", ".txt.zst");
  io_test::write_file(plain, corpus);
  io_test::write_file(gz, io_test::gzip(corpus));
  io_test::write_file(zst, io_test::zstd(corpus));
  io_test::write_file(txt, io_test::zstd("A text file, compressed.\n"));
  const std::string out = io_test::temp_name("jsonl_z_out", "") + "/c";
  std::vector<std::vector<std::uint16_t>> got;
  for (const auto& f : {plain, gz, zst}) {
    const app::PrepSummary s = app::run_prep(parse({"--prep.input", f + "," + txt, "--prep.output",
                                                    out, "--prep.shard_tokens", "20000"}));
    CHECK(s.documents == 3001);
    CHECK(s.skipped_lines == 0);
    auto t = read_tokens(s.train_files);
    const auto v = read_tokens(s.val_files);
    t.insert(t.end(), v.begin(), v.end());
    got.push_back(t);
  }
  CHECK(got[0] == got[1]);
  CHECK(got[0] == got[2]);
  const std::string tail = "document 2999 \xC3\xA9" "A text file, compressed.\n";
  REQUIRE(got[0].size() > tail.size());
  CHECK(std::vector<std::uint16_t>(got[0].end() - static_cast<std::ptrdiff_t>(tail.size()),
                                   got[0].end()) == bytes(tail));
  // A truncated archive lost documents: an error naming it, and the earlier shards stay.
  const std::string z = io_test::gzip(corpus);
  io_test::write_file(gz, z.substr(0, z.size() / 2));
  const std::string w = config_error([&] {
    app::run_prep(parse({"--prep.input", gz, "--prep.output", out}));
  });
  INFO(w);
  CHECK(has(w, gz));
  CHECK(has(w, "truncated"));
  CHECK(std::filesystem::exists(out + "_train_000000.bin"));
  std::filesystem::remove_all(std::filesystem::path(out).parent_path());
  for (const auto& f : {plain, gz, zst, txt}) std::remove(f.c_str());
}

TEST_CASE("prep.doc_index records where each document starts", "[io][prep][jsonl]") {
  // Tiny Llama 3 tokenizer (tests/io/data/README.md): BOS 40 before and EOS 41 after each
  // document; "hello world" = 24 28, "(hello)" = 19 24 20, "hello" = 24.
  const std::string in = io_test::temp_name("jsonl_docs", ".jsonl");
  io_test::write_file(in,
                      "{\"text\": \"hello world\"}\n{\"text\": \"(hello)\"}\n{\"text\": \"hello\"}\n"
                      "{\"text\": \"hello world\"}\n");
  const std::string out = io_test::temp_name("jsonl_docs_out", "") + "/d";
  std::vector<std::string> args = {"--prep.input", in, "--prep.output", out, "--prep.tokenizer",
                                   "hf", "--prep.tokenizer_json",
                                   kData + "/tiny_llama3_tokenizer.json", "--prep.bos",
                                   "--prep.shard_tokens", "6", "--prep.val_fraction", "0.25",
                                   "--prep.doc_index"};
  const app::PrepSummary s = app::run_prep(parse(args));
  // 4 + 5 + 3 + 4 = 16 tokens, documents at 0, 4, 9, 12; val is the last 4 tokens, train
  // 0..11 in shards of 6.
  const std::vector<std::uint16_t> want = {40, 24, 28, 41, 40, 19, 24, 20,
                                           41, 40, 24, 41, 40, 24, 28, 41};
  auto all = read_tokens(s.train_files);
  const auto val = read_tokens(s.val_files);
  all.insert(all.end(), val.begin(), val.end());
  REQUIRE(all == want);
  REQUIRE(s.train_files.size() == 2);
  REQUIRE(s.doc_index_files.size() == 3);
  CHECK(s.doc_index_files[0] == out + "_train_000000.docs");
  CHECK(s.doc_index_files[2] == out + "_val_000000.docs");
  std::vector<std::vector<std::uint32_t>> starts;
  std::vector<std::size_t> sizes;
  for (const auto& f : s.doc_index_files) {
    const io::DocIndex d = io::read_doc_index(f);
    starts.push_back(d.starts);
    sizes.push_back(d.shard_tokens);
  }
  CHECK(sizes == std::vector<std::size_t>{6, 6, 4});
  CHECK(starts[0] == std::vector<std::uint32_t>{0, 4});  // documents at 0 and 4
  CHECK(starts[1] == std::vector<std::uint32_t>{3});     // 9 = 6 + 3; 6 is inside the second
  CHECK(starts[2] == std::vector<std::uint32_t>{0});     // val begins with the fourth
  // A damaged index is refused.
  io_test::write_file(s.doc_index_files[0] + "x", "short");
  CHECK(has(config_error([&] { io::read_doc_index(s.doc_index_files[0] + "x"); }), "header"));
  std::remove((s.doc_index_files[0] + "x").c_str());
  // A run without the index removes the earlier one, which would describe other shards.
  args.pop_back();
  const app::PrepSummary t = app::run_prep(parse(args));
  CHECK(t.doc_index_files.empty());
  CHECK_FALSE(std::filesystem::exists(out + "_train_000000.docs"));
  std::filesystem::remove_all(std::filesystem::path(out).parent_path());
  std::remove(in.c_str());
}
