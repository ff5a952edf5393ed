// `meshtrain prep` over 1, 2 and 4 ranks (sub-communicators of the test's world) writes the same
// bytes: shards, document indexes and the skipped-lines list; prep.strict names the same first
// bad line whichever rank found it. Inputs: JSON lines (plain, cut into many small units, gzip,
// zstd) with malformed lines, and text with and without document starts.
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "compress_util.hpp"
#include "io_test_util.hpp"
#include "meshtrain/app/prep.hpp"
#include "meshtrain/io/token_shard.hpp"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

const std::string kDir = "io_prep_parallel";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string jsonl(int first, int n, int bad_every) {
  std::string s;
  for (int i = first; i < first + n; ++i) {
    if (bad_every > 0 && i % bad_every == 0) {
      s += i % 2 ? "{\"text\": \"unterminated}\n" : "{\"title\": \"no text\"}\n";
      continue;
    }
    s += "{\"id\": " + std::to_string(i) + ", \"text\": \"doc " + std::to_string(i) +
         std::string(static_cast<std::size_t>(i % 37), 'x') + " \\u00e9\\n\", \"n\": [1, 2]}\n";
  }
  return s;
}

std::vector<std::string> write_inputs() {
  const std::vector<std::string> files = {kDir + "/a.jsonl", kDir + "/b.jsonl.gz",
                                          kDir + "/c.txt", kDir + "/d.jsonl.zst",
                                          kDir + "/e.txt"};
  if (mt_test::world_rank() == 0) {
    fs::remove_all(kDir);
    fs::create_directories(kDir);
    io_test::write_file(files[0], jsonl(0, 1500, 97));
    io_test::write_file(files[1], io_test::gzip(jsonl(1500, 700, 0)));
    std::string text;
    for (int i = 0; i < 300; ++i)
      text += (i % 25 == 0 ? "Chapter " + std::to_string(i / 25) + "\n" : "") + "verse " +
              std::to_string(i) + " text\n";
    io_test::write_file(files[2], text);
    io_test::write_file(files[3], io_test::zstd(jsonl(2200, 900, 301)));
    io_test::write_file(files[4], "a whole file is one document\n");
  }
  MPI_Barrier(mt_test::world());
  return files;
}

app::PrepConfig prep_config(const std::vector<std::string>& inputs, const std::string& out) {
  std::string list;
  for (const auto& f : inputs) list += (list.empty() ? "" : ",") + f;
  app::PrepConfig c = app::prep_config(
      config::parse({"--prep.input", list, "--prep.output", out, "--prep.shard_tokens", "7000",
                     "--prep.doc_index", "--prep.document_start", "^Chapter",
                     "--prep.progress_every", "0.001"},
                    app::prep_options())
          .vm);
  c.chunk_bytes = 1000;  // many units: lines and documents cut across unit ends
  return c;
}

// Runs `f(sub)` on the first k ranks of the world (a communicator of their own).
template <class F>
void on_first(int k, F&& f) {
  MPI_Comm sub;
  MPI_Comm_split(mt_test::world(), mt_test::world_rank() < k ? 0 : MPI_UNDEFINED,
                 mt_test::world_rank(), &sub);
  if (sub != MPI_COMM_NULL) {
    f(sub);
    MPI_Comm_free(&sub);
  }
  MPI_Barrier(mt_test::world());
}

std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("prep writes the same bytes on 1, 2 and 4 ranks", "[io][prep][mpi]") {
  const std::vector<std::string> inputs = write_inputs();
  std::vector<int> counts;
  for (int k : {1, 2, 4})
    if (k <= mt_test::world_size()) counts.push_back(k);
  std::vector<app::PrepSummary> summaries;
  for (int k : counts) {
    app::PrepSummary s;
    on_first(k, [&](MPI_Comm sub) { s = app::run_prep(prep_config(inputs, cat(kDir, "/out", k, "/c")), sub); });
    // The same summary on every rank that ran it.
    if (mt_test::world_rank() == 0) summaries.push_back(s);
  }
  if (mt_test::world_rank() == 0) {
    const app::PrepSummary& one = summaries[0];
    CHECK(one.units > 20);
    CHECK(one.documents == 1500 - 16 + 700 + 900 - 3 + 12 + 1);
    CHECK(one.skipped_lines == 16 + 3);
    CHECK(one.train_files.size() > 4);
    const std::vector<std::string> names = files_of(kDir + "/out1");
    CHECK(std::find(names.begin(), names.end(), "c_skipped_lines.txt") != names.end());
    CHECK(std::find(names.begin(), names.end(), "c_train_000000.docs") != names.end());
    // The index's starts are the documents' first tokens: each JSON document starts "doc ".
    const io::DocIndex d = io::read_doc_index(kDir + "/out1/c_train_000000.docs");
    const io::TokenShard shard(kDir + "/out1/c_train_000000.bin");
    REQUIRE(!d.starts.empty());
    for (std::uint32_t at : d.starts) CHECK(std::string(shard.data() + at, shard.data() + at + 4) == "doc ");
    for (std::size_t i = 1; i < counts.size(); ++i) {
      INFO(counts[i] << " ranks");
      CHECK(summaries[i].ranks == counts[i]);
      CHECK(summaries[i].documents == one.documents);
      CHECK(summaries[i].train_tokens == one.train_tokens);
      const std::string other = cat(kDir, "/out", counts[i]);
      REQUIRE(files_of(other) == names);
      for (const auto& n : names) {
        INFO(n);
        CHECK(slurp(other + "/" + n) == slurp(kDir + "/out1/" + n));
      }
    }
  }
  MPI_Barrier(mt_test::world());
}

TEST_CASE("prep.strict names the first bad line on any rank count", "[io][prep][mpi]") {
  const std::vector<std::string> inputs = write_inputs();
  for (int k : {1, 2, 4}) {
    if (k > mt_test::world_size()) continue;
    on_first(k, [&](MPI_Comm sub) {
      app::PrepConfig c = prep_config(inputs, cat(kDir, "/strict", k, "/c"));
      c.strict = true;
      const std::string w = io_test::config_error([&] { app::run_prep(c, sub); });
      INFO(k << " ranks: " << w);
      // Line 1 of a.jsonl (id 0) is the first bad one; the later units' ranks found others.
      CHECK(io_test::has(w, "prep.strict: " + kDir + "/a.jsonl:1: no field \"text\""));
    });
  }
  if (mt_test::world_rank() == 0) fs::remove_all(kDir);
  MPI_Barrier(mt_test::world());
}
