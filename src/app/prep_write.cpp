// `meshtrain prep`: the shards. Every unit's tokens have a known place in the output once the
// units' token counts are all-gathered, so rank 0 creates each shard file at its final size and
// every rank writes its own tokens into them (pwrite at disjoint offsets); nothing funnels
// through one rank but the document index. The files are written as <name>.new and renamed over
// the earlier ones only when all are complete (issue 17).
#include <glob.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "prep_internal.hpp"

namespace meshtrain::app::prep {

namespace fs = std::filesystem;

namespace {

constexpr const char* kNewSuffix = ".new";
constexpr std::size_t kFirstSkippedShown = 10;

std::string shard_name(const std::string& prefix, const char* split, std::size_t i) {
  char num[16];
  std::snprintf(num, sizeof num, "%06zu", i);
  return cat(prefix, "_", split, "_", num, ".bin");
}

// The files of a split that exist now (an earlier run's), by extension (".bin", ".docs").
std::vector<std::string> existing(const std::string& prefix, const std::string& split,
                                  const char* ext) {
  std::vector<std::string> out;
  glob_t g{};
  const std::string pat = cat(prefix, "_", split, "_[0-9][0-9][0-9][0-9][0-9][0-9]", ext);
  if (::glob(pat.c_str(), 0, nullptr, &g) == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return out;
}

struct Shard {
  std::string path;
  std::string split;
  std::uint64_t begin = 0, end = 0;  // tokens of the whole output
};

// A split's shards over tokens [begin, end): at least one file, even for an empty split, so
// the name a configuration gives always exists.
void plan_split(std::vector<Shard>& out, const std::string& prefix, const char* split,
                std::uint64_t begin, std::uint64_t end, std::uint64_t per_shard) {
  std::size_t i = 0;
  std::uint64_t at = begin;
  do {
    const std::uint64_t stop = std::min(end, at + per_shard);
    out.push_back({shard_name(prefix, split, i++), split, at, stop});
    at = stop;
  } while (at < end);
}

// Every rank's string, concatenated in rank order on rank 0.
std::string gather_text(MPI_Comm comm, const std::string& mine) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int n = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<std::size_t>(size)), displs(counts.size());
  MESHTRAIN_MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm));
  std::string all;
  if (rank == 0) {
    long long total = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      displs[r] = static_cast<int>(total);
      total += counts[r];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  MESHTRAIN_MPI_CHECK(MPI_Gatherv(mine.data(), n, MPI_CHAR, all.data(), counts.data(),
                                  displs.data(), MPI_CHAR, 0, comm));
  return all;
}

// Rank 0: the skipped lines of every unit, "file:line: reason", in file order.
std::vector<std::string> skipped_lines(MPI_Comm comm, const std::vector<InputFile>& files,
                                       const std::vector<Unit>& units,
                                       const std::vector<UnitSummary>& summary,
                                       const std::vector<std::size_t>& mine,
                                       const std::vector<UnitOutput>& outputs) {
  std::string text;
  for (std::size_t i = 0; i < mine.size(); ++i)
    for (const SkippedLine& l : outputs[i].skipped)
      text += cat(mine[i], '\t', l.line, '\t', l.detail, '\n');
  const std::string all = gather_text(comm, text);
  struct Entry {
    std::size_t unit;
    std::uint64_t line;
    std::string detail;
  };
  std::vector<Entry> entries;
  std::istringstream in(all);
  for (std::string row; std::getline(in, row);) {
    const std::size_t a = row.find('\t'), b = row.find('\t', a + 1);
    entries.push_back({std::stoull(row.substr(0, a)), std::stoull(row.substr(a + 1, b - a - 1)),
                       row.substr(b + 1)});
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& x, const Entry& y) {
    return x.unit != y.unit ? x.unit < y.unit : x.line < y.line;
  });
  std::vector<std::string> out;
  for (const Entry& e : entries)
    out.push_back(cat(line_location(files, units, summary, e.unit, e.line), ": ", e.detail));
  return out;
}

// Rank 0: every document start (global token offsets), sorted.
std::vector<std::uint64_t> gather_doc_starts(MPI_Comm comm, const std::vector<std::size_t>& mine,
                                             const std::vector<UnitOutput>& outputs,
                                             const std::vector<std::uint64_t>& offset) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::vector<std::uint64_t> starts;
  for (std::size_t i = 0; i < mine.size(); ++i)
    for (std::uint64_t d : outputs[i].doc_starts) starts.push_back(offset[mine[i]] + d);
  const int n = static_cast<int>(starts.size());
  std::vector<int> counts(static_cast<std::size_t>(size)), displs(counts.size());
  MESHTRAIN_MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm));
  std::vector<std::uint64_t> all;
  long long total = 0;
  if (rank == 0) {
    for (std::size_t r = 0; r < counts.size(); ++r) {
      displs[r] = static_cast<int>(std::min<long long>(total, INT_MAX));
      total += counts[r];
    }
  }
  // MPI counts are int: one run indexes at most 2^31 - 1 documents (split larger corpora).
  MESHTRAIN_MPI_CHECK(MPI_Bcast(&total, 1, MPI_LONG_LONG, 0, comm));
  if (total > INT_MAX)
    throw Agreed<ConfigError>(cat("prep.doc_index: ", total, " documents are more than one run "
                                  "can index (2^31 - 1); prepare the corpus in parts"));
  if (rank == 0) all.resize(static_cast<std::size_t>(total));
  MESHTRAIN_MPI_CHECK(MPI_Gatherv(starts.data(), n, MPI_UINT64_T, all.data(), counts.data(),
                                  displs.data(), MPI_UINT64_T, 0, comm));
  std::sort(all.begin(), all.end());
  return all;
}

