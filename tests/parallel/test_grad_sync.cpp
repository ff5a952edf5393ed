// GradSync with a stand-in model and integer gradients (exact sums): every ZeRO stage, bucket
// size and accumulation count gives each rank the dp-sum of the gradients where its stage keeps
// them; ZeRO-3 binds the right parameters at every use; pools stay small.
#include "zero_test_util.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

namespace {

struct Case {
  int stage;
  std::size_t bucket_bytes;
  int micro;
  bool overlap;
};

void run_case(const Case& c, comm::Communicator& dp) {
  const int rank = dp.rank(), P = dp.size();
  zt::FakeModel<float> fm(zt::config(3, 32, 100, 16), c.stage);
  DpOptions opt;
  opt.zero_stage = c.stage;
  opt.bucket_bytes = c.bucket_bytes;
  opt.overlap = c.overlap;
  GradSync<float> s(fm.buffers(), dp, opt);
  const auto& reg = fm.reg;
  const auto params = zt::on_params(reg, zt::param_value);
  s.scatter_params(zt::to_device<float>(params));  // ZeRO 0-2: into the model's buffer
  bool params_ok = true;
  auto check = [&](int u, const std::vector<float>& v) {
    const auto& unit = reg.units()[u];
    if (v.size() < unit.size()) {
      params_ok = false;
      return;
    }
    for (std::size_t k = 0; k < unit.size(); ++k)
      if (v[k] != params[unit.begin + k]) params_ok = false;
  };
  for (int step = 0; step < 2; ++step) {
    s.begin_step();
    for (int m = 0; m < c.micro; ++m) {
      s.set_last_micro(m == c.micro - 1);
      fm.micro_batch(s, [&](std::size_t i) { return zt::grad_value(rank, m + step, i); }, check);
    }
    s.finish();
  }
  REQUIRE(mt_test::all_ranks(params_ok));
  // The second step's sums over ranks and micro-batches (the first was zeroed by begin_step).
  const auto expect = zt::on_params(reg, [&](std::size_t i) {
    float sum = 0;
    for (int r = 0; r < P; ++r)
      for (int m = 0; m < c.micro; ++m) sum += zt::grad_value(r, m + 1, i);
    return sum;
  });
  std::size_t bad = 0;
  const auto g = zt::to_host(s.optimizer_grads());
  if (c.stage <= 1) {
    for (std::size_t i = 0; i < reg.size(); ++i) bad += g[i] != expect[i];
  } else {
    const auto& part = s.partition();
    for (int k = 0; k < static_cast<int>(part.groups().size()); ++k) {
      const auto& grp = part.groups()[k];
      const FlatRange pc = part.piece(k, rank);
      for (std::size_t j = 0; j < grp.piece; ++j) {
        const float want = j < pc.size() ? expect[pc.begin + j] : 0.0f;  // padding stays 0
        bad += g[grp.shard_offset + j] != want;
      }
    }
    REQUIRE(s.bytes().shard_grads == part.shard_size() * sizeof(float));
    // At most three bucket buffers (two in flight plus the tied embedding's).
    std::size_t largest = 0;
    for (const auto& grp : part.groups()) largest = std::max(largest, grp.piece * P);
    REQUIRE(s.bytes().grad_buffers <= 3 * largest * sizeof(float));
  }
  REQUIRE(mt_test::all_ranks(bad == 0));
  const auto st = s.grad_stats();
  REQUIRE(st.ops > 0);
  REQUIRE(st.exposed_seconds <= st.total_seconds + 1e-9);
}

}  // namespace

TEST_CASE("gradients are the dp-sum where each ZeRO stage keeps them", "[parallel][zero][mpi]") {
  zt::WorldDp w;
  for (int stage = 0; stage <= 3; ++stage)
    for (std::size_t bytes : {std::size_t(1), std::size_t(40000), std::size_t(1) << 30})
      for (int micro : {1, 3})
        for (bool overlap : {true, false}) {
          INFO("ZeRO-" << stage << " bucket " << bytes << " B, " << micro << " micro-batches"
                       << (overlap ? "" : ", no overlap"));
          run_case(Case{stage, bytes, micro, overlap}, *w.comm);
        }
}

