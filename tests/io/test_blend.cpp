// Blends (data.blend): parsing, the schedule's proportions over any 10,000 sequences, each
// source read in its own order, any slicing of a batch (data-parallel ranks, micro-batches in
// either order) reading the same sequences, and a resume under another blend.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io_test_util.hpp"
#include "meshtrain/io/blend.hpp"
#include "meshtrain/io/token_shard.hpp"

using namespace meshtrain;
using namespace meshtrain::io;
using io_test::config_error;
using io_test::has;

TEST_CASE("data.blend is weight-pattern pairs", "[io][blend]") {
  const auto b = parse_blend("0.7 data/web 0.2 code_*  0.1,data/books_train_*.bin", "data.blend");
  REQUIRE(b.size() == 3);
  CHECK(b[0].name == "data/web");
  CHECK(b[0].train == "data/web_train_*.bin");
  CHECK(b[0].val == "data/web_val_*.bin");
  CHECK(b[1].train == "code_*_train_*.bin");
  CHECK(b[2].train == "data/books_train_*.bin");
  CHECK(b[2].val == "data/books_val_*.bin");
  CHECK(parse_blend("1 x/shard_000.bin", "o")[0].val.empty());
  CHECK(b[0].weight == mt_test::Approx(0.7));
  const auto n = parse_blend("3 a 1 b", "data.blend");
  CHECK(n[0].weight == 0.75);
  CHECK(n[1].weight == 0.25);
  CHECK(has(config_error([] { parse_blend("", "data.blend"); }), "data.blend is empty"));
  CHECK(has(config_error([] { parse_blend("0.5 a 0.5", "data.blend"); }), "not pairs"));
  CHECK(has(config_error([] { parse_blend("a 0.5 b 0.5", "data.blend"); }),
            "the weight 'a' of '0.5' is not a positive number"));
  CHECK(has(config_error([] { parse_blend("0 a 1 b", "data.blend"); }), "not a positive number"));
  CHECK(has(config_error([] { parse_blend("1 a 1 a", "data.blend"); }), "'a' is given twice"));
}

TEST_CASE("a blend's proportions hold within 1 % over any 10,000 sequences", "[io][blend]") {
  const std::vector<double> w = {0.7, 0.2, 0.1};
  const BlendSchedule sch(w);
  CHECK(sch.per_period(0) + sch.per_period(1) + sch.per_period(2) == kBlendPeriod);
  for (std::uint64_t start : {std::uint64_t{0}, std::uint64_t{12345},
                              std::uint64_t{kBlendPeriod - 5000}, std::uint64_t{1000000007}}) {
    std::vector<int> n(3, 0);
    for (std::uint64_t g = start; g < start + 10000; ++g) ++n[static_cast<std::size_t>(sch.source_of(g))];
    for (int s = 0; s < 3; ++s) {
      INFO("from " << start << ", source " << s << ": " << n[static_cast<std::size_t>(s)]);
      const double share = n[static_cast<std::size_t>(s)] / 10000.0;
      CHECK(std::fabs(share - w[static_cast<std::size_t>(s)]) <= 0.01 * w[static_cast<std::size_t>(s)]);
      CHECK(std::abs(n[static_cast<std::size_t>(s)] - 10000 * w[static_cast<std::size_t>(s)]) <= 2.0);
    }
  }
  // count_before is the running count of source_of, across period ends.
  std::vector<std::uint64_t> c(3, 0);
  for (std::uint64_t g = 0; g <= 3 * std::uint64_t{kBlendPeriod}; ++g) {
    if (g % 997 == 0 || g % kBlendPeriod < 3 || g % kBlendPeriod > kBlendPeriod - 3)
      for (int s = 0; s < 3; ++s) REQUIRE(sch.count_before(s, g) == c[static_cast<std::size_t>(s)]);
    ++c[static_cast<std::size_t>(sch.source_of(g))];
  }
  // A weight too small for one place in a period still gets one.
  const BlendSchedule tiny({1.0, 1e-9});
  CHECK(tiny.per_period(1) == 1);
  CHECK(tiny.per_period(0) == kBlendPeriod - 1);
  CHECK(BlendSchedule({2.0}).count_before(0, 12345) == 12345);
  CHECK(has(config_error([] { BlendSchedule(std::vector<double>(300, 1.0)); }), "1 to 256 sources"));
}

namespace {

constexpr int kSeq = 4;

// Source s: `windows` windows of kSeq + 1 tokens, every token of window k = 1000 s + k, so a
// sequence names its source and window.
std::unique_ptr<TokenDataset> source(const std::string& dir, int s, int windows) {
  std::vector<std::uint16_t> t;
  for (int k = 0; k < windows; ++k)
    for (int j = 0; j <= kSeq; ++j) t.push_back(static_cast<std::uint16_t>(1000 * s + k));
  const std::string path = dir + "/src" + std::to_string(s) + "_000000.bin";
  write_shard(path, t);
  return std::make_unique<TokenDataset>(path, kSeq);
}

struct Synthetic {
  std::string dir = io_test::temp_name("blend", "");
  std::vector<std::unique_ptr<TokenDataset>> data;
  Synthetic() {
    std::filesystem::create_directories(dir);
    const int windows[] = {50, 30, 7};
    for (int s = 0; s < 3; ++s) data.push_back(source(dir, s, windows[s]));
  }
  ~Synthetic() { std::filesystem::remove_all(dir); }
  BlendedDataset blend(std::vector<double> w) const {
    std::vector<DataSource> src;
    for (std::size_t s = 0; s < data.size(); ++s)
      src.push_back({"s" + std::to_string(s), w[s], data[s].get(), nullptr});
    return BlendedDataset(src, true);
  }
};

// (source, window) of each sequence of batch b, read as `slices` (first, count) pieces.
std::vector<int> read(const BlendedDataset& d, std::int64_t b, int global,
                      const std::vector<std::pair<int, int>>& slices) {
  std::vector<int> out(static_cast<std::size_t>(global), -1);
  for (auto [first, count] : slices) {
    std::vector<std::int32_t> in(static_cast<std::size_t>(count * kSeq)), tg(in.size());
    d.fill(7, b, global, first, count, in.data(), tg.data());
    for (int k = 0; k < count; ++k) out[static_cast<std::size_t>(first + k)] = in[static_cast<std::size_t>(k * kSeq)];
  }
  return out;
}

}  // namespace