// Rank 0: the new files replace the earlier ones (a rename each); earlier shards and indexes
// that this run did not write (a re-run with larger shards writes fewer files, or no index)
// are removed, or a training glob would pick them up.
void commit(const std::vector<Shard>& shards, const std::vector<std::string>& indexes,
            const std::string& prefix) {
  std::vector<std::string> written;
  for (const auto& s : shards) written.push_back(s.path);
  written.insert(written.end(), indexes.begin(), indexes.end());
  for (const auto& f : written) {
    std::error_code ec;
    fs::rename(f + kNewSuffix, f, ec);
    if (ec)
      throw ConfigError(cat("prep.output: cannot rename '", f, kNewSuffix, "' to '", f, "': ",
                            ec.message()));
  }
  for (const char* split : {"train", "val"})
    for (const char* ext : {".bin", ".docs"})
      for (const auto& old : existing(prefix, split, ext))
        if (std::find(written.begin(), written.end(), old) == written.end()) {
          logging::info("prep: removing the earlier ", ext, " file ", old);
          std::remove(old.c_str());
        }
}

}  // namespace

void write_outputs(const PrepConfig& c, MPI_Comm comm, const std::vector<InputFile>& files,
                   const std::vector<Unit>& units, const std::vector<UnitSummary>& summary,
                   const std::vector<std::size_t>& mine, std::vector<UnitOutput>& outputs,
                   PrepSummary& s) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::vector<std::uint64_t> offset(units.size() + 1, 0);
  for (std::size_t u = 0; u < units.size(); ++u) offset[u + 1] = offset[u] + summary[u].tokens;
  const std::uint64_t n = offset.back();
  const auto n_val = static_cast<std::uint64_t>(std::llround(static_cast<double>(n) * c.val_fraction));
  const std::uint64_t n_train = n - n_val;
  // Every rank reaches the same verdict from the same counts.
  if (n_train == 0)
    throw Agreed<ConfigError>(cat("prep.val_fraction=", c.val_fraction, " leaves none of the ", n,
                                  " tokens for training"));
  const auto per = static_cast<std::uint64_t>(c.shard_tokens);
  std::vector<Shard> shards;
  plan_split(shards, c.output, "train", 0, n_train, per);
  if (c.val_fraction > 0) plan_split(shards, c.output, "val", n_train, n, per);

  // Collective, before anything is written: the report of skipped lines.
  const std::vector<std::string> skipped = skipped_lines(comm, files, units, summary, mine, outputs);
  std::vector<std::string> indexes;
  std::vector<std::string> created;  // rank 0: the .new files of this run, removed on failure
  try {
    agree_on_root(comm, "", [&] {
      const fs::path parent = fs::path(c.output).parent_path();
      if (!parent.empty()) {
        std::error_code ec;
        fs::create_directories(parent, ec);
        if (ec)
          throw ConfigError(cat("prep.output: cannot create the directory '", parent.string(),
                                "': ", ec.message()));
      }
      for (const Shard& sh : shards) {
        created.push_back(sh.path + kNewSuffix);
        io::create_shard_file(created.back(), sh.end - sh.begin);
      }
    });
    agree(comm, "", [&] {
      for (std::size_t i = 0; i < mine.size(); ++i) {
        const std::uint64_t lo = offset[mine[i]], hi = offset[mine[i] + 1];
        for (const Shard& sh : shards) {
          const std::uint64_t a = std::max(lo, sh.begin), b = std::min(hi, sh.end);
          if (a < b)
            io::write_shard_tokens(sh.path + kNewSuffix, a - sh.begin,
                                   outputs[i].tokens.data() + (a - lo), b - a);
        }
        std::vector<std::uint16_t>().swap(outputs[i].tokens);  // written: free it
      }
    });
    if (c.doc_index) {
      const std::vector<std::uint64_t> starts = gather_doc_starts(comm, mine, outputs, offset);
      for (const Shard& sh : shards) indexes.push_back(io::doc_index_path(sh.path));
      agree_on_root(comm, "", [&] {
        auto it = starts.begin();
        for (std::size_t k = 0; k < shards.size(); ++k) {
          io::DocIndex d;
          d.shard_tokens = shards[k].end - shards[k].begin;
          for (; it != starts.end() && *it < shards[k].end; ++it)
            d.starts.push_back(static_cast<std::uint32_t>(*it - shards[k].begin));
          created.push_back(indexes[k] + kNewSuffix);
          io::write_doc_index(created.back(), d);
        }
      });
    }
    agree_on_root(comm, "", [&] {
      commit(shards, indexes, c.output);
      created.clear();
      // The list of skipped lines, or no stale list from an earlier run.
      const std::string report = c.output + "_skipped_lines.txt";
      std::remove(report.c_str());
      if (!skipped.empty()) {
        std::ofstream f(report, std::ios::trunc);
        for (const auto& l : skipped) f << l << '\n';
        if (!f) throw ConfigError(cat("prep.output: cannot write '", report, "'"));
      }
    });
  } catch (...) {
    for (const auto& f : created) std::remove(f.c_str());  // the earlier data stays as it was
    throw;
  }
  for (const Shard& sh : shards) (sh.split == "train" ? s.train_files : s.val_files).push_back(sh.path);
  s.doc_index_files = indexes;
  s.train_tokens = n_train;
  s.val_tokens = c.val_fraction > 0 ? n_val : 0;
  if (s.skipped_lines > 0) s.skipped_report = c.output + "_skipped_lines.txt";
  for (std::size_t i = 0; i < skipped.size() && i < kFirstSkippedShown; ++i)
    s.first_skipped.push_back(skipped[i]);
}

}  // namespace meshtrain::app::prep
