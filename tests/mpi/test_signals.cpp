// Stop signals: a SIGUSR1 or SIGTERM on one rank becomes a stop decision on every rank at the
// next step boundary (stop_requested_anywhere).
#include <csignal>

#include "harness.hpp"
#include "meshtrain/core/signals.hpp"

using namespace meshtrain;

TEST_CASE("a stop signal on one rank stops every rank", "[signals][mpi]") {
  signals::install_stop_handlers();
  signals::clear_stop_request();
  REQUIRE_FALSE(signals::stop_requested_anywhere(mt_test::world()));
  for (int sig : {SIGUSR1, SIGTERM}) {
    const int last = mt_test::world_size() - 1;
    if (mt_test::world_rank() == last) std::raise(sig);  // handled: the process goes on
    REQUIRE(signals::stop_requested() == (mt_test::world_rank() == last));
    REQUIRE(signals::stop_signal() == (mt_test::world_rank() == last ? sig : 0));
    REQUIRE(signals::stop_requested_anywhere(mt_test::world()));
    signals::clear_stop_request();
    REQUIRE_FALSE(signals::stop_requested_anywhere(mt_test::world()));
  }
  STATIC_REQUIRE(signals::kExitRequeue == 3);
}
