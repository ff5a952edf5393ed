// The divergence policy and the metrics writer, without MPI (issue 17).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "harness.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/train/divergence.hpp"
#include "meshtrain/train/metrics_writer.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;
using namespace meshtrain::train;

namespace {
const StepHealth kGood{true, true}, kNanLoss{false, false}, kNanGrads{true, false};
}

TEST_CASE("stop: the first non-finite step ends the run, naming it", "[divergence]") {
  DivergenceGuard g({OnNonFinite::stop, 3, 50}, false);
  REQUIRE(g.on_step(0, kGood) == DivergenceAction::proceed);
  REQUIRE(g.on_step(1, kNanGrads) == DivergenceAction::stop);
  REQUIRE(g.reason().find("non-finite gradients at step 2") != std::string::npos);
  REQUIRE(g.on_step(2, kNanLoss) == DivergenceAction::stop);
  REQUIRE(g.reason().find("non-finite loss and gradients at step 3") != std::string::npos);
}

TEST_CASE("skip: consecutive skips are capped, a good step resets the count", "[divergence]") {
  DivergenceGuard g({OnNonFinite::skip, 3, 3}, false);
  REQUIRE(g.on_step(0, kNanGrads) == DivergenceAction::skip);
  REQUIRE(g.on_step(1, kNanGrads) == DivergenceAction::skip);
  REQUIRE(g.on_step(2, kGood) == DivergenceAction::proceed);
  REQUIRE(g.consecutive_skips() == 0);
  REQUIRE(g.on_step(3, kNanLoss) == DivergenceAction::skip);
  REQUIRE(g.on_step(4, kNanLoss) == DivergenceAction::skip);
  REQUIRE(g.on_step(5, kNanLoss) == DivergenceAction::stop);
  REQUIRE(g.reason().find("3 consecutive steps without an update") != std::string::npos);
}

TEST_CASE("rollback: at most max_rollbacks times, then stop", "[divergence]") {
  DivergenceGuard g({OnNonFinite::rollback, 2, 50}, false);
  REQUIRE(g.on_step(4, kNanGrads) == DivergenceAction::rollback);
  REQUIRE(g.on_step(4, kGood) == DivergenceAction::proceed);
  REQUIRE(g.on_step(6, kNanLoss) == DivergenceAction::rollback);
  REQUIRE(g.rollbacks() == 2);
  REQUIRE(g.on_step(7, kNanGrads) == DivergenceAction::stop);
  REQUIRE(g.reason().find("after 2 rollback(s)") != std::string::npos);
}

TEST_CASE("loss scaling owns overflowing gradients while the loss is finite", "[divergence]") {
  DivergenceGuard g({OnNonFinite::stop, 3, 4}, true);
  for (int s = 0; s < 3; ++s) REQUIRE(g.on_step(s, kNanGrads) == DivergenceAction::skip);
  REQUIRE(g.on_step(3, kNanGrads) == DivergenceAction::stop);  // the 4th in a row
  REQUIRE(g.reason().find("under loss scaling") != std::string::npos);
  DivergenceGuard h({OnNonFinite::stop, 3, 4}, true);
  REQUIRE(h.on_step(0, kNanGrads) == DivergenceAction::skip);
  REQUIRE(h.on_step(1, kGood) == DivergenceAction::proceed);
  REQUIRE(h.on_step(2, kNanGrads) == DivergenceAction::skip);  // the count restarted
  REQUIRE(h.on_step(3, kNanLoss) == DivergenceAction::stop);   // a non-finite loss is not its
}

TEST_CASE("the data batch of a step leaves the skipped batches out", "[divergence]") {
  REQUIRE(batch_of_step(5, {}) == 5);
  const std::vector<std::int64_t> skipped{3, 4, 9};
  std::vector<std::int64_t> seen;
  for (std::int64_t s = 0; s < 10; ++s) seen.push_back(batch_of_step(s, skipped));
  REQUIRE(seen == std::vector<std::int64_t>{0, 1, 2, 5, 6, 7, 8, 10, 11, 12});
  REQUIRE(parse_batches(format_batches(skipped)) == skipped);
  REQUIRE(parse_batches("9,3,3,4") == skipped);
  REQUIRE_THROWS_AS(parse_batches("3,x"), ConfigError);
  REQUIRE(parse_on_nonfinite("rollback") == OnNonFinite::rollback);
  REQUIRE_THROWS_AS(parse_on_nonfinite("retry"), ConfigError);
}

TEST_CASE("metrics lines are valid JSON: non-finite values are null and flagged", "[metrics]") {
  const std::string path = "test_divergence_metrics_" + std::to_string(mt_test::world_rank()) + ".jsonl";
  {
    MetricsWriter w;
    w.open(path, true, false);
    StepMetrics m;
    m.step = 1;
    m.loss = NAN;
    m.grad_norm = INFINITY;
    m.lr = 1e-3f;
    w.write(step_record(m, 2, 64));
    w.write({{"step", 2}, {"val_loss", std::nan("")}});
    MetricsWriter other;  // not the writer rank: writes nothing
    other.open(path, false, false);
    other.write({{"step", 3}});
  }
  std::ifstream in(path);
  std::string a, b, c;
  std::getline(in, a);
  std::getline(in, b);
  REQUIRE_FALSE(std::getline(in, c));
  const auto ja = nlohmann::json::parse(a), jb = nlohmann::json::parse(b);
  REQUIRE(ja["loss"].is_null());
  REQUIRE(ja["grad_norm"].is_null());
  REQUIRE(ja["nonfinite"] == nlohmann::json({"loss", "grad_norm"}));
  REQUIRE(ja["lr"].get<double>() == 0.001);  // the float's shortest form
  REQUIRE(a.rfind("{\"step\": 2, \"loss\": null, ", 0) == 0);  // the earlier line format
  REQUIRE(jb["val_loss"].is_null());
  std::remove(path.c_str());
  MetricsWriter bad;
  REQUIRE_THROWS_AS(bad.open("no/such/folder/m.jsonl", true, false), ConfigError);
}
