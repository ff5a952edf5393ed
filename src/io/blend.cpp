// Blends of token datasets: the schedule (which source each global sequence comes from) and the
// dataset that reads each source in its own order.
#include "meshtrain/io/blend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "meshtrain/core/error.hpp"

namespace meshtrain::io {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<BlendSourceSpec> parse_blend(const std::string& text, const std::string& option) {
  std::vector<std::string> items;
  std::string cur;
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == ',') {
      if (!cur.empty()) items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) items.push_back(cur);
  const std::string form = " (expected weight-pattern pairs, e.g. \"0.7 data/web 0.3 data/code\")";
  if (items.empty()) throw ConfigError(cat(option, " is empty", form));
  if (items.size() % 2 != 0)
    throw ConfigError(cat(option, "='", text, "': ", items.size(), " items, not pairs", form));
  std::vector<BlendSourceSpec> out;
  double total = 0;
  for (std::size_t i = 0; i < items.size(); i += 2) {
    char* end = nullptr;
    const double w = std::strtod(items[i].c_str(), &end);
    if (end != items[i].c_str() + items[i].size() || !std::isfinite(w) || w <= 0)
      throw ConfigError(cat(option, ": the weight '", items[i], "' of '", items[i + 1],
                            "' is not a positive number", form));
    BlendSourceSpec s;
    s.name = items[i + 1];
    s.weight = w;
    for (const auto& o : out)
      if (o.name == s.name) throw ConfigError(cat(option, ": '", s.name, "' is given twice"));
    if (ends_with(s.name, ".bin")) {
      s.train = s.name;
      const std::size_t at = s.name.rfind("_train_");
      if (at != std::string::npos) s.val = s.name.substr(0, at) + "_val_" + s.name.substr(at + 7);
    } else {
      s.train = s.name + "_train_*.bin";
      s.val = s.name + "_val_*.bin";
    }
    total += w;
    out.push_back(s);
  }
  for (auto& s : out) s.weight /= total;
  return out;
}

// ---- BlendSchedule ----

BlendSchedule::BlendSchedule(const std::vector<double>& weights) {
  const std::size_t n = weights.size();
  // At most 256: building the table costs period x sources steps.
  MESHTRAIN_CONFIG_CHECK(n > 0 && n <= 256, "a blend needs 1 to 256 sources, not ", n);
  double total = 0;
  for (double w : weights) {
    MESHTRAIN_CONFIG_CHECK(std::isfinite(w) && w > 0, "blend weight ", w, " is not positive");
    total += w;
  }
  // Places per period by largest remainder; every source keeps at least one.
  per_period_.assign(n, 0);
  std::vector<double> rest(n);
  std::uint64_t given = 0;
  for (std::size_t s = 0; s < n; ++s) {
    const double exact = weights[s] / total * kBlendPeriod;
    per_period_[s] = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(std::floor(exact)));
    rest[s] = exact - std::floor(exact);
    given += per_period_[s];
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return rest[a] > rest[b]; });
  for (std::size_t k = 0; given < kBlendPeriod; k = (k + 1) % n, ++given) ++per_period_[order[k]];
  while (given > kBlendPeriod) {  // the minimum of one place pushed the sum over
    const auto big = static_cast<std::size_t>(
        std::max_element(per_period_.begin(), per_period_.end()) - per_period_.begin());
    --per_period_[big];
    --given;
  }
  // Largest deficit first: place p goes to the source s with the largest
  // (p + 1) * per_period[s] - period * taken[s], the lowest index on ties. Integer arithmetic,
  // so every machine builds the same table.
  table_.resize(kBlendPeriod);
  places_.assign(n, {});
  std::vector<std::int64_t> taken(n, 0);
  for (std::uint32_t p = 0; p < kBlendPeriod; ++p) {
    std::size_t best = 0;
    std::int64_t best_deficit = INT64_MIN;
    for (std::size_t s = 0; s < n; ++s) {
      const std::int64_t d = static_cast<std::int64_t>(p + 1) * per_period_[s] -
                             static_cast<std::int64_t>(kBlendPeriod) * taken[s];
      if (d > best_deficit) {
        best_deficit = d;
        best = s;
      }
    }
    table_[p] = static_cast<std::uint16_t>(best);
    places_[best].push_back(p);
    ++taken[best];
  }
}

