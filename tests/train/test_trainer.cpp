// Trainer, schedule, initialisation, generation and HuggingFace round trip on tiny models.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "harness.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/io/dataset.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/train/generate.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;

namespace {

model::GptConfig tiny() {
  model::GptConfig c;
  c.name = "tiny";
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.vocab_size = 11;
  c.vocab_pad = 8;
  c.block_size = 16;
  return c;
}

// A learnable corpus: a repeating sentence over an 11-token alphabet.
std::string make_shard(const std::string& tag) {
  const std::string dir = "test_trainer_" + tag + "_" + std::to_string(mt_test::world_rank());
  std::filesystem::create_directories(dir);
  std::vector<std::uint16_t> t;
  const int pattern[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 3, 5, 7, 9};
  for (int i = 0; i < 6000; ++i) t.push_back(static_cast<std::uint16_t>(pattern[i % 15]));
  io::write_shard(dir + "/data_000000.bin", t);
  return dir + "/data_*.bin";
}

train::TrainConfig base_config(int micro_batch, int accum, int steps) {
  train::TrainConfig tc;
  tc.micro_batch = micro_batch;
  tc.grad_accum = accum;
  tc.seq_len = 16;
  tc.steps = steps;
  tc.seed = 7;
  tc.eval_every = 0;
  tc.log_every = 0;
  tc.adamw.lr = 1e-2f;
  tc.adamw.min_lr = 1e-3f;
  tc.adamw.warmup_steps = 2;
  tc.adamw.decay_steps = steps;
  return tc;
}

std::vector<float> losses_of(int micro_batch, int accum, int steps, const std::string& data) {
  io::TokenDataset ds(data, 16);
  const auto tc = base_config(micro_batch, accum, steps);
  parallel::Engine<float> e(MPI_COMM_SELF, tiny(), train::engine_options(tc));
  e.init_parameters(3);
  train::Trainer t(e, tc, ds, nullptr);
  std::vector<float> out;
  for (int s = 0; s < steps; ++s) out.push_back(t.step(s, true).loss);
  return out;
}

}  // namespace

TEST_CASE("learning-rate schedule: warmup, cosine, floor", "[train]") {
  optim::AdamWConfig c;
  c.lr = 1.0f;
  c.min_lr = 0.1f;
  c.warmup_steps = 4;
  c.decay_steps = 14;
  REQUIRE(optim::lr_at(c, 0) == mt_test::Approx(0.25));
  REQUIRE(optim::lr_at(c, 3) == mt_test::Approx(1.0));
  REQUIRE(optim::lr_at(c, 4) == mt_test::Approx(1.0));
  REQUIRE(optim::lr_at(c, 9) == mt_test::Approx(0.55));  // halfway: (1 + 0.1) / 2
  REQUIRE(optim::lr_at(c, 14) == mt_test::Approx(0.1));
  REQUIRE(optim::lr_at(c, 100) == mt_test::Approx(0.1));
  c.decay_steps = 0;
  REQUIRE(optim::lr_at(c, 50) == mt_test::Approx(1.0));
}

TEST_CASE("initialisation is GPT-2's scheme drawn from the counter-based RNG", "[train][init]") {
  const auto cfg = tiny();
  model::Gpt a(cfg, 1, 16), b(cfg, 1, 16), c(cfg, 1, 16);
  a.init_parameters(11);
  b.init_parameters(11);
  c.init_parameters(12);
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, a.params());
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, b.params());
  auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, c.params());
  bool same = true, differs = false;
  for (std::size_t i = 0; i < ha.extent(0); ++i) {
    same = same && ha(i) == hb(i);
    differs = differs || ha(i) != hc(i);
  }
  REQUIRE(same);
  REQUIRE(differs);
  for (const auto& p : a.registry().params()) {
    const float* v = ha.data() + p.offset;
    const bool bias = p.name.find(".bias") != std::string::npos;
    const bool ln = p.name.find(".ln_") != std::string::npos;
    const double sd = p.name.find("c_proj.weight") != std::string::npos
                          ? 0.02 / std::sqrt(2.0 * cfg.n_layer)
                          : 0.02;
    for (std::size_t i = 0; i < p.numel; ++i) {
      double want;
      if (bias) want = 0;
      else if (ln) want = 1;
      else if (p.name == "transformer.wte.weight" && i / cfg.n_embd >= std::size_t(cfg.vocab_size))
        want = 0;  // padding rows
      else want = sd * rng::normal(11, rng::name_stream(p.name), i);  // global index == local (tp 1)
      INFO(p.name << "[" << i << "]");
      REQUIRE(v[i] == mt_test::Approx(want).margin(1e-7));
    }
  }
}

TEST_CASE("training reduces the loss on a learnable corpus", "[train]") {
  const auto losses = losses_of(4, 1, 40, make_shard("learn"));
  INFO("first loss " << losses.front() << ", last " << losses.back());
  REQUIRE(losses.front() > 2.0f);          // about log(11) at the start
  REQUIRE(losses.back() < 0.5f * losses.front());
}

