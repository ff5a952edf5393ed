// ZeRO partitions: equal padded shares, buckets over units, and the shard -> (parameter, range)
// mapping that checkpoints write: over all ranks it covers every registry element exactly once.
#include <map>

#include "harness.hpp"
#include "meshtrain/parallel/zero_partition.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

namespace {

model::GptConfig cfg(int n_layer, int n_embd, int vocab) {
  model::GptConfig c;
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_embd = n_embd;
  c.vocab_size = vocab;
  c.vocab_pad = 64;
  c.block_size = 16;
  return c;
}

// Every parameter element is in exactly one rank's segments; segments agree with the registry;
// within a rank's shard they do not overlap and lie inside the shard.
void check_cover(const model::ParameterRegistry& reg, const ZeroPartition& part) {
  std::vector<int> owner(reg.size(), -1);
  for (int r = 0; r < part.dp_size(); ++r) {
    std::vector<char> used(part.shard_size(), 0);
    for (const auto& s : part.segments(reg, r)) {
      REQUIRE(s.param);
      REQUIRE(s.param_end > s.param_begin);
      REQUIRE(s.param_end <= s.param->numel);
      REQUIRE(s.flat_begin == s.param->offset + s.param_begin);
      REQUIRE(s.shard_offset + s.size() <= part.shard_size());
      for (std::size_t i = 0; i < s.size(); ++i) {
        REQUIRE(owner[s.flat_begin + i] == -1);
        owner[s.flat_begin + i] = r;
        REQUIRE(!used[s.shard_offset + i]);
        used[s.shard_offset + i] = 1;
      }
    }
  }
  std::vector<char> is_param(reg.size(), 0);
  for (const auto& p : reg.params())
    for (std::size_t i = 0; i < p.numel; ++i) is_param[p.offset + i] = 1;
  std::size_t missing = 0, stray = 0;
  for (std::size_t i = 0; i < reg.size(); ++i) {
    if (is_param[i] && owner[i] < 0) ++missing;
    if (!is_param[i] && owner[i] >= 0) ++stray;  // alignment gaps belong to no parameter
  }
  REQUIRE(missing == 0);
  REQUIRE(stray == 0);
}

}  // namespace

TEST_CASE("one group: equal shares of ceil(n/dp) rounded up to 64 elements", "[parallel][zero]") {
  ZeroPartition p(1000, 3);
  REQUIRE(p.shard_size() == 384);  // ceil(1000/3) = 334 -> 384
  REQUIRE(p.piece(0, 0).begin == 0);
  REQUIRE(p.piece(0, 0).end == 384);
  REQUIRE(p.piece(0, 1).begin == 384);
  REQUIRE(p.piece(0, 2).begin == 768);
  REQUIRE(p.piece(0, 2).end == 1000);  // the last share is padded past the end
  ZeroPartition q(100, 8);             // more ranks than 64-element pieces: empty shares
  REQUIRE(q.shard_size() == 64);
  REQUIRE(q.piece(0, 1).end == 100);
  REQUIRE(q.piece(0, 2).size() == 0);
  ZeroPartition one(1000, 1);
  REQUIRE(one.shard_size() == 1024);
  REQUIRE(one.piece(0, 0).size() == 1000);
}

TEST_CASE("units and buckets follow the registry in reverse order", "[parallel][zero]") {
  model::ParameterRegistry reg(cfg(3, 32, 100), 0, 1, 0, 0, 3, true, true);
  const auto& units = reg.units();
  REQUIRE(units.size() == 5);
  for (bool per_unit : {false, true}) {
    for (std::size_t bytes : {std::size_t(1), std::size_t(20000), std::size_t(1) << 30}) {
      const auto b = plan_buckets(units, 4, bytes, per_unit);
      int next = static_cast<int>(units.size()) - 1;  // launch order: last unit first
      for (const auto& k : b) {
        REQUIRE(k.last_unit == next);
        REQUIRE(k.first_unit <= k.last_unit);
        REQUIRE(k.range.begin == units[k.first_unit].begin);
        REQUIRE(k.range.end == units[k.last_unit].end);
        if (per_unit || bytes == 1) REQUIRE(k.first_unit == k.last_unit);
        next = k.first_unit - 1;
      }
      REQUIRE(next == -1);
      if (!per_unit && bytes == (std::size_t(1) << 30)) REQUIRE(b.size() == 1);
    }
  }
}

TEST_CASE("shards cover every registry element exactly once", "[parallel][zero]") {
  struct Slice {
    int tp_rank, tp, stage, first, last;
    bool emb, head;
  };
  const auto c = cfg(4, 32, 100);
  const Slice slices[] = {{0, 1, 0, 0, 4, true, true},   {1, 2, 0, 0, 4, true, true},
                          {0, 2, 0, 0, 2, true, false},  {1, 2, 1, 2, 4, false, true},
                          {0, 1, 1, 1, 3, false, false}};
  for (const auto& s : slices) {
    model::ParameterRegistry reg(c, s.tp_rank, s.tp, s.stage, s.first, s.last, s.emb, s.head);
    const auto& units = reg.units();
    for (int dp : {1, 2, 3, 4, 8}) {
      for (std::size_t bytes : {std::size_t(1), std::size_t(30000), std::size_t(1) << 30}) {
        for (bool per_unit : {false, true}) {
          INFO("tp " << s.tp_rank << "/" << s.tp << " stage " << s.stage << " dp " << dp
                     << " bucket " << bytes << " per_unit " << per_unit);
          std::vector<FlatRange> groups;
          for (const auto& b : plan_buckets(units, 4, bytes, per_unit)) groups.push_back(b.range);
          ZeroPartition part(groups, dp);
          REQUIRE(part.shard_size() % kShardAlign == 0);
          std::size_t sum = 0;
          for (const auto& g : part.groups()) {
            REQUIRE(g.piece % kShardAlign == 0);
            REQUIRE(g.piece * dp >= g.range.size());
            REQUIRE(g.piece * dp < g.range.size() + kShardAlign * dp);  // padding is minimal
            REQUIRE(g.shard_offset == sum);
            sum += g.piece;
          }
          check_cover(reg, part);
          for (std::size_t i = 0; i < reg.size(); i += 37) {
            const int g = part.group_of(i);
            if (g >= 0) {
              REQUIRE(part.groups()[g].range.begin <= i);
              REQUIRE(i < part.groups()[g].range.end);
            }
          }
        }
      }
    }
  }
}
