// Corpus input: file kinds by name, mapped files, gzip and zstd streams (several members or
// frames, truncated and corrupt data), lines.
#include <cstdio>
#include <string>
#include <vector>

#include "compress_util.hpp"
#include "io_test_util.hpp"
#include "meshtrain/io/text_input.hpp"

using namespace meshtrain::io;
using io_test::config_error;
using io_test::has;

namespace {

std::string sample_text() {
  std::string t;
  for (int i = 0; i < 5000; ++i) t += "line " + std::to_string(i) + " \xC3\xA9t\xC3\xA9\r\n";
  t += std::string(300000, 'x');  // one long line, longer than the reader's buffer
  t += "\nlast line without a newline";
  return t;
}

std::vector<std::string> lines_of(const std::string& path, Compression c) {
  DecompressingReader r(path, c, "test");
  LineReader lr(r);
  std::vector<std::string> out;
  std::string_view l;
  while (lr.next(l)) out.emplace_back(l);
  return out;
}

std::vector<std::string> split_lines(const std::string& t) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < t.size()) {
    std::size_t nl = t.find('\n', pos);
    if (nl == std::string::npos) nl = t.size();
    out.push_back(t.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

}  // namespace

TEST_CASE("corpus file kinds follow the name", "[io][input]") {
  CHECK(compression_of("a.jsonl.gz") == Compression::gzip);
  CHECK(compression_of("a.jsonl.zst") == Compression::zstd);
  CHECK(compression_of("a.txt") == Compression::none);
  CHECK(is_json_lines_name("a.jsonl"));
  CHECK(is_json_lines_name("dolma/v1_7/cc_en_head-0000.json.gz"));
  CHECK(is_json_lines_name("x.ndjson.zst"));
  CHECK_FALSE(is_json_lines_name("kjv.txt"));
  CHECK_FALSE(is_json_lines_name("kjv.txt.gz"));
  CHECK_FALSE(is_json_lines_name("x.jsonl.bz2"));
}

TEST_CASE("gzip, zstd and plain files read back line by line", "[io][input]") {
  const std::string text = sample_text();
  const std::vector<std::string> want = split_lines(text);
  const std::string plain = io_test::temp_name("input_plain", ".txt");
  const std::string gz = io_test::temp_name("input", ".jsonl.gz");
  const std::string zst = io_test::temp_name("input", ".jsonl.zst");
  io_test::write_file(plain, text);
  // Two gzip members and two zstd frames, as concatenated files (pigz, pzstd) have.
  const std::string a = text.substr(0, 20000), b = text.substr(20000);
  io_test::write_file(gz, io_test::gzip(a) + io_test::gzip(b));
  io_test::write_file(zst, io_test::zstd(a) + io_test::zstd(b));
  CHECK(lines_of(plain, Compression::none) == want);
  CHECK(lines_of(gz, Compression::gzip) == want);
  CHECK(lines_of(zst, Compression::zstd) == want);
  {
    DecompressingReader r(zst, Compression::zstd, "test");
    CHECK(read_all(r) == text);
    CHECK(r.produced() == text.size());
    CHECK(r.consumed() == io_test::zstd(a).size() + io_test::zstd(b).size());
  }
  const MappedFile m(plain, "test");
  CHECK(m.text() == text);
  const std::string empty = io_test::temp_name("input_empty", ".txt");
  io_test::write_file(empty, "");
  CHECK(MappedFile(empty, "test").text().empty());
  CHECK(lines_of(empty, Compression::none).empty());
  for (const auto& f : {plain, gz, zst, empty}) std::remove(f.c_str());
}

TEST_CASE("truncated and corrupt compressed files are errors naming the file", "[io][input]") {
  const std::string text = sample_text();
  const std::string gz = io_test::temp_name("input_bad", ".jsonl.gz");
  const std::string zst = io_test::temp_name("input_bad", ".jsonl.zst");
  auto read = [](const std::string& path, Compression c) {
    return config_error([&] {
      DecompressingReader r(path, c, "prep.input");
      read_all(r);
    });
  };
  const std::string zg = io_test::gzip(text), zz = io_test::zstd(text);
  // Cut short: the stream ends inside its member / frame, whatever was decoded before.
  for (std::size_t cut : {std::size_t{10}, zg.size() / 2, zg.size() - 1}) {
    io_test::write_file(gz, zg.substr(0, zg.size() - cut));
    const std::string w = read(gz, Compression::gzip);
    INFO(w);
    CHECK(has(w, "prep.input: '" + gz + "' is not valid gzip data"));
    CHECK(has(w, "truncated"));
  }
  for (std::size_t cut : {std::size_t{1}, zz.size() / 2, zz.size() - 5}) {
    io_test::write_file(zst, zz.substr(0, zz.size() - cut));
    const std::string w = read(zst, Compression::zstd);
    INFO(w);
    CHECK(has(w, "prep.input: '" + zst + "' is not valid zstd data"));
    CHECK(has(w, "truncated"));
  }
  // Damaged in the middle: the decompressor's own message, and where.
  std::string bad = zg;
  for (std::size_t i = bad.size() / 3; i < bad.size() / 3 + 16; ++i) bad[i] = static_cast<char>(~bad[i]);
  io_test::write_file(gz, bad);
  CHECK(has(read(gz, Compression::gzip), "at byte"));
  bad = zz;
  for (std::size_t i = bad.size() / 3; i < bad.size() / 3 + 16; ++i) bad[i] = static_cast<char>(~bad[i]);
  io_test::write_file(zst, bad);
  CHECK(has(read(zst, Compression::zstd), "not valid zstd data"));
  // Not compressed at all, and empty.
  io_test::write_file(gz, "{\"text\": \"plain\"}\n");
  CHECK(has(read(gz, Compression::gzip), "not valid gzip data"));
  io_test::write_file(zst, "");
  CHECK(has(read(zst, Compression::zstd), "the file is empty"));
  CHECK(has(read("no_such_file.jsonl.gz", Compression::gzip), "cannot open 'no_such_file.jsonl.gz'"));
  std::remove(gz.c_str());
  std::remove(zst.c_str());
}