TEST_CASE("gradient accumulation equals the larger micro-batch (exact averaging)", "[train]") {
  const std::string data = make_shard("accum");
  const auto one = losses_of(8, 1, 6, data);
  const auto four = losses_of(2, 4, 6, data);
  for (std::size_t s = 0; s < one.size(); ++s) {
    INFO("step " << s << ": " << one[s] << " vs " << four[s]);
    REQUIRE(four[s] == mt_test::Approx(one[s]).epsilon(1e-5));
  }
}

TEST_CASE("HuggingFace export and import round-trip every parameter", "[train][hf]") {
  const auto cfg = tiny();
  model::Gpt a(cfg, 1, 16);
  a.init_parameters(5);
  const std::string dir = "test_trainer_hf_" + std::to_string(mt_test::world_rank());
  io::export_hf(a, dir, "byte");
  const auto back = io::read_hf_config(dir, cfg.vocab_pad);
  REQUIRE(back.n_layer == cfg.n_layer);
  REQUIRE(back.n_head == cfg.n_head);
  REQUIRE(back.n_embd == cfg.n_embd);
  REQUIRE(back.vocab_size == cfg.vocab_size);
  REQUIRE(back.block_size == cfg.block_size);
  REQUIRE(io::read_hf_tokenizer(dir) == "byte");
  model::Gpt b(back, 1, 16);
  io::import_hf(b, dir);
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, a.params());
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, b.params());
  for (std::size_t i = 0; i < ha.extent(0); ++i) REQUIRE(ha(i) == hb(i));
  // A model of another shape is a clear error naming the tensor.
  auto other = cfg;
  other.n_embd = 32;
  model::Gpt c(other, 1, 16);
  try {
    io::import_hf(c, dir);
    FAIL("shape mismatch accepted");
  } catch (const ConfigError& e) {
    REQUIRE(std::string(e.what()).find("transformer.wte.weight") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("sampling: greedy, top-k and reproducible draws", "[train][generate]") {
  const float logits[] = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
  REQUIRE(train::sample_index(logits, 5, 0.0f, 0, 0.5) == 1);
  for (double u : {1e-9, 0.3, 0.7, 1.0}) {
    REQUIRE(train::sample_index(logits, 5, 1.0f, 1, u) == 1);  // top-1 is greedy
    const int two = train::sample_index(logits, 5, 1.0f, 2, u);
    REQUIRE((two == 1 || two == 3));
  }
  const auto cfg = tiny();
  model::Gpt m(cfg, 1, 16);
  m.init_parameters(9);
  train::SampleConfig sc;
  sc.max_new_tokens = 20;  // longer than the context: exercises the sliding window
  const auto a = train::generate(m, {1, 2, 3}, sc), b = train::generate(m, {1, 2, 3}, sc);
  REQUIRE(a == b);
  REQUIRE(a.size() == 23);
  for (auto t : a) REQUIRE((t >= 0 && t < cfg.vocab_size));  // never a padding token
}

TEST_CASE("dynamic loss scaler: halve on overflow, double after a window", "[train][loss_scale]") {
  optim::DynamicLossScaler s(1024.0f, 3);
  s.update(true);
  s.update(true);
  REQUIRE(s.scale() == 1024.0f);
  s.update(true);
  REQUIRE(s.scale() == 2048.0f);
  s.update(false);
  REQUIRE(s.scale() == 1024.0f);
  REQUIRE(s.skipped() == 1);
  s.update(true);
  s.update(true);
  REQUIRE(s.scale() == 1024.0f);  // the window restarted at the overflow
  optim::DynamicLossScaler floor(2.0f, 10, 1.0f);
  floor.update(false);
  floor.update(false);
  REQUIRE(floor.scale() == 1.0f);
}

TEST_CASE("loss scaling by a power of two leaves fp32 training unchanged", "[train][loss_scale]") {
  const std::string data = make_shard("scale");
  io::TokenDataset ds(data, 16);
  auto run = [&](bool scaling) {
    auto tc = base_config(4, 1, 5);
    tc.loss_scaling = scaling;
    tc.loss_scale_init = 1024.0f;
    parallel::Engine<float> e(MPI_COMM_SELF, tiny(), train::engine_options(tc));
    e.init_parameters(3);
    train::Trainer t(e, tc, ds, nullptr);
    std::vector<float> out;
    for (int s = 0; s < 5; ++s) {
      const auto r = t.step(s, true);
      REQUIRE(!r.skipped);
      REQUIRE(r.loss_scale == (scaling ? 1024.0f : 1.0f));
      out.push_back(r.loss);
    }
    return out;
  };
  const auto plain = run(false), scaled = run(true);
  for (std::size_t s = 0; s < plain.size(); ++s) REQUIRE(scaled[s] == mt_test::Approx(plain[s]).epsilon(1e-6));
}

TEST_CASE("an overflowing loss scale skips the step and comes down", "[train][loss_scale]") {
  const std::string data = make_shard("overflow");
  io::TokenDataset ds(data, 16);
  auto tc = base_config(4, 1, 40);
  tc.loss_scaling = true;
  tc.loss_scale_init = 0x1p70f;  // squares of the scaled gradients overflow fp32
  parallel::Engine<float> e(MPI_COMM_SELF, tiny(), train::engine_options(tc));
  e.init_parameters(3);
  const model::Gpt& m = e.model();
  train::Trainer t(e, tc, ds, nullptr);
  auto before = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.params());
  const auto first = t.step(0, true);
  REQUIRE(first.skipped);
  REQUIRE(!std::isfinite(first.grad_norm));
  auto after = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.params());
  for (std::size_t i = 0; i < before.extent(0); ++i) REQUIRE(before(i) == after(i));
  int s = 1;
  float scale = first.loss_scale;
  train::StepMetrics r;
  do {
    r = t.step(s++, true);
    if (r.skipped) {
      REQUIRE(r.loss_scale == scale * 0.5f);
      scale = r.loss_scale;
    }
  } while (r.skipped && s < 40);
  REQUIRE(!r.skipped);
  REQUIRE(r.loss_scale < 0x1p70f);
  REQUIRE(std::isfinite(r.grad_norm));
}

