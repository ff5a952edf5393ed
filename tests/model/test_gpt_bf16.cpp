// Mixed precision (bf16 parameters/activations/gradients, fp32 accumulation, fp32 master
// weights) against the float64 PyTorch reference. Built where bf16 exists (Kokkos 4: the CUDA
// build; Debian's Kokkos 3.4 CPU build trains in fp32 only).
//
// Tolerances: bf16 keeps 8 significant bits (unit roundoff 2^-9 = 2e-3). Every activation and
// gradient is rounded to bf16 between kernels, so errors of a few roundoffs per layer are
// expected: relative L2 error 2e-2 for logits, 1e-2 for the loss, 6e-2 for each gradient tensor
// (2 layers deep), and 2e-2 for the 10 training losses (the fp32 master weights keep the
// optimizer exact; what differs is the gradient it is fed).
#include <cmath>

#include "fixture.hpp"
#include "meshtrain/optim/adamw.hpp"

using namespace meshtrain;

namespace {

View1<std::int32_t> tokens(const std::vector<std::int32_t>& v, std::size_t off, std::size_t n) {
  auto d = alloc<std::int32_t>("test.tokens", n);
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < n; ++i) h(i) = v[off + i];
  Kokkos::deep_copy(d, h);
  return d;
}

void load_bf16(const io::SafetensorsReader& f, model::GptBf16& m) {
  auto host = Kokkos::create_mirror_view(m.params());
  Kokkos::deep_copy(host, bf16(0.0f));
  for (const auto& p : m.registry().params()) {
    const auto v = f.read_f32("param." + p.name);
    for (std::size_t i = 0; i < v.size(); ++i) host(p.offset + i) = bf16(v[i]);
  }
  Kokkos::deep_copy(m.params(), host);
}

double rel_l2(const std::vector<double>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

int counted(const std::vector<std::int32_t>& t, std::size_t off, std::size_t n) {
  int c = 0;
  for (std::size_t i = 0; i < n; ++i) c += t[off + i] >= 0;
  return c;
}

}  // namespace

TEST_CASE("bf16 forward and backward track the float64 reference", "[model][bf16]") {
  io::SafetensorsReader f(mt_test::fixture_path());
  model::GptBf16 m(mt_test::fixture_config(), 2, 16);
  load_bf16(f, m);
  const auto in = f.read_i32("batch.inputs"), tg = f.read_i32("batch.targets");
  auto din = tokens(in, 0, 32), dtg = tokens(tg, 0, 32);
  auto logits = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.forward_logits(din));
  const auto ref = f.read_f32("logits");
  std::vector<double> got(ref.size());
  for (std::size_t r = 0; r < 32; ++r)
    for (int c = 0; c < 61; ++c) got[r * 61 + c] = static_cast<float>(logits(r * 64 + c));
  const double le = rel_l2(got, ref);
  INFO("logits relative L2 error " << le);
  REQUIRE(le <= 2e-2);

  m.zero_grads();
  m.reset_loss_sum();
  m.forward_train(din, dtg, 1.0f / 30);
  m.backward();
  float loss_sum = 0;
  Kokkos::deep_copy(loss_sum, m.loss_sum());
  const float ref_loss = f.read_f32("loss")[0];
  INFO("loss " << loss_sum / 30 << " reference " << ref_loss);
  REQUIRE(std::fabs(loss_sum / 30 - ref_loss) <= 1e-2 * ref_loss);
  auto grads = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.grads());
  for (const auto& p : m.registry().params()) {
    const auto g = f.read_f32("grad." + p.name);
    std::vector<double> gg(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      gg[i] = static_cast<float>(grads(p.offset + i));
      REQUIRE(std::isfinite(gg[i]));
    }
    const double e = rel_l2(gg, g);
    INFO(p.name << ": relative L2 error " << e);
    REQUIRE(e <= 6e-2);
  }
}

TEST_CASE("bf16 training with fp32 master weights follows the reference losses", "[model][bf16]") {
  io::SafetensorsReader f(mt_test::fixture_path());
  model::GptBf16 m(mt_test::fixture_config(), 2, 16);
  load_bf16(f, m);
  optim::AdamWConfig oc;
  oc.lr = oc.min_lr = 1e-3f;
  oc.weight_decay = 0.1f;
  oc.grad_clip = 1.0f;
  optim::AdamWT<bf16> opt(m.registry().decay_ranges(), m.registry().size(), oc);
  opt.init_master(m.params());
  const auto in = f.read_i32("train.inputs"), tg = f.read_i32("train.targets");
  const auto ref = f.read_f32("train.losses");
  for (int s = 0; s < 10; ++s) {
    const int n = counted(tg, s * 32, 32);
    m.zero_grads();
    m.reset_loss_sum();
    m.forward_train(tokens(in, s * 32, 32), tokens(tg, s * 32, 32), 1.0f / n);
    m.backward();
    opt.step(m.params(), m.grads(), s);
    float loss_sum = 0;
    Kokkos::deep_copy(loss_sum, m.loss_sum());
    INFO("step " << s << ": loss " << loss_sum / n << " reference " << ref[s]);
    REQUIRE(std::fabs(loss_sum / n - ref[s]) <= 2e-2 * ref[s]);
  }
}
