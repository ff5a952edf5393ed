// The ownership rule (parallel::ownership, first_copy): over every rank of a layout — dp, tp,
// pp, ep, cp and ZeRO 0-3 — each element of each global tensor is written exactly once, and the
// rule gives what the three places that computed it before (checkpoint staging, the
// HuggingFace export, the whole-model gather) gave. Pure: every rank is simulated, no MPI.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "harness.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/mesh/rank_math.hpp"
#include "meshtrain/parallel/dp_policy.hpp"
#include "meshtrain/parallel/ownership.hpp"
#include "meshtrain/parallel/zero_shards.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

namespace {

struct Layout {
  int dp = 1, tp = 1, pp = 1, ep = 1, cp = 1, zero = 0;
};

std::string describe(const Layout& L) {
  return cat("dp ", L.dp, " tp ", L.tp, " pp ", L.pp, " ep ", L.ep, " cp ", L.cp, " ZeRO ", L.zero);
}

model::GptConfig config(bool moe) {
  model::GptConfig c;
  c.name = "ownership-test";
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 61;
  c.vocab_pad = 16;
  c.block_size = 16;
  if (moe) {
    c.moe.experts = 4;
    c.moe.layer_freq = 2;  // dense and MoE blocks side by side
    c.moe.ffn = 16;
  }
  return c;
}

// One simulated rank: its registry, its replica places and its optimizer shard.
struct Rank {
  mesh::Coord c;
  std::unique_ptr<model::ParameterRegistry> reg;
  Replicas replicas, expert_replicas;
  OwnershipInputs in;
};

Replicas replicas_of(int r, const std::vector<std::string>& names, const mesh::Shape& s,
                     const mesh::Order& o) {
  const mesh::Group g = mesh::group_of(r, names, s, o);
  return Replicas{g.key, static_cast<int>(g.members.size())};
}

Rank make_rank(const model::GptConfig& cfg, const Layout& L, int r) {
  const mesh::Shape s{L.dp, L.pp, L.tp, L.ep, L.cp};
  const mesh::Order o;
  Rank k;
  k.c = mesh::coord_of(r, s, o);
  const int per = cfg.n_layer / L.pp;
  k.reg = std::make_unique<model::ParameterRegistry>(
      cfg, k.c.tp, L.tp, k.c.pp, k.c.pp * per, (k.c.pp + 1) * per, k.c.pp == 0,
      k.c.pp == L.pp - 1, k.c.dp % L.ep, L.ep);
  k.replicas = replicas_of(r, {"dp", "cp"}, s, o);
  k.expert_replicas = L.ep > 1 ? replicas_of(r, {"edp", "cp"}, s, o) : Replicas{};
  k.in.n = k.reg->size();
  k.in.zero_stage = L.zero;
  k.in.replicas = k.replicas;
  k.in.ep = L.ep;
  k.in.expert_replicas = k.expert_replicas;
  // The optimizer's shard as ZeroShards builds it (ZeRO 0: the whole buffer, unused by the rule).
  DpOptions opt;
  opt.zero_stage = L.zero;
  opt.bucket_bytes = 4096;  // several buckets
  const DpLayout dpl = make_dp_layout(*k.reg, 4, opt, L.dp * L.cp, L.ep);
  const ZeroPartition whole(k.reg->size(), 1);
  const ZeroPartition& part = L.zero >= 1 ? dpl.partition : whole;
  k.in.shard_pieces = shard_pieces(part, L.zero >= 1 ? k.replicas.rank : 0);
  k.in.shard_size = part.shard_size();
  return k;
}

// Adds one to the count of every global element of `pc`.
void count(const io::TensorPiece& pc, std::map<std::string, std::vector<int>>& seen) {
  const auto& p = *pc.param;
  const std::int64_t gcols = p.global_shape.size() == 2 ? p.global_shape[1] : p.global_shape[0];
  auto it = seen.find(p.name);
  REQUIRE(it != seen.end());
  for (const io::Block& b : io::global_blocks(pc))
    for (std::int64_t row = b.row0; row < b.row0 + b.rows; ++row)
      for (std::int64_t col = b.col0; col < b.col0 + b.cols; ++col)
        ++it->second[static_cast<std::size_t>(row * gcols + col)];
}

std::map<std::string, std::vector<int>> zero_counts(const model::GptConfig& cfg) {
  const model::ParameterRegistry full(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  std::map<std::string, std::vector<int>> seen;
  for (const auto& p : full.params())
    seen[p.name].assign(static_cast<std::size_t>(p.global_numel()), 0);
  return seen;
}

std::vector<Layout> layouts() {
  std::vector<Layout> out;
  const std::vector<std::tuple<int, int, int, int, int>> shapes{
      {1, 1, 1, 1, 1}, {2, 1, 1, 1, 1}, {3, 1, 1, 1, 1}, {1, 2, 1, 1, 1}, {1, 1, 2, 1, 1},
      {2, 2, 2, 1, 1}, {2, 1, 1, 1, 2}, {2, 2, 1, 1, 2}, {1, 2, 2, 1, 2}, {2, 1, 1, 2, 1},
      {4, 1, 1, 2, 1}, {4, 1, 1, 4, 1}, {4, 2, 1, 2, 1}, {2, 1, 2, 2, 1}, {2, 1, 1, 2, 2},
      {4, 1, 2, 2, 2}};
  for (const auto& [dp, tp, pp, ep, cp] : shapes)
    for (int zero = 0; zero <= 3; ++zero) out.push_back(Layout{dp, tp, pp, ep, cp, zero});
  return out;
}

int world(const Layout& L) { return L.dp * L.tp * L.pp * L.cp; }

// ---- the rules as the three call sites wrote them before (issue 39) ----

// engine_checkpoint.cpp, engine_export.cpp (checkpoint_partition): the ranges, and add_pieces' filter
// (only: 0 every parameter, 1 dense, 2 experts).
std::vector<io::TensorPiece> old_checkpoint_pieces(const Rank& k, const Layout& L) {
  const bool ep_split = L.zero == 0 && L.ep > 1;
  std::vector<optim::ShardPiece> dense, expert;
  const std::size_t n = k.reg->size();
  auto range = [&](std::size_t d, std::size_t D) {
    return optim::ShardPiece{n * d / D, 0, n * (d + 1) / D - n * d / D};
  };
  if (L.zero >= 1) {
    dense = k.in.shard_pieces;
  } else {
    dense.push_back(range(static_cast<std::size_t>(k.replicas.rank),
                          static_cast<std::size_t>(k.replicas.size)));
    if (ep_split)
      expert.push_back(range(static_cast<std::size_t>(k.expert_replicas.rank),
                             static_cast<std::size_t>(k.expert_replicas.size)));
  }
  std::vector<io::TensorPiece> out;
  auto add = [&](const std::vector<optim::ShardPiece>& rs, int only) {
    for (const auto& r : rs) {
      if (r.length == 0) continue;
      for (const auto& pc : io::pieces_for_range(*k.reg, r.flat, r.flat + r.length, true)) {
        const bool is_expert = pc.param->grad_group == model::ParamGroup::expert_dp;
        if ((only == 1 && is_expert) || (only == 2 && !is_expert)) continue;
        out.push_back(pc);
      }
    }
  };
  add(dense, ep_split ? 1 : 0);
  if (ep_split) add(expert, 2);
  return out;
}

// model_transfer.cpp: dp ranks below ep sent their whole slice.
bool old_gather_sender(const Rank& k, const Layout& L) { return k.c.dp < L.ep; }

bool same(const io::TensorPiece& a, const io::TensorPiece& b) {
  return a.param == b.param && a.tp_rank == b.tp_rank && a.local_begin == b.local_begin &&
         a.count == b.count && a.primary == b.primary;
}

}  // namespace

TEST_CASE("every element of every tensor is owned by exactly one rank", "[parallel][ownership]") {
  for (const bool moe : {false, true}) {
    const model::GptConfig cfg = config(moe);
    for (const Layout& L : layouts()) {
      if (!moe && L.ep > 1) continue;
      INFO(describe(L) << (moe ? ", MoE" : ", dense"));
      auto seen = zero_counts(cfg);
      for (int r = 0; r < world(L); ++r) {
        const Rank k = make_rank(cfg, L, r);
        const Ownership own = ownership(k.in);
        // The ranges lie in the flat buffer and one after the other in the staging buffer.
        std::vector<char> staged(own.staged, 0);
        for (const auto* list : {&own.dense, &own.expert})
          for (const auto& p : *list) {
            REQUIRE(p.flat + p.length <= k.reg->size());
            REQUIRE(p.shard + p.length <= own.staged);
            for (std::size_t i = 0; i < p.length; ++i) {
              REQUIRE(!staged[p.shard + i]);
              staged[p.shard + i] = 1;
            }
          }
        REQUIRE(own.expert_split == (L.zero == 0 && L.ep > 1));
        REQUIRE(own.whole_shard == (L.zero >= 1));
        for (const OwnedPiece& o : owned_pieces(*k.reg, own, true)) {
          REQUIRE(o.piece.flat_offset() >= o.range.flat);
          REQUIRE(o.piece.flat_offset() + o.piece.count <= o.range.flat + o.range.length);
          count(o.piece, seen);
        }
      }
      for (const auto& [name, counts] : seen) {
        INFO(name);
        REQUIRE(std::all_of(counts.begin(), counts.end(), [](int x) { return x == 1; }));
      }
    }
  }
}

TEST_CASE("the rule gives what checkpoints and the export wrote before", "[parallel][ownership]") {
  for (const bool moe : {false, true}) {
    const model::GptConfig cfg = config(moe);
    for (const Layout& L : layouts()) {
      if (!moe && L.ep > 1) continue;
      INFO(describe(L) << (moe ? ", MoE" : ", dense"));
      for (int r = 0; r < world(L); ++r) {
        INFO("rank " << r);
        const Rank k = make_rank(cfg, L, r);
        const Ownership own = ownership(k.in);
        const std::vector<OwnedPiece> now = owned_pieces(*k.reg, own, true);
        const std::vector<io::TensorPiece> before = old_checkpoint_pieces(k, L);
        REQUIRE(now.size() == before.size());
        for (std::size_t i = 0; i < now.size(); ++i) REQUIRE(same(now[i].piece, before[i]));
        // The checkpoint staged the ZeRO-0 ranges one after the other; ZeRO >= 1 the shard.
        if (L.zero >= 1) {
          REQUIRE(own.staged == k.in.shard_size);
        } else {
          std::size_t staged = 0;
          for (const auto* list : {&own.dense, &own.expert})
            for (const auto& p : *list) {
              REQUIRE(p.shard == staged);
              staged += p.length;
            }
          REQUIRE(own.staged == staged);
        }
      }
    }
  }
}

TEST_CASE("the whole-model gather takes one copy of every element", "[parallel][ownership]") {
  for (const bool moe : {false, true}) {
    const model::GptConfig cfg = config(moe);
    for (const Layout& L : layouts()) {
      if (L.zero != 0 || (!moe && L.ep > 1)) continue;  // the gather reads whole slices
      INFO(describe(L) << (moe ? ", MoE" : ", dense"));
      auto once = zero_counts(cfg), all = zero_counts(cfg);
      for (int r = 0; r < world(L); ++r) {
        const Rank k = make_rank(cfg, L, r);
        const Ownership own = first_copy(k.reg->size(), k.replicas, L.ep, k.expert_replicas);
        const bool sends = !own.dense.empty() || !own.expert.empty();
        // The senders are among those of before (which also sent the cp replicas' copies).
        if (sends) REQUIRE(old_gather_sender(k, L));
        if (old_gather_sender(k, L) && k.c.cp == 0) REQUIRE(sends);
        for (const OwnedPiece& o : owned_pieces(*k.reg, own, true)) count(o.piece, once);
        for (const OwnedPiece& o : owned_pieces(*k.reg, own, false)) count(o.piece, all);
      }
      for (const auto& [name, counts] : once) {
        INFO(name);
        REQUIRE(std::all_of(counts.begin(), counts.end(), [](int x) { return x == 1; }));
      }
      for (const auto& [name, counts] : all) {
        INFO(name);
        REQUIRE(std::all_of(counts.begin(), counts.end(), [](int x) { return x >= 1; }));
      }
    }
  }
}

TEST_CASE("ownership names the replica that is out of range", "[parallel][ownership]") {
  OwnershipInputs in;
  in.n = 100;
  in.replicas = {2, 2};
  REQUIRE_THROWS_WITH(ownership(in), mt_test::contains("replica rank 2 of 2"));
}
