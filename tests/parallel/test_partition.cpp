// Pipeline partitioning: the balanced split is optimal (brute force on small cases), the
// explicit split parses and rejects bad input with the option's name.
#include <algorithm>
#include <functional>

#include "harness.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/parallel/partition.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

namespace {
std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

using Ranges = std::vector<std::pair<int, int>>;
Ranges ranges(const std::vector<LayerRange>& p) {
  Ranges out;
  for (const LayerRange& r : p) out.emplace_back(r.first, r.last);
  return out;
}

std::vector<int> sizes(const std::vector<LayerRange>& p) {
  std::vector<int> out;
  for (const LayerRange& r : p) out.push_back(blocks(r));
  return out;
}

// Smallest maximum piece cost over every composition of n_layer into n_pieces positive parts.
double brute_force_min_max(int n_layer, int n_pieces, const PieceCostModel& c) {
  double best = 1e300;
  std::vector<int> parts(static_cast<std::size_t>(n_pieces), 1);
  std::function<void(int, int)> rec = [&](int k, int left) {
    if (k == n_pieces - 1) {
      parts[static_cast<std::size_t>(k)] = left;
      std::vector<LayerRange> p;
      int first = 0;
      for (int n : parts) p.push_back({first, first += n});
      const auto costs = piece_costs(p, c);
      best = std::min(best, *std::max_element(costs.begin(), costs.end()));
      return;
    }
    for (int n = 1; n <= left - (n_pieces - 1 - k); ++n) {
      parts[static_cast<std::size_t>(k)] = n;
      rec(k + 1, left - n);
    }
  };
  rec(0, n_layer);
  return best;
}
}  // namespace

TEST_CASE("cost model: blocks from FLOPs, embedding on the first piece, head on the last",
          "[parallel][partition]") {
  model::GptConfig g = model::preset("gpt2-124m");
  const PieceCostModel c = cost_model(g, 1024);
  REQUIRE(c.block == 24.0 * 768 * 768 + 4.0 * 1024 * 768);
  REQUIRE(c.head == 2.0 * 768 * 50304);
  REQUIRE(c.embedding < 0.01 * c.block);
  const auto costs = piece_costs({{0, 6}, {6, 12}}, c);
  REQUIRE(costs[0] == mt_test::Approx(6 * c.block + c.embedding));
  REQUIRE(costs[1] == mt_test::Approx(6 * c.block + c.head));
}

TEST_CASE("balanced partition", "[parallel][partition]") {
  SECTION("equal blocks split evenly") {
    const PieceCostModel c{1.0, 0.0, 0.0};
    REQUIRE(sizes(balanced_partition(12, 4, c)) == std::vector<int>{3, 3, 3, 3});
    REQUIRE(sizes(balanced_partition(8, 8, c)) == std::vector<int>(8, 1));
    REQUIRE(sizes(balanced_partition(5, 1, c)) == std::vector<int>{5});
    const auto p = balanced_partition(7, 3, c);
    REQUIRE(p.front().first == 0);
    REQUIRE(p.back().last == 7);
    for (std::size_t k = 1; k < p.size(); ++k) REQUIRE(p[k].first == p[k - 1].last);
    const auto n = sizes(p);
    REQUIRE(*std::max_element(n.begin(), n.end()) == 3);
  }
  SECTION("the LM head takes blocks off the last stage (GPT-2 124M, pp = 4)") {
    const PieceCostModel c = cost_model(model::preset("gpt2-124m"), 1024);  // head ~ 4.5 blocks
    REQUIRE(sizes(balanced_partition(12, 4, c)) == std::vector<int>{3, 4, 4, 1});
    REQUIRE(sizes(balanced_partition(12, 2, c)) == std::vector<int>{8, 4});
  }
  SECTION("the most expensive piece is as cheap as possible (brute force)") {
    const PieceCostModel models[] = {{1.0, 0.0, 0.0}, {1.0, 0.3, 2.5}, {2.0, 5.0, 0.1},
                                     {1.0, 0.01, 7.0}};
    for (const PieceCostModel& c : models)
      for (int L = 1; L <= 10; ++L)
        for (int P = 1; P <= L; ++P) {
          INFO("L=" << L << " P=" << P << " head=" << c.head);
          const auto p = balanced_partition(L, P, c);
          REQUIRE(static_cast<int>(p.size()) == P);
          int first = 0;
          for (const LayerRange& r : p) {
            REQUIRE(r.first == first);
            REQUIRE(blocks(r) >= 1);
            first = r.last;
          }
          REQUIRE(first == L);
          const auto costs = piece_costs(p, c);
          REQUIRE(*std::max_element(costs.begin(), costs.end()) ==
                  mt_test::Approx(brute_force_min_max(L, P, c)));
        }
  }
  SECTION("more pieces than blocks") {
    const std::string msg = config_error([] { balanced_partition(3, 4, {1.0, 0.0, 0.0}); });
    REQUIRE(msg.find("n_layer=3") != std::string::npos);
  }
}

TEST_CASE("explicit split --pp.layers", "[parallel][partition]") {
  REQUIRE(ranges(parse_layer_split("4,4,3,1", 12, 4)) ==
          Ranges{{0, 4}, {4, 8}, {8, 11}, {11, 12}});
  REQUIRE(ranges(parse_layer_split(" 2, 2 ", 4, 2)) == Ranges{{0, 2}, {2, 4}});
  auto err = [](const char* text, int n_layer, int n_pieces) {
    return config_error([&] { parse_layer_split(text, n_layer, n_pieces); });
  };
  for (const std::string& msg : {err("4,4,3", 12, 4), err("4,4,4,1", 12, 4), err("4,0,4,4", 12, 4),
                                 err("4,x,3,1", 12, 4), err("", 12, 4), err("4,,4,4", 12, 4),
                                 err("4,4,3,1.5", 12, 4), err("-1,13", 12, 2)}) {
    INFO(msg);
    REQUIRE(msg.find("pp.layers") != std::string::npos);
  }
  REQUIRE(err("4,4,3", 12, 4).find("3 block counts for 4") != std::string::npos);
  REQUIRE(err("4,4,4,1", 12, 4).find("sum to 13") != std::string::npos);
}

TEST_CASE("partition() validates the spec and picks the split; stage_chunks",
          "[parallel][partition]") {
  model::GptConfig g;
  g.n_layer = 8;
  g.n_embd = 32;
  g.n_head = 4;
  g.vocab_size = 64;
  const ScheduleSpec inter{ScheduleKind::interleaved, 2, 4, 2};
  const auto pieces = partition(inter, g, 16, "2,2,2,2");
  REQUIRE(ranges(stage_chunks(pieces, 2, 0)) == Ranges{{0, 2}, {4, 6}});
  REQUIRE(ranges(stage_chunks(pieces, 2, 1)) == Ranges{{2, 4}, {6, 8}});
  REQUIRE(to_string(pieces) == "[0,2) [2,4) [4,6) [6,8)");
  REQUIRE(partition({ScheduleKind::one_f_one_b, 3, 3, 1}, g, 16).size() == 3);
  // Interleaved without an explicit split: equal virtual stages, as Megatron.
  REQUIRE(to_string(partition(inter, g, 16)) == "[0,2) [2,4) [4,6) [6,8)");
  g.n_layer = 10;
  REQUIRE(config_error([&] { partition(inter, g, 16); }).find("not divisible") !=
          std::string::npos);
  g.n_layer = 3;
  REQUIRE(config_error([&] { partition({ScheduleKind::gpipe, 4, 4, 1}, g, 16); })
              .find("model.n_layer=3") != std::string::npos);
}
