// Agreement before failure (core/agree.hpp) and the flight recorder (comm/flight_recorder.hpp).
#include <string>

#include "harness.hpp"
#include "meshtrain/comm/flight_recorder.hpp"
#include "meshtrain/comm/mpi_communicator.hpp"
#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/view.hpp"

using namespace meshtrain;

TEST_CASE("an error on one rank is thrown on every rank, naming that rank", "[agree][mpi]") {
  const int rank = mt_test::world_rank(), size = mt_test::world_size(), last = size - 1;
  REQUIRE_NOTHROW(agree(mt_test::world(), "check", [] {}));
  try {
    agree(mt_test::world(), "check", [&] {
      MESHTRAIN_CONFIG_CHECK(rank != last, "file 'x.bin' cannot be opened");
    });
    FAIL("no rank threw");
  } catch (const ConfigError& e) {
    REQUIRE(is_agreed(e));
    const std::string w = e.what();
    REQUIRE(w.find("check: file 'x.bin' cannot be opened") != std::string::npos);
    if (size > 1) REQUIRE(w.find(cat("(rank ", last, " of ", size, ")")) != std::string::npos);
  }
  // A plain error on every rank: Agreed<Error>, rank 0's message, no rank named.
  try {
    agree(mt_test::world(), "", [&] { throw Error(cat("boom on ", rank)); });
    FAIL("no rank threw");
  } catch (const ConfigError&) {
    FAIL("a plain error became a ConfigError");
  } catch (const Error& e) {
    REQUIRE(is_agreed(e));
    REQUIRE(std::string(e.what()) == "boom on 0");
  }
  REQUIRE(any_rank(mt_test::world(), rank == last));
  REQUIRE_FALSE(any_rank(mt_test::world(), false));
}

TEST_CASE("the flight recorder keeps the last operations and the outstanding one", "[flight][mpi]") {
  comm::set_flight_recording(true);
  comm::FlightRecorder r(mt_test::world(), "test", 4);
  REQUIRE(r.world_ranks().size() == static_cast<std::size_t>(mt_test::world_size()));
  for (int i = 0; i < 6; ++i) r.complete(r.begin(comm::OpKind::all_reduce, 8, -1));
  const std::uint64_t open = r.begin(comm::OpKind::broadcast, 16, 0);
  REQUIRE(open == 7);
  comm::FlightEntry e;
  REQUIRE(r.oldest_outstanding(e));
  REQUIRE(e.seq == 7);
  REQUIRE(e.op == comm::OpKind::broadcast);
  const auto all = r.entries();
  REQUIRE(all.size() == 4);  // the ring's capacity
  REQUIRE(all.front().seq == 4);
  r.complete(open);
  REQUIRE_FALSE(r.oldest_outstanding(e));
  // A skipped operation takes no sequence number; a stalled one is not tested here (SIGSTOP).
  comm::set_collective_fault({comm::CollectiveFault::skip, mt_test::world_rank(), "test", 8});
  bool skip = false;
  REQUIRE(r.begin(comm::OpKind::all_reduce, 8, -1, &skip) == 0);
  REQUIRE(skip);
  skip = false;
  REQUIRE(r.begin(comm::OpKind::all_reduce, 8, -1, &skip) == 8);  // once only
  REQUIRE_FALSE(skip);
  comm::set_flight_recording(false);
  REQUIRE(r.begin(comm::OpKind::all_reduce, 8, -1) == 0);
  comm::set_flight_recording(true);
}

TEST_CASE("the MPI backend records every operation it issues", "[flight][mpi]") {
  comm::MpiCommunicator c(mt_test::world());
  const std::uint64_t before = c.recorder().issued();
  HostView1<float> v("v", 4);
  c.all_reduce(v);
  c.barrier();
  REQUIRE(c.recorder().issued() == before + 2);
  for (const auto& e : c.recorder().entries()) REQUIRE(e.completed);
}

TEST_CASE("broadcast_string from any root", "[mpi][agree]") {
  const MPI_Comm w = mt_test::world();
  const int rank = mt_test::world_rank(), size = mt_test::world_size();
  std::string s = rank == 0 ? std::string(100000, 'x') + "end" : "mine";
  broadcast_string(w, s);
  REQUIRE(mt_test::all_ranks(s == std::string(100000, 'x') + "end"));
  std::string t = rank == size - 1 ? "" : "not empty";
  broadcast_string(w, t, size - 1);
  REQUIRE(mt_test::all_ranks(t.empty()));
}