TEST_CASE("each source is read in its own order, whatever slices a batch", "[io][blend]") {
  const Synthetic syn;
  const BlendedDataset d = syn.blend({0.7, 0.2, 0.1});
  constexpr int kGlobal = 40, kBatches = 250;  // 10,000 sequences
  std::vector<std::vector<int>> seen(3);  // windows of each source, in the order drawn
  for (std::int64_t b = 0; b < kBatches; ++b) {
    const std::vector<int> whole = read(d, b, kGlobal, {{0, kGlobal}});
    // dp ranks x micro-batches of 5 in both orders of the engine: rank r micro m at
    // (r M + m) B, and at (m dp + r) B; and uneven pieces.
    for (int dp : {2, 4}) {
      const int micro = 5, M = kGlobal / (dp * micro);
      std::vector<std::pair<int, int>> a, c;
      for (int r = 0; r < dp; ++r)
        for (int m = 0; m < M; ++m) {
          a.push_back({(r * M + m) * micro, micro});
          c.push_back({(m * dp + r) * micro, micro});
        }
      REQUIRE(read(d, b, kGlobal, a) == whole);
      REQUIRE(read(d, b, kGlobal, c) == whole);
    }
    REQUIRE(read(d, b, kGlobal, {{0, 3}, {3, 30}, {33, 7}}) == whole);
    for (int v : whole) seen[static_cast<std::size_t>(v / 1000)].push_back(v % 1000);
    // drawn(b + 1) counts every source's sequences of batches 0..b.
    const auto drawn = d.drawn(b + 1, kGlobal);
    for (std::size_t s = 0; s < 3; ++s) REQUIRE(drawn[s] == seen[s].size());
  }
  const double want[] = {0.7, 0.2, 0.1};
  for (std::size_t s = 0; s < 3; ++s) {
    INFO("source " << s << ": " << seen[s].size() << " of 10000");
    CHECK(std::fabs(seen[s].size() / 10000.0 - want[s]) <= 0.01 * want[s]);
    // Sequence k of a source is its own k-th (TokenDataset's order): epochs of every window.
    const TokenDataset& src = *syn.data[s];
    const std::size_t n = src.num_windows();
    for (std::size_t k = 0; k < seen[s].size(); ++k)
      REQUIRE(static_cast<std::uint64_t>(seen[s][k]) == src.window_of(7, k));
    for (std::size_t e = 0; (e + 1) * n <= seen[s].size(); ++e) {
      std::vector<int> epoch(seen[s].begin() + static_cast<std::ptrdiff_t>(e * n),
                             seen[s].begin() + static_cast<std::ptrdiff_t>((e + 1) * n));
      std::sort(epoch.begin(), epoch.end());
      for (std::size_t k = 0; k < n; ++k) REQUIRE(epoch[k] == static_cast<int>(k));
    }
  }
  // One source without a blend reads exactly as TokenDataset::fill.
  const BlendedDataset one({{"train", 1.0, syn.data[0].get(), nullptr}}, false);
  for (std::int64_t b : {0, 3, 17}) {
    std::vector<std::int32_t> x(8 * kSeq), y(x.size()), p(x.size()), q(x.size());
    one.fill(9, b, 16, 8, 8, x.data(), y.data());
    syn.data[0]->fill(9, b, 16, 8, 8, p.data(), q.data());
    REQUIRE(x == p);
    REQUIRE(y == q);
  }
}

TEST_CASE("a resumed blend continues each source where it stopped", "[io][blend]") {
  const Synthetic syn;
  constexpr int kGlobal = 40;
  BlendedDataset same = syn.blend({0.7, 0.2, 0.1});
  const BlendedDataset ref = syn.blend({0.7, 0.2, 0.1});
  // The same blend resumed at batch 9 with the counts it had: the uninterrupted data.
  same.resume(9, kGlobal, ref.drawn(9, kGlobal));
  for (std::int64_t b = 9; b < 20; ++b)
    REQUIRE(read(same, b, kGlobal, {{0, kGlobal}}) == read(ref, b, kGlobal, {{0, kGlobal}}));
  CHECK(same.drawn(20, kGlobal) == ref.drawn(20, kGlobal));
  // Another blend from batch 9: each source goes on from its count; the new weights rule.
  BlendedDataset other = syn.blend({0.2, 0.3, 0.5});
  const auto at9 = ref.drawn(9, kGlobal);
  other.resume(9, kGlobal, at9);
  std::vector<std::uint64_t> next = at9;
  for (std::int64_t b = 9; b < 259; ++b)
    for (int v : read(other, b, kGlobal, {{0, kGlobal}})) {
      const std::size_t s = static_cast<std::size_t>(v / 1000);
      REQUIRE(static_cast<std::uint64_t>(v % 1000) == syn.data[s]->window_of(7, next[s]++));
    }
  CHECK(other.drawn(259, kGlobal) == next);
  const double want[] = {0.2, 0.3, 0.5};
  for (std::size_t s = 0; s < 3; ++s)
    CHECK(std::fabs((next[s] - at9[s]) / 10000.0 - want[s]) <= 0.01 * want[s]);
}
