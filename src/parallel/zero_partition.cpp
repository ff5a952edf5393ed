#include "meshtrain/parallel/zero_partition.hpp"

#include <algorithm>

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

std::vector<Bucket> plan_buckets(const std::vector<model::UnitInfo>& units, std::size_t elem_bytes,
                                 std::size_t bucket_bytes, bool per_unit) {
  std::vector<Bucket> out;
  const int n = static_cast<int>(units.size());
  int hi = n - 1;
  std::size_t bytes = 0;
  for (int u = n - 1; u >= 0; --u) {
    bytes += units[u].size() * elem_bytes;
    if (per_unit || bytes >= bucket_bytes || u == 0) {
      out.push_back(Bucket{u, hi, FlatRange{units[u].begin, units[hi].end}});
      hi = u - 1;
      bytes = 0;
    }
  }
  return out;
}

ZeroPartition::ZeroPartition(std::size_t n, int dp_size)
    : ZeroPartition(std::vector<FlatRange>{FlatRange{0, n}}, dp_size) {}

ZeroPartition::ZeroPartition(std::vector<FlatRange> groups, int dp_size) : dp_(dp_size) {
  MESHTRAIN_CHECK(dp_ >= 1, "ZeroPartition: dp=", dp_);
  std::sort(groups.begin(), groups.end(),
            [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const FlatRange& r = groups[i];
    MESHTRAIN_CHECK(r.begin <= r.end, "ZeroPartition: group [", r.begin, ", ", r.end, ")");
    MESHTRAIN_CHECK(i == 0 || groups[i - 1].end <= r.begin, "ZeroPartition: groups overlap at ",
                    r.begin);
    const std::size_t per_rank = (r.size() + dp_ - 1) / dp_;
    const std::size_t piece = (per_rank + kShardAlign - 1) / kShardAlign * kShardAlign;
    groups_.push_back(ZeroGroup{r, piece, shard_});
    shard_ += piece;
  }
}

int ZeroPartition::group_of(std::size_t i) const {
  auto it = std::upper_bound(groups_.begin(), groups_.end(), i,
                             [](std::size_t x, const ZeroGroup& g) { return x < g.range.begin; });
  if (it == groups_.begin()) return -1;
  --it;
  return i < it->range.end ? static_cast<int>(it - groups_.begin()) : -1;
}

FlatRange ZeroPartition::piece(int g, int r) const {
  const ZeroGroup& z = groups_[g];
  const std::size_t lo = std::min(z.range.begin + r * z.piece, z.range.end);
  const std::size_t hi = std::min(lo + z.piece, z.range.end);
  return FlatRange{lo, hi};
}

std::vector<FlatRange> ZeroPartition::pieces(int r) const {
  std::vector<FlatRange> out;
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) out.push_back(piece(g, r));
  return out;
}

std::vector<ShardSegment> ZeroPartition::segments(const model::ParameterRegistry& reg,
                                                  int r) const {
  MESHTRAIN_CHECK(r >= 0 && r < dp_, "ZeroPartition::segments: rank ", r, " of dp=", dp_);
  std::vector<ShardSegment> out;
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
    const FlatRange pc = piece(g, r);
    if (pc.size() == 0) continue;
    // Offsets are sorted: parameters overlapping the piece.
    for (const auto& p : reg.params()) {
      const std::size_t lo = std::max(pc.begin, p.offset), hi = std::min(pc.end, p.offset + p.numel);
      if (lo >= hi) continue;
      ShardSegment s;
      s.param = &p;
      s.group = g;
      s.param_begin = lo - p.offset;
      s.param_end = hi - p.offset;
      s.flat_begin = lo;
      s.shard_offset = groups_[g].shard_offset + (lo - pc.begin);
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace meshtrain::parallel
