// Parity with the float64 PyTorch reference (tests/reference/gpt2_reference.py): logits, loss,
// every gradient, and 10 AdamW steps. Tolerances come from tests/reference/README.md, where
// float32-vs-float64 deviations of the same computation in PyTorch were measured (logits 1.7e-7,
// grads <= 4.1e-7 relative to each tensor's max, final parameters 3.1e-6 absolute); ours are
// those plus room for a different summation order.
#include "fixture.hpp"
#include "meshtrain/optim/adamw.hpp"

using namespace meshtrain;

namespace {

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

// head_chunk_rows > 0: the LM head and loss run in chunks of that many rows (the tied wte's
// gradient accumulates over the chunks, then the embedding's).
void check_forward_backward(bool recompute, int head_chunk_rows = 0) {
  io::SafetensorsReader f(mt_test::fixture_path());
  const auto cfg = mt_test::fixture_config();
  model::ModelLayout layout;
  layout.recompute = recompute;
  layout.head_chunk_rows = head_chunk_rows;
  model::Gpt m(cfg, 2, 16, layout);
  mt_test::load_params(f, m, "param.");
  const auto inputs = f.read_i32("batch.inputs");
  const auto targets = f.read_i32("batch.targets");
  const std::size_t N = 32;
  auto din = tokens_to_device(inputs, 0, N), dtg = tokens_to_device(targets, 0, N);

  // Logits: 1e-5 of the largest |logit| (reference README: float32 gives 1.7e-7).
  auto logits = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.forward_logits(din));
  const auto ref = f.read_f32("logits");  // [2,16,61]
  double worst = 0;
  for (std::size_t r = 0; r < N; ++r)
    for (int c = 0; c < 61; ++c)
      worst = std::max(worst, std::fabs(double(logits(r * 64 + c)) - ref[r * 61 + c]));
  INFO("logits max abs diff " << worst << " vs max |logit| " << mt_test::max_abs(ref));
  REQUIRE(worst <= 1e-5 * mt_test::max_abs(ref));

  // Loss (mean over the 30 counted targets) and every gradient.
  const int n_counted = counted(targets, 0, N);
  REQUIRE(n_counted == 30);
  m.zero_grads();
  m.reset_loss_sum();
  m.forward_train(din, dtg, 1.0f / n_counted);
  m.backward();
  const float loss = read_scalar(m.loss_sum()) / n_counted;
  const float ref_loss = f.read_f32("loss")[0];
  INFO("loss " << loss << " reference " << ref_loss);
  REQUIRE(std::fabs(loss - ref_loss) <= 1e-5 * std::fabs(ref_loss));
  auto grads = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.grads());
  for (const auto& p : m.registry().params()) {
    const auto g = f.read_f32("grad." + p.name);
    const double d = mt_test::max_abs_diff(grads.data() + p.offset, g);
    INFO(p.name << ": max abs diff " << d << ", max |g| " << mt_test::max_abs(g));
    // 2e-5 of the tensor's largest gradient (PyTorch float32: <= 4.1e-7).
    REQUIRE(d <= 2e-5 * mt_test::max_abs(g));
    for (std::size_t i = g.size(); i < p.numel; ++i) REQUIRE(grads(p.offset + i) == 0.0f);
  }
}

}  // namespace

TEST_CASE("GPT-2 forward and backward match the PyTorch float64 reference", "[model][parity]") {
  check_forward_backward(false);
}

TEST_CASE("activation checkpointing gives the same gradients", "[model][parity]") {
  check_forward_backward(true);
}

TEST_CASE("the LM head in uneven chunks of rows matches the same reference", "[model][parity]") {
  check_forward_backward(false, 7);  // 32 rows: 7, 7, 7, 7, 4
}

TEST_CASE("head chunk rows: the requested rows, else the fewest equal chunks within 256 MiB",
          "[model]") {
  constexpr std::size_t limit = std::size_t(256) << 20;
  REQUIRE(model::head_chunk_rows(7, 32, 64, 4) == 7);
  REQUIRE(model::head_chunk_rows(100, 32, 64, 4) == 32);  // clamped to the micro-batch
  REQUIRE(model::head_chunk_rows(0, 32, 64, 4) == 32);    // small logits: one chunk
  // GPT-2 124M, mb 16, bf16 (1.65 GB of logits): 7 chunks of 2432 rows (19 GEMM tiles).
  REQUIRE(model::head_chunk_rows(0, 16384, 50304, 2) == 2432);
  // Llama 3.2 1B, mb 8, bf16 (4.2 GB): 16 chunks of 1024 rows.
  REQUIRE(model::head_chunk_rows(0, 16384, 128256, 2) == 1024);
  for (int rows : {129, 4096, 8192, 16383, 32768, 65536})
    for (int vocab : {50304, 64128, 128256, 151936})
      for (std::size_t e : {std::size_t(2), std::size_t(4)}) {
        const int r = model::head_chunk_rows(0, rows, vocab, e);
        INFO(rows << " rows, vocab " << vocab << ", " << e << " bytes: " << r << " rows");
        const std::size_t fit = limit / (std::size_t(vocab) * e);
        REQUIRE(r >= 1);
        REQUIRE(r <= rows);
        if (std::size_t(rows) <= fit) {
          REQUIRE(r == rows);
          continue;
        }
        REQUIRE(std::size_t(r) * vocab * e <= limit);
        // No more chunks than the fewest that fit.
        REQUIRE(std::size_t((rows + r - 1) / r) == (std::size_t(rows) + fit - 1) / fit);
      }
}

TEST_CASE("10 AdamW steps match the PyTorch float64 reference", "[model][parity]") {
  io::SafetensorsReader f(mt_test::fixture_path());
  const auto cfg = mt_test::fixture_config();
  model::Gpt m(cfg, 2, 16);
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
  const std::size_t N = 32;
  for (int s = 0; s < 10; ++s) {
    const int n_counted = counted(targets, s * N, N);
    m.zero_grads();
    m.reset_loss_sum();
    m.forward_train(tokens_to_device(inputs, s * N, N), tokens_to_device(targets, s * N, N),
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
    REQUIRE(d <= 1e-5);  // PyTorch float32: 3.1e-6
  }
}
