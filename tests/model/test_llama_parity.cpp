// The Llama block against the float64 PyTorch reference (tests/reference/llama_reference.py,
// HF LlamaForCausalLM semantics): logits, loss, every gradient, the Llama 3 rope variant and 10
// AdamW steps; grouped-query attention with 2 key-value heads for 4 query heads, untied head.
// Tolerances are GPT-2's (test_gpt_parity.cpp); the reference README measured PyTorch float32
// against float64 on this fixture: logits 1.9e-7, grads <= 5.1e-7 of each tensor's max, losses
// and grad norms 1.7e-7, final parameters 1.5e-6 absolute.
#include "fixture.hpp"
#include "meshtrain/optim/adamw.hpp"

using namespace meshtrain;

namespace {

constexpr int kB = 2, kT = 16, kV = 61, kVp = 64;
constexpr std::size_t kN = kB * kT;

View1<std::int32_t> tokens_to_device(const std::vector<std::int32_t>& v, std::size_t offset,
                                     std::size_t n) {
  auto d = alloc<std::int32_t>("test.tokens", n);
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < n; ++i) h(i) = v[offset + i];
  Kokkos::deep_copy(d, h);
  return d;
}

float read_scalar(Scalar<float> s) {
  float x;
  Kokkos::deep_copy(x, s);
  return x;
}

int counted(const std::vector<std::int32_t>& t, std::size_t off, std::size_t n) {
  int c = 0;
  for (std::size_t i = 0; i < n; ++i) c += t[off + i] >= 0;
  return c;
}

model::GptConfig with_llama3_rope(model::GptConfig c) {
  c.rope.llama3_scaling = true;  // the fixture's LLAMA3_SCALING
  c.rope.factor = 8.0;
  c.rope.low_freq_factor = 1.0;
  c.rope.high_freq_factor = 4.0;
  c.rope.original_max_position_embeddings = 64;
  return c;
}

// prefix "" or "llama3." (the fixture's Llama 3 rope variant on the same batch and parameters)
// head_chunk_rows > 0: the LM head and loss run in chunks of that many rows.
void check_forward_backward(const model::GptConfig& cfg, const std::string& prefix,
                            bool recompute, int head_chunk_rows = 0) {
  io::SafetensorsReader f(mt_test::llama_fixture_path());
  model::ModelLayout layout;
  layout.recompute = recompute;
  layout.head_chunk_rows = head_chunk_rows;
  model::Gpt m(cfg, kB, kT, layout);
  mt_test::load_params(f, m, "param.");
  const auto inputs = f.read_i32("batch.inputs"), targets = f.read_i32("batch.targets");
  auto din = tokens_to_device(inputs, 0, kN), dtg = tokens_to_device(targets, 0, kN);

  // Logits: 1e-5 of the largest |logit|.
  auto logits = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.forward_logits(din));
  const auto ref = f.read_f32(prefix + "logits");  // [2,16,61]
  double worst = 0;
  for (std::size_t r = 0; r < kN; ++r)
    for (int c = 0; c < kV; ++c)
      worst = std::max(worst, std::fabs(double(logits(r * kVp + c)) - ref[r * kV + c]));
  INFO(prefix << "logits max abs diff " << worst << " vs max |logit| " << mt_test::max_abs(ref));
  REQUIRE(worst <= 1e-5 * mt_test::max_abs(ref));

  const int n_counted = counted(targets, 0, kN);
  REQUIRE(n_counted == 30);
  m.zero_grads();
  m.reset_loss_sum();
  m.forward_train(din, dtg, 1.0f / n_counted);
  m.backward();
  const float loss = read_scalar(m.loss_sum()) / n_counted;
  const float ref_loss = f.read_f32(prefix + "loss")[0];
  INFO(prefix << "loss " << loss << " reference " << ref_loss);
  REQUIRE(std::fabs(loss - ref_loss) <= 1e-5 * std::fabs(ref_loss));
  auto grads = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.grads());
  REQUIRE(m.registry().params().size() == 21);
  for (const auto& p : m.registry().params()) {
    const auto g = f.read_f32(prefix + "grad." + p.name);
    const double d = mt_test::max_abs_diff(grads.data() + p.offset, g);
    INFO(prefix << p.name << ": max abs diff " << d << ", max |g| " << mt_test::max_abs(g));
    REQUIRE(d <= 2e-5 * mt_test::max_abs(g));
    for (std::size_t i = g.size(); i < p.numel; ++i) REQUIRE(grads(p.offset + i) == 0.0f);
  }
}

}  // namespace

TEST_CASE("Llama forward and backward match the PyTorch float64 reference",
          "[model][parity][llama]") {
  check_forward_backward(mt_test::llama_fixture_config(), "", false);
}

TEST_CASE("Llama with activation checkpointing gives the same gradients",
          "[model][parity][llama]") {
  check_forward_backward(mt_test::llama_fixture_config(), "", true);
}