TEST_CASE("the metrics file: one JSON object per line, keys in order, six digits", "[train][metrics]") {
  const std::string data = make_shard("metrics");
  io::TokenDataset ds(data, 16);
  const std::string file = "test_trainer_metrics_" + std::to_string(mt_test::world_rank()) + ".jsonl";
  auto lines_of = [&] {
    std::ifstream in(file);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  };
  auto six = [](double v) {  // what printf's %g (and the stream before it) writes
    char b[32];
    std::snprintf(b, sizeof b, "%.6g", v);
    return std::strtod(b, nullptr);
  };
  {
    auto tc = base_config(2, 1, 3);
    tc.log_every = 1;
    tc.eval_batches = 1;
    tc.metrics_file = file;
    train::StepMetrics last;
    {
      parallel::Engine<float> e(MPI_COMM_SELF, tiny(), train::engine_options(tc));
      e.init_parameters(3);
      train::Trainer t(e, tc, ds, &ds);
      last = t.run();
    }  // the file is complete once the trainer has closed it
    const auto lines = lines_of();
    REQUIRE(lines.size() == 4);  // three steps, then the final validation loss
    const std::vector<std::string> keys = {
        "step", "loss", "lr", "grad_norm", "step_ms", "tokens_per_s", "tflops", "mfu",
        "memory_bytes", "loss_scale", "skipped", "bubble", "comm_ms", "comm_hidden",
        "tp_comm_ms", "ranks", "tokens"};
    for (int i = 0; i < 3; ++i) {
      INFO(lines[i]);
      REQUIRE(lines[i].rfind("{\"step\": " + std::to_string(i + 1) + ", \"loss\": ", 0) == 0);
      const Json r = json::parse(lines[i], file);
      std::vector<std::string> got;
      for (const auto& kv : r.items()) got.push_back(kv.key());
      REQUIRE(got == keys);
    }
    const Json r = json::parse(lines[2], file);
    REQUIRE(r["loss"].get<double>() == six(last.loss));
    REQUIRE(r["lr"].get<double>() == six(last.lr));
    REQUIRE(r["grad_norm"].get<double>() == six(last.grad_norm));
    REQUIRE(r["memory_bytes"].get<std::size_t>() == last.memory_bytes);  // integers exact
    REQUIRE(r["tokens"].get<std::int64_t>() == 3 * 2 * 16);
    REQUIRE(r["ranks"].get<int>() == 1);
    REQUIRE(r["skipped"].get<int>() == 0);
    REQUIRE(lines[3].rfind("{\"step\": 3, \"val_loss\": ", 0) == 0);
    REQUIRE(json::parse(lines[3], file).size() == 2);
  }
  {
    // A non-finite value (the norm of overflowed gradients) is null, so the line stays JSON.
    auto tc = base_config(2, 1, 1);
    tc.log_every = 1;
    tc.loss_scaling = true;
    tc.loss_scale_init = 0x1p70f;
    tc.metrics_file = file;
    {
      parallel::Engine<float> e(MPI_COMM_SELF, tiny(), train::engine_options(tc));
      e.init_parameters(3);
      train::Trainer t(e, tc, ds, nullptr);
      REQUIRE(t.run().skipped);
    }
    const auto lines = lines_of();
    REQUIRE(lines.size() == 1);
    const Json r = json::parse(lines[0], file);
    REQUIRE(r["grad_norm"].is_null());
    REQUIRE(r["skipped"].get<int>() == 1);
  }
  std::remove(file.c_str());
}
