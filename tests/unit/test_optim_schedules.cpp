// DeepSpeed's learning-rate schedulers and loss scaler as meshtrain runs them (issue 37). The
// expected rates are DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py) evaluated in
// Python, stepped as its engine steps them: the rate of optimizer step s is the one its
// scheduler set after s calls of step() (s = 0: the constructor's).
#include <cmath>
#include <vector>

#include "harness.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/profile.hpp"
#include "meshtrain/optim/adamw.hpp"
#include "meshtrain/optim/loss_scaler.hpp"

using mt_test::Approx;

using namespace meshtrain;
using optim::AdamWConfig;
using optim::LrSchedule;
using optim::WarmupType;

namespace {
void check_rates(const AdamWConfig& c, const std::vector<double>& want) {
  for (std::size_t s = 0; s < want.size(); ++s) {
    INFO("step " << s);
    REQUIRE(optim::lr_at(c, static_cast<std::int64_t>(s)) ==
            Approx(want[s]).epsilon(1e-6).margin(1e-12));
  }
}
}  // namespace

TEST_CASE("WarmupLR: log and linear warmup, then the peak", "[optim][deepspeed]") {
  AdamWConfig c;
  c.schedule = LrSchedule::ds_warmup;
  c.lr = 1e-3f;
  c.warmup_min_lr = 1e-5f;
  c.warmup_steps = 5;
  c.warmup_type = WarmupType::log;
  check_rates(c, {1e-05, 1e-05, 0.00043636979249265915, 0.0006857801325411255,
                  0.0008627395849853183, 0.001, 0.001, 0.001});
  c.warmup_min_lr = 0;
  c.warmup_steps = 4;
  c.warmup_type = WarmupType::linear;
  check_rates(c, {0.0, 0.0, 0.00025, 0.0005, 0.00075, 0.001, 0.001});
  c.warmup_steps = 0;  // DeepSpeed warms up over at least two iterations
  check_rates(c, {0.0, 0.0, 0.0005, 0.001});
}

TEST_CASE("WarmupDecayLR: warmup, then linear to warmup_min_lr at total_num_steps",
          "[optim][deepspeed]") {
  AdamWConfig c;
  c.schedule = LrSchedule::ds_warmup_decay;
  c.lr = 1e-3f;
  c.warmup_min_lr = 1e-5f;
  c.warmup_steps = 3;
  c.decay_steps = 10;
  c.warmup_type = WarmupType::linear;
  check_rates(c, {1e-05, 1e-05, 0.00034, 0.00067, 0.001, 0.0008585714285714286,
                  0.0007171428571428572, 0.0005757142857142857, 0.0004342857142857143,
                  0.0002928571428571429, 0.00015142857142857143, 1e-05});
}

TEST_CASE("WarmupCosineLR: ratios of lr, zero at the first step", "[optim][deepspeed]") {
  AdamWConfig c;
  c.schedule = LrSchedule::ds_warmup_cosine;
  c.lr = 1e-3f;
  c.warmup_min_lr = 0.1f * 1e-3f;  // warmup_min_ratio 0.1
  c.min_lr = 0.01f * 1e-3f;        // cos_min_ratio 0.01
  c.warmup_steps = 3;
  c.decay_steps = 10;
  c.warmup_type = WarmupType::log;
  check_rates(c, {0.0, 0.0001, 0.0006678367782143117, 0.001, 0.0009509795896116974,
                  0.0008136274519200731, 0.0006151478623083756, 0.00039485213769162444,
                  0.00019637254807992693, 5.902041038830258e-05, 1e-05,
                  5.9020410388302525e-05});  // past total_num_steps DeepSpeed's cosine rises
}

TEST_CASE("constant and meshtrain's cosine", "[optim]") {
  AdamWConfig c;
  c.schedule = LrSchedule::constant;
  c.lr = 6e-5f;
  c.warmup_steps = 10;
  check_rates(c, {6e-5, 6e-5, 6e-5});
  REQUIRE(optim::parse_lr_schedule("ds_warmup_cosine") == LrSchedule::ds_warmup_cosine);
  REQUIRE_THROWS_AS(optim::parse_lr_schedule("OneCycle"), ConfigError);
  REQUIRE_THROWS_AS(optim::parse_warmup_type("exp"), ConfigError);
}

TEST_CASE("loss scaler: DeepSpeed's hysteresis and a static scale", "[optim][deepspeed]") {
  // hysteresis 2: the first overflow uses it up, the second halves; doubling refills it.
  optim::LossScalerConfig c;
  c.initial = 1024;
  c.window = 3;
  c.hysteresis = 2;
  optim::DynamicLossScaler s(c);
  s.update(false);
  REQUIRE(s.scale() == 1024);
  REQUIRE(s.hysteresis() == 1);
  s.update(false);
  REQUIRE(s.scale() == 512);
  s.update(false);  // hysteresis stays spent until the scale doubles
  REQUIRE(s.scale() == 256);
  for (int i = 0; i < 3; ++i) s.update(true);
  REQUIRE(s.scale() == 512);
  REQUIRE(s.hysteresis() == 2);
  s.update(false);
  REQUIRE(s.scale() == 512);
  REQUIRE(s.skipped() == 4);
  // consecutive hysteresis: every good step refills it
  c.consecutive_hysteresis = true;
  optim::DynamicLossScaler k(c);
  k.update(false);
  k.update(true);
  k.update(false);
  REQUIRE(k.scale() == 1024);
  // the floor
  c = {};
  c.initial = 4;
  c.min_scale = 2;
  optim::DynamicLossScaler f(c);
  f.update(false);
  f.update(false);
  REQUIRE(f.scale() == 2);
  // static: the scale never moves, overflowing steps are still counted as skipped
  c = {};
  c.initial = 128;
  c.window = 1;
  c.dynamic = false;
  optim::DynamicLossScaler st(c);
  st.update(true);
  st.update(false);
  REQUIRE(st.scale() == 128);
  REQUIRE(st.skipped() == 1);
}

TEST_CASE("profile.steps parses A:B", "[profile]") {
  REQUIRE(prof::parse_step_range("", "profile.steps").empty());
  const auto r = prof::parse_step_range("3:5", "profile.steps");
  REQUIRE(r.first == 3);
  REQUIRE(r.last == 5);
  REQUIRE(r.contains(4));
  REQUIRE_FALSE(r.contains(6));
  REQUIRE(prof::parse_step_range("7", "profile.steps").last == 7);
  for (const char* bad : {"5:3", "0:2", "a:b", "3:", ":4", "1:2:3"})
    REQUIRE_THROWS_WITH(prof::parse_step_range(bad, "profile.steps"),
                        mt_test::contains("profile.steps='"));
  REQUIRE(prof::bytes_label(512) == "512 B");
  REQUIRE(prof::bytes_label(3 << 20) == "3.0 MiB");
}
