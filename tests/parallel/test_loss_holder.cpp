// The loss-holder rule (parallel::holds_loss): over every rank of a mesh, the ranks whose loss
// sums are added hold each sequence's loss exactly once. Pure: every rank is simulated, no MPI.
#include "harness.hpp"
#include "meshtrain/mesh/rank_math.hpp"
#include "meshtrain/parallel/loss_holder.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

TEST_CASE("the loss is held once per sequence and row", "[loss_holder]") {
  for (int dp : {1, 2, 4})
    for (int pp : {1, 2, 3})
      for (int tp : {1, 2})
        for (int cp : {1, 2}) {
          int train = 0, eval = 0;
          for (int d = 0; d < dp; ++d)
            for (int p = 0; p < pp; ++p)
              for (int t = 0; t < tp; ++t)
                for (int c = 0; c < cp; ++c) {
                  mesh::Coord x;
                  x.dp = d, x.pp = p, x.tp = t, x.cp = c;
                  const bool tr = holds_loss(x, pp, LossBatches::per_dp_rank);
                  const bool ev = holds_loss(x, pp, LossBatches::same_on_dp);
                  INFO("dp " << dp << " pp " << pp << " tp " << tp << " cp " << cp);
                  // only the last stage's tp rank 0 computes a loss that counts
                  if (p != pp - 1 || t != 0) REQUIRE(!tr);
                  if (!tr) REQUIRE(!ev);
                  train += tr;
                  eval += ev;
                }
          // training: every dp rank's sequences and every cp rank's rows; evaluation: dp rank 0's
          REQUIRE(train == dp * cp);
          REQUIRE(eval == cp);
        }
}