TEST_CASE("parameters: ZeRO-1/2 all-gather the updated pieces, ZeRO-3 shards round-trip",
          "[parallel][zero][mpi]") {
  zt::WorldDp w;
  const int rank = w.comm->rank();
  for (int stage = 1; stage <= 3; ++stage) {
    INFO("ZeRO-" << stage);
    zt::FakeModel<float> fm(zt::config(2, 32, 100, 16), stage);
    DpOptions opt;
    opt.zero_stage = stage;
    opt.bucket_bytes = 30000;
    GradSync<float> s(fm.buffers(), *w.comm, opt);
    const auto want = zt::on_params(fm.reg, zt::param_value);
    auto full = zt::to_device<float>(std::vector<float>(fm.reg.size(), -7.0f));
    if (stage == 3) {
      s.scatter_params(zt::to_device<float>(want));
      s.gather_params(full);
    } else {
      // Only this rank's pieces hold the "updated" values; the rest is stale.
      auto h = zt::to_host(fm.params);
      std::fill(h.begin(), h.end(), -7.0f);
      for (const auto& pc : s.optimizer_pieces())
        for (std::size_t j = 0; j < pc.length; ++j) h[pc.flat + j] = want[pc.flat + j];
      Kokkos::deep_copy(fm.params, zt::to_device<float>(h));
      s.gather_updated_params();
      full = fm.params;
    }
    const auto got = zt::to_host(full);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const bool in_group = s.partition().group_of(i) >= 0;
      if (in_group) bad += got[i] != want[i];
    }
    REQUIRE(mt_test::all_ranks(bad == 0));
    (void)rank;
  }
}

TEST_CASE("pipeline stages sum the tied wte gradient over the embedding group",
          "[parallel][zero][mpi]") {
  const int W = mt_test::world_size(), me = mt_test::world_rank();
  if (W % 2) return;
  // Two stages: stage = rank % 2; dp groups within a stage, embedding groups {2k, 2k+1}.
  const int stage = me % 2;
  mesh::MpiComm dp_comm = mesh::MpiComm::split(mt_test::world(), stage, me);
  mesh::MpiComm emb_comm = mesh::MpiComm::split(mt_test::world(), me / 2, me);
  auto dp = comm::make_communicator(comm::default_backend(), dp_comm.get());
  auto emb = comm::make_communicator(comm::default_backend(), emb_comm.get());
  const auto cfg = zt::config(2, 32, 100, 16);
  model::ParameterRegistry reg(cfg, 0, 1, stage, stage, stage + 1, stage == 0, stage == 1);
  for (int zero : {0, 1}) {
    INFO("ZeRO-" << zero << ", stage " << stage);
    ModelBuffers<float> mb;
    mb.registry = &reg;
    mb.params = zeros<float>("test.params", reg.size());
    mb.grads = zeros<float>("test.grads", reg.size());
    DpOptions opt;
    opt.zero_stage = zero;
    opt.bucket_bytes = 20000;
    GradSync<float> s(mb, *dp, opt);
    s.set_embedding_group(emb.get());
    s.begin_step();
    // Gradient of element i on world rank r: r + 1 (wte on both stages, the rest per stage).
    Kokkos::deep_copy(mb.grads, zt::to_device<float>(zt::on_params(reg, [&](std::size_t) {
                        return static_cast<float>(me + 1);
                      })));
    s.set_last_micro(true);
    s.finish();  // no hooks ran: every bucket goes now
    const auto g = zt::to_host(mb.grads);
    float dp_sum = 0, all_sum = 0;
    for (int r = 0; r < W; ++r) {
      all_sum += r + 1;
      if (r % 2 == stage) dp_sum += r + 1;
    }
    std::size_t bad = 0;
    for (const auto& p : reg.params()) {
      const float want = p.name == "transformer.wte.weight" ? all_sum : dp_sum;
      for (std::size_t i = 0; i < p.numel; ++i) bad += g[p.offset + i] != want;
    }
    REQUIRE(mt_test::all_ranks(bad == 0));
  }
}

