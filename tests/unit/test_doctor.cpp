// `meshtrain doctor`'s findings on runs described by hand (issue 37): the pipeline bubble and
// the micro-batch count that halves it, an unhidden dp reduction, non-finite steps and the loss
// scale, the rank a hung collective waits for, memory headroom. The CLI tests
// (tests/cli/test_doctor.sh) make real runs that show each finding.
#include <string>

#include "harness.hpp"
#include "meshtrain/app/doctor.hpp"

using namespace meshtrain;
using app::Finding;
using app::RunData;

namespace {

app::StepRecord step(std::int64_t s, double ms = 10) {
  app::StepRecord r;
  r.step = s;
  r.loss = 5.0 - 0.1 * s;
  r.step_ms = ms;
  return r;
}

RunData run(int dp, int pp, int m) {
  RunData r;
  r.world = dp * pp;
  r.ranks_per_node = r.world;
  r.layout.dp = dp;
  r.layout.pp = pp;
  r.layout.n_micro = m;
  for (int s = 1; s <= 5; ++s) r.steps.push_back(step(s));
  return r;
}

const Finding& find(const std::vector<Finding>& f, const std::string& topic) {
  for (const auto& x : f)
    if (x.topic == topic) return x;
  FAIL("no finding " << topic);
  return f.front();
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("the bubble (pp - 1) / (v m + pp - 1) and the micro-batches that halve it",
          "[doctor]") {
  REQUIRE(app::bubble_share(4, 1, 2) == mt_test::Approx(0.6));
  REQUIRE(app::micro_batches_halving_bubble(4, 1, 2) == 7);
  REQUIRE(app::bubble_share(4, 1, 7) == mt_test::Approx(0.3));
  // Every count halves it at least: b(m') <= b(m) / 2.
  for (int pp : {2, 3, 4, 8})
    for (int v : {1, 2, 4})
      for (int m : {1, 2, 3, 8, 16}) {
        const int m2 = app::micro_batches_halving_bubble(pp, v, m);
        REQUIRE(app::bubble_share(pp, v, m2) <= app::bubble_share(pp, v, m) / 2 + 1e-12);
        if (v > 1) REQUIRE(m2 % pp == 0);
      }
  RunData r = run(1, 4, 2);
  for (auto& s : r.steps) s.bubble = 0.55;
  const auto f = find(app::diagnose(r, {}), "pipeline bubble");
  REQUIRE(f.problem);
  REQUIRE(has(f.text, "60% of each stage's step at pp 4 with 2 micro-batches"));
  REQUIRE(has(f.text, "measured idle on rank 0: 55%"));
  REQUIRE(has(f.advice, "7 micro-batches (train.grad_accum 7) would halve it to 30%"));
  REQUIRE_FALSE(find(app::diagnose(run(2, 1, 4), {}), "pipeline bubble").problem);
}

TEST_CASE("an unhidden dp reduction, and why", "[doctor]") {
  RunData r = run(2, 1, 1);
  for (auto& s : r.steps) s.comm_ms = 4, s.comm_hidden = 0.02;
  r.dp_overlap = false;
  auto f = find(app::diagnose(r, {}), "communication");
  REQUIRE(f.problem);
  REQUIRE(has(f.text, "dp 2 (gradient all-reduce, ZeRO-0): 4.00 ms per step, 2% hidden"));
  REQUIRE(has(f.text, "exposed communication in all: 39% of 10.0 ms"));
  REQUIRE(has(f.advice, "communication over 30% of the step -> all-reduce inefficiency"));
  REQUIRE(has(f.advice, "dp.overlap=false"));
  r.dp_overlap = true;
  for (auto& s : r.steps) s.comm_ms = 1, s.comm_hidden = 0.8;
  f = find(app::diagnose(r, {}), "communication");
  REQUIRE_FALSE(f.problem);
  // MoE all-to-alls over ep count as exposed communication of their own group.
  r.layout.ep = 2;
  for (auto& s : r.steps) s.a2a_ms = 3;
  f = find(app::diagnose(r, {}), "communication");
  REQUIRE(has(f.text, "ep 2 (MoE all-to-all): 3.00 ms blocking = 30% of the step"));
  REQUIRE(has(f.text, "exposed communication in all: 32% of 10.0 ms"));
  REQUIRE(f.problem);
}

TEST_CASE("non-finite steps and the loss scale", "[doctor]") {
  RunData r = run(1, 1, 1);
  r.steps[3].grad_finite = false;
  r.steps[3].skipped = true;
  auto f = find(app::diagnose(r, {}), "stability");
  REQUIRE(f.problem);
  REQUIRE(has(f.text, "non-finite gradients at step 4 (update skipped)"));
  REQUIRE(has(f.advice, "not an fp16 overflow (fp32): the first non-finite step is 4"));
  r.layout.precision = plan::Precision::fp16;
  f = find(app::diagnose(r, {}), "stability");
  REQUIRE(has(f.advice, "NaN loss -> fp16 overflow -> loss scaling: train.loss_scaling on"));
  r.loss_scaling = true;
  double scale = 65536;
  for (auto& s : r.steps) {
    if (s.skipped) scale /= 2;
    s.loss_scale = scale;
  }
  f = find(app::diagnose(r, {}), "stability");
  REQUIRE(has(f.text, "loss scale 65536 -> 32768 (lowered at step 4)"));
  REQUIRE(has(f.advice, "it is on and skipped 1 update(s)"));
  REQUIRE_FALSE(find(app::diagnose(run(1, 1, 1), {}), "stability").problem);
}

TEST_CASE("the rank a hung collective waits for", "[doctor]") {
  RunData r = run(2, 1, 1);
  REQUIRE_FALSE(find(app::diagnose(r, {}), "hung collective").problem);
  app::FlightDump d0;
  d0.rank = 0;
  app::FlightComm dp;
  dp.name = "dp";
  dp.world_ranks = {0, 1};
  dp.issued = 3;
  dp.entries = {{2, "all_reduce", "completed", 64, -1}, {3, "all_reduce", "outstanding", 64, -1}};
  d0.comms.push_back(dp);
  r.flights.push_back(d0);
  auto f = find(app::diagnose(r, {}), "hung collective");
  REQUIRE(f.problem);
  REQUIRE(has(f.text, "'dp' #3 all_reduce of 64 bytes waits on rank(s) 0; not arrived: rank 1 "
                      "(no flight dump"));
  REQUIRE(has(f.advice, "the job hung on rank 1"));
  // A rank that dumped but never issued the operation is behind.
  app::FlightDump d1 = d0;
  d1.rank = 1;
  d1.comms[0].issued = 2;
  d1.comms[0].entries.pop_back();
  r.flights.push_back(d1);
  f = find(app::diagnose(r, {}), "hung collective");
  REQUIRE(has(f.text, "rank 1 (behind: its last operation on 'dp' is #2)"));
}

TEST_CASE("memory headroom per rank", "[doctor]") {
  RunData r = run(2, 1, 1);
  r.gpu = true;
  r.devices_per_node = 2;
  r.memory_capacity = 100e9;
  r.memory_per_rank = {50e9, 95e9};
  app::Prediction p;
  p.valid = true;
  p.host_memory = false;
  p.tp2_valid = true;
  p.tp2_peak = 60e9;
  p.stages.resize(1);
  p.stages[0].params = 90e9;
  const auto f = find(app::diagnose(r, p), "memory");
  REQUIRE(f.problem);
  REQUIRE(has(f.text, "least headroom 5% on rank 1"));
  REQUIRE(has(f.advice, "out of memory -> tensor-parallel split -> a larger mesh.tp: tp 2 (dp 1) "
                        "needs 55.88 GiB per rank (planner)"));
}
