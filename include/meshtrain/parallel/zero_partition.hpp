#pragma once
// ZeRO partitions of a rank's flat parameter buffer over the data-parallel group, and the
// gradient buckets they are cut along.
//
// The flat buffer is covered by groups (the DP buckets: ranges of whole layer units). Each group
// is split over the dp ranks into equal pieces of `piece` elements, a multiple of kAlign, the
// last ones padded past the group's end; a rank's shard is the concatenation of its pieces, so
// every rank's shard has the same size. This is the layout of Megatron-Core's distributed
// optimizer, and the only one that lets the collectives of the communicator (equal blocks) do
// the work: a bucket's gradients are one reduce-scatter whose block r is rank r's piece, and a
// unit's parameters (ZeRO-3, one group per unit) are one all-gather. With a single group
// [0, n) it is the textbook partition: shard = ceil(n / dp) rounded up to kAlign.
//
// kAlign = 64 elements keeps every piece (and so every send/recv block) 128-byte aligned for bf16
// and 256-byte aligned for fp32, which NCCL's vectorised copies want, and matches the registry's
// parameter alignment.
#include <cstddef>
#include <string>
#include <vector>

#include "meshtrain/model/registry.hpp"

namespace meshtrain::parallel {

inline constexpr std::size_t kShardAlign = 64;

// A contiguous range [begin, end) of the flat buffer.
struct FlatRange {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};

// A DP bucket: units [first_unit, last_unit] (consecutive, registry().units()), covering `range`.
struct Bucket {
  int first_unit = 0, last_unit = 0;
  FlatRange range;
};

// Buckets over `units` in reverse order (the order backward completes them): units are added to
// the current bucket until it holds at least `bucket_bytes`; a unit larger than that is a bucket
// by itself; a bucket holds units of one parameter group (UnitInfo::group) only. per_unit: one bucket per unit (ZeRO-3, whose gathers are per unit). Returned in
// launch order (last units first).
std::vector<Bucket> plan_buckets(const std::vector<model::UnitInfo>& units, std::size_t elem_bytes,
                                 std::size_t bucket_bytes, bool per_unit);

struct ZeroGroup {
  FlatRange range;               // the flat elements this group covers
  std::size_t piece = 0;         // elements per rank (multiple of kShardAlign)
  std::size_t shard_offset = 0;  // where each rank's piece sits in its shard buffer
  // The ranks that split it: dp rank r holds piece r / stride of ranks = dp / stride. Dense
  // groups: stride 1 (all of dp). Experts (mesh.ep = stride): the expert-data-parallel group,
  // whose rank is r / ep (mesh/rank_math.hpp); the ep ranks between hold other experts at the
  // same flat offsets.
  int stride = 1, ranks = 1;
  int member(int dp_rank) const { return dp_rank / stride; }
};

// One parameter's elements inside a rank's shard: what a checkpoint writes for this rank
// (the hyperslab [param_begin, param_end) of the parameter's local flat elements).
struct ShardSegment {
  const model::ParamInfo* param = nullptr;
  int group = 0;                               // the group (bucket) whose piece holds it
  std::size_t param_begin = 0, param_end = 0;  // local element range within the parameter
  std::size_t flat_begin = 0;                  // its position in the flat buffer
  std::size_t shard_offset = 0;                // its position in the rank's shard buffer
  std::size_t size() const { return param_end - param_begin; }
};

class ZeroPartition {
 public:
  // One group [0, n): shard = ceil(n / dp) rounded up to kShardAlign.
  ZeroPartition(std::size_t n, int dp_size);
  // Groups in any order, disjoint; laid out in the shard in increasing flat order. `strides`
  // (empty: all 1) gives each group's ZeroGroup::stride, which must divide dp_size.
  ZeroPartition(std::vector<FlatRange> groups, int dp_size, std::vector<int> strides = {});

  int dp_size() const { return dp_; }
  std::size_t shard_size() const { return shard_; }  // equal on every rank
  const std::vector<ZeroGroup>& groups() const { return groups_; }
  // Index of the group covering flat element i (-1: none).
  int group_of(std::size_t i) const;
  // Rank r's piece of group g in the flat buffer, clipped to the group (may be empty).
  FlatRange piece(int g, int r) const;
  // Rank r's pieces in shard order.
  std::vector<FlatRange> pieces(int r) const;
  // Parameter elements in rank r's shard, in shard order. Alignment gaps and padding are in no
  // segment; over all ranks the segments cover every registry element exactly once.
  std::vector<ShardSegment> segments(const model::ParameterRegistry& reg, int r) const;

 private:
  int dp_;
  std::vector<ZeroGroup> groups_;
  std::size_t shard_ = 0;
};

}  // namespace meshtrain::parallel
