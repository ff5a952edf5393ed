// `meshtrain prep`: the inputs cut into units and dealt out to ranks. Every rank computes the
// same plan from the file sizes alone (no reads), so no rank waits for another to plan.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "meshtrain/core/error.hpp"
#include "prep_internal.hpp"

namespace meshtrain::app::prep {

std::vector<InputFile> stat_inputs(const std::vector<std::string>& paths) {
  std::vector<InputFile> files;
  for (const auto& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0)
      throw ConfigError(cat("prep.input: cannot open '", p, "': ", std::strerror(errno)));
    if (!S_ISREG(st.st_mode))
      throw ConfigError(cat("prep.input: '", p, "' is not a regular file"));
    InputFile f;
    f.path = p;
    f.bytes = static_cast<std::uint64_t>(st.st_size);
    f.compression = io::compression_of(p);
    f.json_lines = io::is_json_lines_name(p);
    files.push_back(f);
  }
  return files;
}

std::vector<Unit> plan_units(const std::vector<InputFile>& files, bool split_text, int ranks,
                             std::uint64_t chunk_bytes) {
  // Compressed text costs more per stored byte; 4x is a typical ratio for text under gzip and
  // zstd, close enough to balance ranks (the output does not depend on it).
  auto cost_of = [](const InputFile& f) {
    return static_cast<double>(f.bytes) * (f.compression == io::Compression::none ? 1.0 : 4.0);
  };
  double total = 0;
  for (const auto& f : files) total += cost_of(f);
  if (chunk_bytes == 0) {
    // About 8 units per rank, so a few large files still spread evenly.
    const double per = total / (8.0 * std::max(ranks, 1));
    chunk_bytes = static_cast<std::uint64_t>(std::clamp(per, 1.0 * (1 << 20), 256.0 * (1 << 20)));
  }
  std::vector<Unit> units;
  for (std::uint32_t i = 0; i < files.size(); ++i) {
    const InputFile& f = files[i];
    const bool splittable =
        f.compression == io::Compression::none && (f.json_lines || split_text);
    const std::uint64_t n =
        splittable && f.bytes > chunk_bytes ? (f.bytes + chunk_bytes - 1) / chunk_bytes : 1;
    for (std::uint64_t k = 0; k < n; ++k) {
      Unit u;
      u.file = i;
      u.begin = f.bytes * k / n;
      u.end = f.bytes * (k + 1) / n;
      u.cost = cost_of(f) / static_cast<double>(n);
      units.push_back(u);
    }
  }
  // Longest processing time first: each unit, largest first, to the least loaded rank (ties
  // to the lower index and rank, so every rank computes the same plan).
  std::vector<std::size_t> order(units.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return units[a].cost > units[b].cost; });
  std::vector<double> load(static_cast<std::size_t>(std::max(ranks, 1)), 0.0);
  for (std::size_t u : order) {
    const auto r = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    units[u].rank = static_cast<int>(r);
    // At least a byte's worth, so empty files still rotate over the ranks.
    load[r] += std::max(units[u].cost, 1.0);
  }
  return units;
}

std::string line_location(const std::vector<InputFile>& files, const std::vector<Unit>& units,
                          const std::vector<UnitSummary>& summary, std::size_t unit,
                          std::uint64_t line) {
  std::uint64_t before = 0;
  for (std::size_t v = unit; v-- > 0 && units[v].file == units[unit].file;) before += summary[v].lines;
  return cat(files[units[unit].file].path, ":", before + line + 1);
}

}  // namespace meshtrain::app::prep
