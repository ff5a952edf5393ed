#include <mpi.h>

#include <numeric>

#include "factorisations.hpp"
#include "harness.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/mesh/process_mesh.hpp"

using namespace meshtrain;
using namespace meshtrain::mesh;

namespace {
int sum_over(const MpiComm& c, int v) {
  int out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_SUM, c.get());
  return out;
}
}  // namespace

TEST_CASE("sub-communicators match the rank math for every factorisation and order", "[mesh]") {
  const int world = mt_test::world_size();
  const int me = mt_test::world_rank();
  for (const Shape& s : mt_test::factorisations(world)) {
    for (const char* o : {"tp-dp-pp", "pp-dp-tp", "dp-tp-pp"}) {
      const Order order = Order::parse(o);
      ProcessMesh m(mt_test::world(), s, order);
      INFO("shape dp=" << s.dp << " pp=" << s.pp << " tp=" << s.tp << " order " << o);
      REQUIRE(m.rank() == me);
      REQUIRE(m.coord() == coord_of(me, s, order));
      for (Axis a : {Axis::tp, Axis::dp, Axis::pp}) {
        const MpiComm& c = m.along(a);
        REQUIRE(c.size() == s.size(a));
        REQUIRE(c.rank() == m.coord().at(a));
        // Members really are the ranks the pure math names: the sum of world ranks agrees.
        auto g = group_along(me, a, s, order);
        REQUIRE(sum_over(c, me) == std::accumulate(g.begin(), g.end(), 0));
      }
      auto mp = model_parallel_group(me, s, order);
      REQUIRE(m.model_parallel().size() == s.pp * s.tp);
      REQUIRE(sum_over(m.model_parallel(), me) == std::accumulate(mp.begin(), mp.end(), 0));
      auto eg = embedding_group(me, s, order);
      REQUIRE(m.embedding().is_null() == eg.empty());
      if (!eg.empty())
        REQUIRE(sum_over(m.embedding(), me) == std::accumulate(eg.begin(), eg.end(), 0));
      REQUIRE(m.is_first_stage() == (m.coord().pp == 0));
      REQUIRE(m.is_last_stage() == (m.coord().pp == s.pp - 1));
      REQUIRE(m.local_size() >= 1);
      REQUIRE(m.local_rank() < m.local_size());
    }
  }
}

TEST_CASE("a mesh that does not match the world is a ConfigError on every rank", "[mesh]") {
  const int world = mt_test::world_size();
  bool threw = false;
  try {
    ProcessMesh m(mt_test::world(), Shape{world, 2, 1});
  } catch (const ConfigError& e) {
    threw = std::string(e.what()).find("ranks") != std::string::npos;
  }
  REQUIRE(mt_test::all_ranks(threw));
  // The world is still usable afterwards: no rank is stuck in a split.
  ProcessMesh ok(mt_test::world(), Shape{world, 1, 1});
  REQUIRE(ok.dp().size() == world);
}

TEST_CASE("node-local rank and device selection", "[mesh]") {
  auto n = node_local_rank(mt_test::world());
  REQUIRE(n.rank >= 0);
  REQUIRE(n.rank < n.size);
  REQUIRE(select_device(5, 4) == 1);
  REQUIRE(select_device(3, 0) == -1);
}