TEST_CASE("Llama with the LM head in uneven chunks of rows matches the same reference",
          "[model][parity][llama]") {
  check_forward_backward(mt_test::llama_fixture_config(), "", false, 7);  // 32 rows: 7+...+4
}

TEST_CASE("Llama 3 rope scaling matches the reference's llama3 variant",
          "[model][parity][llama]") {
  check_forward_backward(with_llama3_rope(mt_test::llama_fixture_config()), "llama3.", false);
}

TEST_CASE("Llama: 10 AdamW steps match the PyTorch float64 reference",
          "[model][parity][llama]") {
  io::SafetensorsReader f(mt_test::llama_fixture_path());
  model::Gpt m(mt_test::llama_fixture_config(), kB, kT);
  mt_test::load_params(f, m, "param.");
  optim::AdamWConfig oc;
  oc.lr = 1e-3f;
  oc.min_lr = 1e-3f;
  oc.beta1 = 0.9f;
  oc.beta2 = 0.95f;
  oc.eps = 1e-8f;
  oc.weight_decay = 0.1f;
  oc.grad_clip = 1.0f;
  optim::AdamW opt(m.registry().decay_ranges(), m.registry().size(), oc);
  const auto inputs = f.read_i32("train.inputs"), targets = f.read_i32("train.targets");
  const auto ref_losses = f.read_f32("train.losses"), ref_norms = f.read_f32("train.grad_norms");
  for (int s = 0; s < 10; ++s) {
    const int n_counted = counted(targets, s * kN, kN);
    m.zero_grads();
    m.reset_loss_sum();
    m.forward_train(tokens_to_device(inputs, s * kN, kN), tokens_to_device(targets, s * kN, kN),
                    1.0f / n_counted);
    m.backward();
    opt.step(m.params(), m.grads(), s);
    const float loss = read_scalar(m.loss_sum()) / n_counted;
    const float norm = read_scalar(opt.grad_norm());
    INFO("step " << s << ": loss " << loss << " ref " << ref_losses[s] << ", grad norm " << norm
                 << " ref " << ref_norms[s]);
    REQUIRE(std::fabs(loss - ref_losses[s]) <= 1e-5 * std::fabs(ref_losses[s]));
    REQUIRE(std::fabs(norm - ref_norms[s]) <= 1e-5 * std::fabs(ref_norms[s]));
  }
  auto params = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.params());
  for (const auto& p : m.registry().params()) {
    const auto ref = f.read_f32("train.final." + p.name);
    const double d = mt_test::max_abs_diff(params.data() + p.offset, ref);
    INFO(p.name << ": final parameter max abs diff " << d);
    REQUIRE(d <= 1e-5);  // PyTorch float32: 1.5e-6
  }
}

// A tied head is the untied one whose lm_head equals the embedding: the same logits, and the
// embedding's gradient is the sum of the untied model's two gradients (lookup + head).
TEST_CASE("Llama with a tied head equals the untied model with lm_head = embed_tokens",
          "[model][llama]") {
  io::SafetensorsReader f(mt_test::llama_fixture_path());
  auto cfg = mt_test::llama_fixture_config();
  model::Gpt untied(cfg, kB, kT);
  mt_test::load_params(f, untied, "param.");
  cfg.tied_head = true;
  model::Gpt tied(cfg, kB, kT);
  REQUIRE(tied.registry().find("lm_head.weight") == nullptr);
  mt_test::load_params(f, tied, "param.");
  Kokkos::deep_copy(untied.param("lm_head.weight"), untied.param("model.embed_tokens.weight"));
  const auto inputs = f.read_i32("batch.inputs"), targets = f.read_i32("batch.targets");
  auto din = tokens_to_device(inputs, 0, kN), dtg = tokens_to_device(targets, 0, kN);
  for (auto* m : {&untied, &tied}) {
    m->zero_grads();
    m->reset_loss_sum();
    m->forward_train(din, dtg, 1.0f / 30);
    m->backward();
  }
  REQUIRE(read_scalar(tied.loss_sum()) == read_scalar(untied.loss_sum()));
  auto gu = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, untied.grads());
  auto gt = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, tied.grads());
  const auto& e_u = untied.registry().get("model.embed_tokens.weight");
  const auto& h_u = untied.registry().get("lm_head.weight");
  const auto& e_t = tied.registry().get("model.embed_tokens.weight");
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < e_t.numel; ++i) {
    const double sum = double(gu(e_u.offset + i)) + gu(h_u.offset + i);
    worst = std::max(worst, std::fabs(gt(e_t.offset + i) - sum));
    scale = std::max(scale, std::fabs(sum));
  }
  INFO("embedding gradient: max diff " << worst << " of max " << scale);
  REQUIRE(worst <= 1e-6 * scale);
}
