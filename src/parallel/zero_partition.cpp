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
    // A bucket reduces over one group: units of another group (MoE experts) start a new one.
    if (per_unit || bytes >= bucket_bytes || u == 0 || units[u - 1].group != units[u].group) {
      out.push_back(Bucket{u, hi, FlatRange{units[u].begin, units[hi].end}});
      hi = u - 1;
      bytes = 0;
    }
  }
  return out;
}

ZeroPartition::ZeroPartition(std::size_t n, int dp_size)
    : ZeroPartition(std::vector<FlatRange>{FlatRange{0, n}}, dp_size) {}

ZeroPartition::ZeroPartition(std::vector<FlatRange> groups, int dp_size, std::vector<int> strides)
    : dp_(dp_size) {
  MESHTRAIN_CHECK(dp_ >= 1, "ZeroPartition: dp=", dp_);
  if (strides.empty()) strides.assign(groups.size(), 1);
  MESHTRAIN_CHECK(strides.size() == groups.size(), "ZeroPartition: ", strides.size(),
                  " strides for ", groups.size(), " groups");
  std::vector<std::size_t> order(groups.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return groups[a].begin < groups[b].begin; });
  for (std::size_t k = 0; k < order.size(); ++k) {
    const FlatRange& r = groups[order[k]];
    const int stride = strides[order[k]];
    MESHTRAIN_CHECK(r.begin <= r.end, "ZeroPartition: group [", r.begin, ", ", r.end, ")");
    MESHTRAIN_CHECK(k == 0 || groups_.back().range.end <= r.begin,
                    "ZeroPartition: groups overlap at ", r.begin);
    MESHTRAIN_CHECK(stride >= 1 && dp_ % stride == 0, "ZeroPartition: stride ", stride,
                    " does not divide dp=", dp_);
    const int ranks = dp_ / stride;
    const std::size_t per_rank = (r.size() + ranks - 1) / ranks;
    const std::size_t piece = (per_rank + kShardAlign - 1) / kShardAlign * kShardAlign;
    groups_.push_back(ZeroGroup{r, piece, shard_, stride, ranks});
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
  const std::size_t lo =
      std::min(z.range.begin + static_cast<std::size_t>(z.member(r)) * z.piece, z.range.end);
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
