#pragma once
// A token dataset made of shards, cut into windows of seq_len + 1 tokens (inputs and shifted
// targets). The order of windows is a function of (seed, epoch) only: a keyed bijective
// permutation of the window indices per epoch. So global sequence g (= step * global_batch + j)
// is the same window under any layout (DESIGN invariant 3), and each data-parallel rank reads
// its slice [first, first + count) of the global batch without reading anyone else's.
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/io/token_shard.hpp"

namespace meshtrain::io {

class TokenDataset {
 public:
  // `pattern`: a file path or a glob (e.g. "inputs/data/kjv_train_*.bin"); shards in sorted
  // order. Throws ConfigError naming the pattern when nothing matches.
  TokenDataset(const std::string& pattern, int seq_len);

  int seq_len() const { return seq_len_; }
  std::size_t num_tokens() const { return total_tokens_; }
  // Number of non-overlapping windows of seq_len + 1 tokens (windows do not cross shards).
  std::uint64_t num_windows() const { return windows_.size(); }
  const std::vector<std::string>& files() const;
  void check_vocab(int vocab_size) const;

  // Window index of global sequence g for this seed (epoch = g / num_windows()).
  std::uint64_t window_of(std::uint64_t seed, std::uint64_t g) const;

  // Sequence `index` of this dataset's order for this seed (window_of(seed, index)) into
  // inputs/targets (seq_len each): what a blend reads for one of its sources.
  void fill_sequence(std::uint64_t seed, std::uint64_t index, std::int32_t* inputs,
                     std::int32_t* targets) const;

  // Fill inputs/targets (count * seq_len each, host memory) with global sequences
  // [step * global_batch + first, ... + count) for this seed.
  void fill(std::uint64_t seed, std::int64_t step, int global_batch, int first, int count,
            std::int32_t* inputs, std::int32_t* targets) const;

  // Sequential evaluation batches (no shuffling): sequences [first, first + count) of the
  // window list, wrapping around.
  void fill_sequential(std::uint64_t first, int count, std::int32_t* inputs,
                       std::int32_t* targets) const;

 private:
  struct Window {
    std::uint32_t shard;
    std::uint64_t offset;
  };
  void copy_window(std::uint64_t w, std::int32_t* inputs, std::int32_t* targets) const;
  int seq_len_;
  std::vector<TokenShard> shards_;
  std::vector<std::string> files_;
  std::vector<Window> windows_;
  std::size_t total_tokens_ = 0;
};

// A keyed bijection on [0, n) (Feistel network with cycle walking): the epoch permutation.
std::uint64_t keyed_permutation(std::uint64_t index, std::uint64_t n, std::uint64_t key);

// The data batch that 0-based step `step` trains on when the batches in `skipped` (sorted,
// distinct) are left out: the step-th batch index not in `skipped`. Without skips it is `step`
// (DESIGN invariant 3: the batch is a function of the seed and this index only). The batches a
// rollback leaves out are train::DivergenceGuard's; which batch a step reads is the data order's.
std::int64_t batch_of_step(std::int64_t step, const std::vector<std::int64_t>& skipped);

}  // namespace meshtrain::io