std::uint64_t BlendSchedule::count_before(int s, std::uint64_t g) const {
  const auto& pl = places_[static_cast<std::size_t>(s)];
  const auto rem = static_cast<std::uint32_t>(g % kBlendPeriod);
  return (g / kBlendPeriod) * per_period_[static_cast<std::size_t>(s)] +
         static_cast<std::uint64_t>(std::lower_bound(pl.begin(), pl.end(), rem) - pl.begin());
}

// ---- BlendedDataset ----

namespace {

std::vector<double> weights_of(const std::vector<DataSource>& sources) {
  std::vector<double> w;
  for (const auto& s : sources) w.push_back(s.weight);
  return w;
}

}  // namespace

BlendedDataset::BlendedDataset(std::vector<DataSource> sources, bool blend)
    : sources_(std::move(sources)), blend_(blend), schedule_(weights_of(sources_)) {
  MESHTRAIN_CHECK(blend_ || sources_.size() == 1, "BlendedDataset: ", sources_.size(),
                  " sources without a blend");
  for (const auto& s : sources_) {
    MESHTRAIN_CHECK(s.train, "BlendedDataset: source '", s.name, "' has no training data");
    MESHTRAIN_CONFIG_CHECK(s.train->seq_len() == sources_.front().train->seq_len(),
                           "data source '", s.name, "' is cut into windows of ",
                           s.train->seq_len(), " tokens, not ", sources_.front().train->seq_len());
  }
  base_.assign(sources_.size(), 0);
}

std::uint64_t BlendedDataset::num_windows() const {
  std::uint64_t n = 0;
  for (const auto& s : sources_) n += s.train->num_windows();
  return n;
}

std::uint64_t BlendedDataset::index_in_source(int s, std::uint64_t g) const {
  return base_[static_cast<std::size_t>(s)] + schedule_.count_before(s, g) -
         schedule_.count_before(s, start_);
}

void BlendedDataset::fill(std::uint64_t seed, std::int64_t batch, int global_batch, int first,
                          int count, std::int32_t* inputs, std::int32_t* targets) const {
  MESHTRAIN_CHECK(batch >= 0 && global_batch > 0 && first >= 0 && count >= 0 &&
                      first + count <= global_batch,
                  "BlendedDataset::fill: slice [", first, ", ", first + count,
                  ") of a global batch of ", global_batch, " at batch ", batch);
  const std::uint64_t base = static_cast<std::uint64_t>(batch) * static_cast<std::uint64_t>(global_batch) +
                             static_cast<std::uint64_t>(first);
  MESHTRAIN_CHECK(base >= start_, "BlendedDataset::fill: sequence ", base,
                  " is before the resumed position ", start_);
  const std::size_t T = static_cast<std::size_t>(seq_len());
  for (int k = 0; k < count; ++k) {
    const std::uint64_t g = base + static_cast<std::uint64_t>(k);
    const int s = schedule_.source_of(g);
    sources_[static_cast<std::size_t>(s)].train->fill_sequence(
        seed, index_in_source(s, g), inputs + k * T, targets + k * T);
  }
}

std::vector<std::uint64_t> BlendedDataset::drawn(std::int64_t batch, int global_batch) const {
  const std::uint64_t g = static_cast<std::uint64_t>(batch) * static_cast<std::uint64_t>(global_batch);
  std::vector<std::uint64_t> out(sources_.size());
  for (int s = 0; s < schedule_.sources(); ++s)
    out[static_cast<std::size_t>(s)] = g >= start_ ? index_in_source(s, g) : 0;
  return out;
}

void BlendedDataset::resume(std::int64_t batch, int global_batch,
                            const std::vector<std::uint64_t>& drawn) {
  MESHTRAIN_CHECK(drawn.size() == sources_.size() && batch >= 0,
                  "BlendedDataset::resume: ", drawn.size(), " counts for ", sources_.size(),
                  " sources");
  start_ = static_cast<std::uint64_t>(batch) * static_cast<std::uint64_t>(global_batch);
  base_ = drawn;
}

}  // namespace meshtrain::io
