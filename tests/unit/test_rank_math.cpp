#include <algorithm>
#include <set>

#include "harness.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/mesh/rank_math.hpp"

using namespace meshtrain;
using namespace meshtrain::mesh;

namespace {
std::vector<Shape> shapes_up_to(int max_world) {
  std::vector<Shape> out;
  for (int dp = 1; dp <= max_world; ++dp)
    for (int pp = 1; dp * pp <= max_world; ++pp)
      for (int tp = 1; dp * pp * tp <= max_world; ++tp) out.push_back(Shape{dp, pp, tp});
  return out;
}
const char* kOrders[] = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};
}  // namespace

TEST_CASE("rank <-> coordinate is a bijection for every shape and order", "[mesh]") {
  for (const Shape& s : shapes_up_to(12)) {
    for (const char* o : kOrders) {
      const Order order = Order::parse(o);
      std::set<int> seen;
      for (int r = 0; r < s.world(); ++r) {
        const Coord c = coord_of(r, s, order);
        REQUIRE(c.dp >= 0);
        REQUIRE(c.dp < s.dp);
        REQUIRE(c.pp < s.pp);
        REQUIRE(c.tp < s.tp);
        REQUIRE(rank_of(c, s, order) == r);
        seen.insert(c.dp * 10000 + c.pp * 100 + c.tp);
      }
      REQUIRE(seen.size() == static_cast<std::size_t>(s.world()));
    }
  }
}

TEST_CASE("default order tp-dp-pp puts tensor-parallel peers on neighbouring ranks", "[mesh]") {
  const Shape s{2, 2, 2};  // world 8
  const Order o;
  REQUIRE(o.str() == "tp-dp-pp");
  // rank = tp + 2*dp + 4*pp
  REQUIRE(coord_of(0, s, o) == Coord{0, 0, 0});
  REQUIRE(coord_of(1, s, o) == Coord{0, 0, 1});
  REQUIRE(coord_of(2, s, o) == Coord{1, 0, 0});
  REQUIRE(coord_of(5, s, o) == Coord{0, 1, 1});
  REQUIRE(group_along(5, Axis::tp, s, o) == std::vector<int>{4, 5});
  REQUIRE(group_along(5, Axis::dp, s, o) == std::vector<int>{5, 7});
  REQUIRE(group_along(5, Axis::pp, s, o) == std::vector<int>{1, 5});
  REQUIRE(model_parallel_group(5, s, o) == std::vector<int>{0, 1, 4, 5});
  REQUIRE(embedding_group(5, s, o) == std::vector<int>{1, 5});
}

TEST_CASE("groups along each axis partition the world", "[mesh]") {
  for (const Shape& s : shapes_up_to(12)) {
    for (const char* o : kOrders) {
      const Order order = Order::parse(o);
      for (Axis a : {Axis::tp, Axis::dp, Axis::pp}) {
        std::set<int> colors;
        for (int r = 0; r < s.world(); ++r) {
          auto g = group_along(r, a, s, order);
          REQUIRE(static_cast<int>(g.size()) == s.size(a));
          REQUIRE(std::find(g.begin(), g.end(), r) != g.end());
          // position in the group == coordinate along the axis
          REQUIRE(g[coord_of(r, s, order).at(a)] == r);
          for (int q : g) REQUIRE(group_index(q, a, s, order) == group_index(r, a, s, order));
          colors.insert(group_index(r, a, s, order));
        }
        REQUIRE(static_cast<long>(colors.size()) == s.world() / s.size(a));
      }
    }
  }
}

TEST_CASE("model-parallel and embedding groups", "[mesh]") {
  for (const Shape& s : shapes_up_to(16)) {
    const Order order;
    for (int r = 0; r < s.world(); ++r) {
      const Coord c = coord_of(r, s, order);
      auto mp = model_parallel_group(r, s, order);
      REQUIRE(static_cast<int>(mp.size()) == s.pp * s.tp);
      for (int q : mp) REQUIRE(coord_of(q, s, order).dp == c.dp);
      auto eg = embedding_group(r, s, order);
      const bool edge = c.pp == 0 || c.pp == s.pp - 1;
      REQUIRE(eg.empty() == !edge);
      if (edge) {
        REQUIRE(eg.size() == (s.pp > 1 ? 2u : 1u));
        REQUIRE(std::find(eg.begin(), eg.end(), r) != eg.end());
        for (int q : eg) {
          REQUIRE(coord_of(q, s, order).tp == c.tp);
          REQUIRE(coord_of(q, s, order).dp == c.dp);
        }
      }
    }
  }
}

TEST_CASE("bad orders and sizes are configuration errors that name the option", "[mesh]") {
  for (const char* bad : {"tp-dp", "tp-dp-dp", "tp-dp-xx", "", "tp-dp-pp-ep", "TP-DP-PP"}) {
    try {
      Order::parse(bad);
      FAIL("accepted bad order '" << bad << "'");
    } catch (const ConfigError& e) {
      REQUIRE(std::string(e.what()).find("mesh.order") != std::string::npos);
    }
  }
  REQUIRE_THROWS_AS(validate(Shape{2, 2, 2}, 6), ConfigError);
  REQUIRE_THROWS_AS(validate(Shape{0, 1, 1}, 0), ConfigError);
  REQUIRE_THROWS_AS(validate(Shape{-1, -1, 1}, 1), ConfigError);
  try {
    validate(Shape{2, 1, 2}, 6);
    FAIL("accepted 2x1x2 on 6 ranks");
  } catch (const ConfigError& e) {
    const std::string w = e.what();
    REQUIRE(w.find("= 4") != std::string::npos);
    REQUIRE(w.find("6 ranks") != std::string::npos);
  }
  REQUIRE_NOTHROW(validate(Shape{3, 1, 2}, 6));
}
