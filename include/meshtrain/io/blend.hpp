#pragma once
// Weighted blends of token datasets (`--data.blend "0.7 web 0.2 code 0.1 books"`).
//
// Which source global sequence g comes from is a function of g alone: a fixed table of one
// period (kBlendPeriod sequences) in which source s holds round(w_s * period) places, spread out
// by the largest-deficit rule (the place goes to the source furthest behind its share), and
// repeated. Any stretch of sequences holds each source's share to within a couple of sequences.
// Within a source, its sequences are taken in that source's own order (TokenDataset's keyed
// permutation per epoch, same seed): the k-th sequence of source s in the blend is sequence k of
// s. So the data of a step is a function of (seed, step, global sequence index) only
// (DESIGN invariant 3): any data-parallel layout, micro-batch split or restore reads the same
// windows. A restore may also change the blend: each source then continues after the sequences
// it had drawn (resume()).
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/io/dataset.hpp"

namespace meshtrain::io {

inline constexpr std::uint32_t kBlendPeriod = 1u << 16;

// One source as data.blend names it: `name` is the text given (a shard prefix, or a shard glob
// ending in .bin), `weight` normalised over the blend; `train` and `val` are its shard globs
// (`val` empty when it has none): prefix P -> P_train_*.bin and P_val_*.bin; a glob ending in
// .bin -> itself, and the same with its last "_train_" turned into "_val_" where it has one.
struct BlendSourceSpec {
  std::string name;
  double weight = 0;
  std::string train, val;
};

// "0.7 web 0.2 code_* 0.1 data/books_train_*.bin" (whitespace or commas between the items).
// ConfigError naming `option` for a bad weight, a missing pattern or a name given twice.
std::vector<BlendSourceSpec> parse_blend(const std::string& text, const std::string& option);

// The pure part: which source each global sequence comes from.
class BlendSchedule {
 public:
  // Positive weights (any scale). ConfigError for none, more than 256, or a bad weight.
  explicit BlendSchedule(const std::vector<double>& weights);
  int sources() const { return static_cast<int>(per_period_.size()); }
  // Places of source s in one period (its realised weight is this / kBlendPeriod).
  std::uint32_t per_period(int s) const { return per_period_[static_cast<std::size_t>(s)]; }
  int source_of(std::uint64_t g) const { return table_[g % kBlendPeriod]; }
  // How many of the global sequences [0, g) come from source s.
  std::uint64_t count_before(int s, std::uint64_t g) const;

 private:
  std::vector<std::uint32_t> per_period_;
  std::vector<std::uint16_t> table_;                 // source of each place of the period
  std::vector<std::vector<std::uint32_t>> places_;  // per source: its places, ascending
};

// A source of a run's data: training shards and, optionally, validation shards (not owned).
struct DataSource {
  std::string name;
  double weight = 1;
  const TokenDataset* train = nullptr;
  const TokenDataset* val = nullptr;
};

// The training data of a run: one dataset (data.train: exactly TokenDataset's order), or a blend.
class BlendedDataset {
 public:
  // `blend` false: one source, read as TokenDataset::fill reads it. ConfigError for sources of
  // other sequence lengths.
  BlendedDataset(std::vector<DataSource> sources, bool blend);

  bool blended() const { return blend_; }
  const std::vector<DataSource>& sources() const { return sources_; }
  const BlendSchedule& schedule() const { return schedule_; }
  int seq_len() const { return sources_.front().train->seq_len(); }
  std::uint64_t num_windows() const;  // over all sources

  // TokenDataset::fill's contract: global sequences [batch * global_batch + first, + count) of
  // this seed's order, into inputs/targets (count * seq_len each).
  void fill(std::uint64_t seed, std::int64_t batch, int global_batch, int first, int count,
            std::int32_t* inputs, std::int32_t* targets) const;

  // Sequences of each source that data batches [0, batch) drew.
  std::vector<std::uint64_t> drawn(std::int64_t batch, int global_batch) const;
  // Continues at data batch `batch`, before which source s had drawn drawn[s] sequences (a
  // checkpoint's counts, under this blend or another one).
  void resume(std::int64_t batch, int global_batch, const std::vector<std::uint64_t>& drawn);

 private:
  std::uint64_t index_in_source(int s, std::uint64_t g) const;
  std::vector<DataSource> sources_;
  bool blend_;
  BlendSchedule schedule_;
  std::uint64_t start_ = 0;           // global sequence where the counts below hold
  std::vector<std::uint64_t> base_;   // sequences each source had drawn before start_
};

}  // namespace meshtrain::io
