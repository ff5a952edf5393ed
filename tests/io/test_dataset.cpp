// TokenDataset: windows, the keyed permutation, and data order as a function of (seed, g) only
// (DESIGN invariant 3): any slicing of the global batch over data-parallel ranks reads the same
// sequences.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <vector>

#include "io_test_util.hpp"
#include "meshtrain/io/dataset.hpp"

using namespace meshtrain::io;
using io_test::config_error;
using io_test::has;

namespace {

// Token value = shard * 1000 + position, so every window says where it came from.
std::vector<std::string> make_shards(const std::string& stem, const std::vector<std::size_t>& sizes) {
  std::vector<std::string> paths;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    std::vector<std::uint16_t> t(sizes[k]);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::uint16_t>(k * 1000 + i);
    paths.push_back(io_test::temp_name(stem, "_" + std::to_string(k) + ".bin"));
    write_shard(paths.back(), t);
  }
  return paths;
}

void remove_all(const std::vector<std::string>& paths) {
  for (const auto& p : paths) std::remove(p.c_str());
}

}  // namespace

TEST_CASE("windows of seq_len + 1 tokens do not cross shards", "[io][dataset]") {
  const auto paths = make_shards("ds_win", {23, 10, 4});
  const std::string pattern = io_test::temp_name("ds_win", "_*.bin");
  TokenDataset ds(pattern, 4);  // span 5: shard 0 -> 4 windows, shard 1 -> 2, shard 2 -> none
  REQUIRE(ds.files() == paths);
  REQUIRE(ds.num_tokens() == 37);
  REQUIRE(ds.num_windows() == 6);
  std::vector<std::int32_t> in(8 * 4), tg(8 * 4);
  ds.fill_sequential(0, 6, in.data(), tg.data());
  const std::int32_t starts[] = {0, 5, 10, 15, 1000, 1005};
  for (int w = 0; w < 6; ++w)
    for (int j = 0; j < 4; ++j) {
      CHECK(in[w * 4 + j] == starts[w] + j);
      CHECK(tg[w * 4 + j] == starts[w] + j + 1);
    }
  ds.fill_sequential(5, 3, in.data(), tg.data());  // wraps: windows 5, 0, 1
  REQUIRE(in[0] == 1005);
  REQUIRE(in[4] == 0);
  REQUIRE(in[8] == 5);
  ds.check_vocab(3000);
  REQUIRE(has(config_error([&] { ds.check_vocab(1004); }), "token 1004"));

  TokenDataset one(paths[1], 4);  // a plain path is a pattern too
  REQUIRE(one.num_windows() == 2);

  REQUIRE(has(config_error([&] { TokenDataset d("nothing_here_*.bin", 4); }),
              "no token shard matches 'nothing_here_*.bin'"));
  const std::string w = config_error([&] { TokenDataset d(pattern, 23); });
  INFO(w);
  REQUIRE(has(w, pattern));
  REQUIRE(has(w, "seq_len + 1 = 24"));
  remove_all(paths);
}

TEST_CASE("keyed_permutation is a bijection on [0, n) for any n and key", "[io][dataset]") {
  for (std::uint64_t n : {1ull, 2ull, 3ull, 7ull, 8ull, 1000ull, 65537ull}) {
    for (std::uint64_t key : {0ull, 1ull, 42ull, 0xDEADBEEFCAFEF00Dull}) {
      std::vector<char> seen(n, 0);
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint64_t p = keyed_permutation(i, n, key);
        REQUIRE(p < n);
        REQUIRE(seen[p] == 0);
        seen[p] = 1;
      }
    }
  }
  // Keys matter, and a permutation is far from the identity.
  int differ = 0, fixed = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    differ += keyed_permutation(i, 1000, 1) != keyed_permutation(i, 1000, 2);
    fixed += keyed_permutation(i, 1000, 1) == i;
  }
  REQUIRE(differ > 900);
  REQUIRE(fixed < 20);
  // Huge domains work without tables (values stay in range).
  const std::uint64_t big = (1ull << 40) + 3;
  for (std::uint64_t i = big - 5; i < big; ++i) REQUIRE(keyed_permutation(i, big, 7) < big);
}

TEST_CASE("the global batch depends on (seed, step) only, not on the slicing", "[io][dataset]") {
  const auto paths = make_shards("ds_order", {9 * 120, 9 * 80 + 4});  // 200 windows of 8 + 1
  const std::string pattern = io_test::temp_name("ds_order", "_*.bin");
  const TokenDataset ds(pattern, 8);
  REQUIRE(ds.num_windows() == 200);
  const int gb = 16, T = 8;
  auto batch = [&](const TokenDataset& d, std::uint64_t seed, std::int64_t step,
                   const std::vector<int>& slices) {
    std::vector<std::int32_t> in(gb * T), tg(gb * T);
    int first = 0;
    for (int count : slices) {
      d.fill(seed, step, gb, first, count, in.data() + first * T, tg.data() + first * T);
      first += count;
    }
    REQUIRE(first == gb);
    return std::make_pair(in, tg);
  };
  const TokenDataset again(pattern, 8);  // a fresh reader (a restarted job) agrees too
  for (std::int64_t step : {0, 1, 5, 12, 13, 30}) {  // 12.5 steps per epoch: crosses epochs
    const auto ref = batch(ds, 1234, step, {gb});
    CHECK(batch(ds, 1234, step, {4, 4, 4, 4}) == ref);
    CHECK(batch(ds, 1234, step, {6, 5, 5}) == ref);
    CHECK(batch(again, 1234, step, {1, 15}) == ref);
    CHECK(batch(ds, 99, step, {gb}) != ref);  // another seed, another order
    // Each sequence is a window: targets are inputs shifted by one.
    for (int k = 0; k < gb; ++k) CHECK(ref.second[k * T] == ref.first[k * T + 1]);
  }
  // An epoch visits every window once; the next epoch is another permutation.
  std::vector<std::uint64_t> e0, e1;
  for (std::uint64_t g = 0; g < 200; ++g) {
    e0.push_back(ds.window_of(1234, g));
    e1.push_back(ds.window_of(1234, 200 + g));
  }
  REQUIRE(e0 != e1);
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  for (std::uint64_t w = 0; w < 200; ++w) {
    REQUIRE(e0[w] == w);
    REQUIRE(e1[w] == w);
  }
  // Step 12 holds g = 192..207, the end of epoch 0 and the start of epoch 1; slot 8 is g = 200.
  std::vector<std::int32_t> in(T), tg(T), want_in(T), want_tg(T);
  ds.fill(1234, 12, gb, 8, 1, in.data(), tg.data());
  ds.fill_sequential(ds.window_of(1234, 200), 1, want_in.data(), want_tg.data());
  REQUIRE(in == want_in);
  REQUIRE(tg == want_tg);
  remove_all(paths);
}
