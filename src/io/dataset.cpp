// Data order as a pure function (DESIGN invariant 3). Global sequence g lives in epoch
// g / num_windows and is window P_e(g mod num_windows), where P_e is a keyed bijection whose key
// depends on (seed, e) only. No rank keeps a cursor, so any layout, and any restart at any step,
// reads exactly the windows an uninterrupted single-rank run would read.
#include "meshtrain/io/dataset.hpp"

#include <glob.h>

#include <algorithm>
#include <bit>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/splitmix64.hpp"

namespace meshtrain::io {

namespace {

// splitmix64: a cheap bijective mixer with full avalanche, good enough as a Feistel round
// function; we need a fixed, portable permutation, not crypto.
std::uint64_t hash2(std::uint64_t a, std::uint64_t b) { return splitmix64(splitmix64(a) ^ b); }

std::uint64_t epoch_key(std::uint64_t seed, std::uint64_t epoch) {
  return hash2(seed ^ 0x6D657368ull /* "mesh" */, epoch);
}

constexpr int kRounds = 4;  // Luby-Rackoff: 4 rounds of a good round function look random

}  // namespace

std::uint64_t keyed_permutation(std::uint64_t index, std::uint64_t n, std::uint64_t key) {
  MESHTRAIN_CHECK(n > 0 && index < n, "keyed_permutation: index ", index, " not in [0, ", n, ")");
  if (n == 1) return 0;
  // A balanced Feistel network permutes [0, 2^bits) for any round function; bits is the next even
  // number >= log2(n), so the domain is < 4n and cycle walking (re-applying the permutation until
  // the value lands in [0, n)) takes < 4 steps on average. Cycle walking keeps it a bijection:
  // following the cycle of a bijection from a point inside [0, n) to the next point inside it
  // pairs the points of [0, n) one-to-one.
  int bits = 64 - std::countl_zero(n - 1);  // ceil(log2 n)
  bits += bits & 1;
  const int half = bits / 2;
  const std::uint64_t mask = (1ull << half) - 1;  // half <= 32
  std::uint64_t round_keys[kRounds];
  for (int r = 0; r < kRounds; ++r) round_keys[r] = hash2(key, static_cast<std::uint64_t>(r));
  std::uint64_t x = index;
  do {
    std::uint64_t left = x >> half, right = x & mask;
    for (int r = 0; r < kRounds; ++r) {
      const std::uint64_t f = splitmix64(right ^ round_keys[r]) & mask;
      const std::uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= n);
  return x;
}

TokenDataset::TokenDataset(const std::string& pattern, int seq_len) : seq_len_(seq_len) {
  if (seq_len <= 0)
    throw ConfigError(cat("sequence length ", seq_len, " must be positive (data ", pattern, ")"));
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  if (rc == 0) {
    for (std::size_t i = 0; i < g.gl_pathc; ++i) files_.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || files_.empty())
    throw ConfigError(cat("no token shard matches '", pattern,
                          "' (make shards with `meshtrain prep`; see inputs/README.md)"));
  if (rc != 0) throw ConfigError(cat("cannot read the files matching '", pattern, "'"));
  std::sort(files_.begin(), files_.end());  // glob sorts too, but by locale collation

  const std::uint64_t span = static_cast<std::uint64_t>(seq_len) + 1;
  for (const auto& f : files_) {
    shards_.emplace_back(f);
    const auto& s = shards_.back();
    total_tokens_ += s.size();
    const auto shard = static_cast<std::uint32_t>(shards_.size() - 1);
    for (std::uint64_t off = 0; off + span <= s.size(); off += span) windows_.push_back({shard, off});
  }
  if (windows_.empty())
    throw ConfigError(cat("the shards matching '", pattern, "' hold ", total_tokens_,
                          " tokens, no shard holds a window of seq_len + 1 = ", span,
                          " tokens; use more data or a shorter sequence length"));
}

const std::vector<std::string>& TokenDataset::files() const { return files_; }

void TokenDataset::check_vocab(int vocab_size) const {
  for (const auto& s : shards_) s.check_vocab(vocab_size);
}

std::uint64_t TokenDataset::window_of(std::uint64_t seed, std::uint64_t g) const {
  const std::uint64_t n = windows_.size();
  return keyed_permutation(g % n, n, epoch_key(seed, g / n));
}

void TokenDataset::copy_window(std::uint64_t w, std::int32_t* inputs,
                               std::int32_t* targets) const {
  const Window& win = windows_[w];
  const std::uint16_t* t = shards_[win.shard].data() + win.offset;
  for (int j = 0; j < seq_len_; ++j) {
    inputs[j] = t[j];
    targets[j] = t[j + 1];
  }
}

void TokenDataset::fill_sequence(std::uint64_t seed, std::uint64_t index, std::int32_t* inputs,
                                 std::int32_t* targets) const {
  copy_window(window_of(seed, index), inputs, targets);
}

void TokenDataset::fill(std::uint64_t seed, std::int64_t step, int global_batch, int first,
                        int count, std::int32_t* inputs, std::int32_t* targets) const {
  MESHTRAIN_CHECK(step >= 0 && global_batch > 0 && first >= 0 && count >= 0 &&
                      first + count <= global_batch,
                  "TokenDataset::fill: slice [", first, ", ", first + count,
                  ") of a global batch of ", global_batch, " at step ", step);
  const std::uint64_t base =
      static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(global_batch) +
      static_cast<std::uint64_t>(first);
  for (int k = 0; k < count; ++k) {
    const std::size_t o = static_cast<std::size_t>(k) * seq_len_;
    copy_window(window_of(seed, base + k), inputs + o, targets + o);
  }
}

void TokenDataset::fill_sequential(std::uint64_t first, int count, std::int32_t* inputs,
                                   std::int32_t* targets) const {
  MESHTRAIN_CHECK(count >= 0, "TokenDataset::fill_sequential: count ", count);
  const std::uint64_t n = windows_.size();
  for (int k = 0; k < count; ++k) {
    const std::size_t o = static_cast<std::size_t>(k) * seq_len_;
    copy_window((first + k) % n, inputs + o, targets + o);
  }
}

std::int64_t batch_of_step(std::int64_t step, const std::vector<std::int64_t>& skipped) {
  std::int64_t b = step;
  for (std::int64_t x : skipped)  // ascending: each skipped index at or below b pushes b on
    if (x <= b) ++b;
  return b;
}

}  // namespace meshtrain::io
