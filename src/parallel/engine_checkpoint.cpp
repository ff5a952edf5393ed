// The engine's checkpoints: what each rank saves and restores under its layout.
//
// Save: the model group is the fp32 truth of the parameters (fp32 runs: the parameters — the
// model's buffer, or the shard at ZeRO-3; 16-bit and offloaded runs: the optimizer's fp32
// master), the optim groups Adam's m and v. Each data-parallel rank writes a disjoint part of
// its (tp, pp) slice: with ZeRO >= 1 exactly the optimizer's shard pieces, with ZeRO 0 the range
// [n·d/dp, n·(d+1)/dp) of the flat buffer; io::pieces_for_range drops the copies that another
// rank writes (replicated tensors on tp ranks != 0, the last stage's tied wte).
// Restore: each rank reads what its new layout holds: its whole parameter slice (ZeRO-3: its
// shard), and the master, m and v of its optimizer shard. Nothing depends on the saving layout.
#include <csignal>
#include <optional>
#include <type_traits>

#include "meshtrain/core/fault_injection.hpp"
#include "meshtrain/core/profile.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/parallel/grad_sync.hpp"
#include "meshtrain/parallel/zero_optimizer.hpp"

namespace meshtrain::parallel {

namespace {

using optim::ShardPiece;

// One family of fp32 state in host memory: data[p.shard + k] holds flat element p.flat + k of
// each piece p (the whole buffer is the single piece {0, 0, n}).
struct HostState {
  std::vector<ShardPiece> pieces;
  HostView1<float> data;

  float* at(std::size_t flat, std::size_t count) const {
    for (const auto& p : pieces)
      if (flat >= p.flat && flat + count <= p.flat + p.length)
        return data.data() + p.shard + (flat - p.flat);
    MESHTRAIN_CHECK(false, "checkpoint: flat elements [", flat, ", ", flat + count,
                    ") are not in one piece of the state this rank holds");
    return nullptr;
  }
};

std::vector<ShardPiece> whole(std::size_t n) { return {ShardPiece{0, 0, n}}; }

// fp32 host copy of a device buffer of the compute type (16-bit types convert on the device).
template <class T>
HostView1<float> host_float(const ExecSpace& exec, View1<const T> src) {
  HostView1<float> out("meshtrain::ckpt.host", src.span());
  if constexpr (std::is_same_v<T, float>) {
    exec.fence();
    Kokkos::deep_copy(out, src);
  } else {
    View1<float> tmp = alloc<float>("ckpt.convert", src.span());
    Kokkos::parallel_for(
        "meshtrain::ckpt_to_float",
        Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(src.span())),
        KOKKOS_LAMBDA(const std::int64_t i) { tmp(i) = static_cast<float>(src(i)); });
    exec.fence();
    Kokkos::deep_copy(out, tmp);
  }
  return out;
}

// dst = T(src) for a device buffer of the compute type.
template <class T>
void from_host_float(const ExecSpace& exec, HostView1<const float> src, View1<T> dst) {
  MESHTRAIN_CHECK(src.extent(0) == dst.span(), "checkpoint: ", src.extent(0),
                  " values for a buffer of ", dst.span());
  exec.fence();
  if constexpr (std::is_same_v<T, float>) {
    Kokkos::deep_copy(dst, src);
  } else {
    View1<float> tmp = alloc<float>("ckpt.convert", dst.span());
    Kokkos::deep_copy(tmp, src);
    Kokkos::parallel_for(
        "meshtrain::ckpt_from_float",
        Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(dst.span())),
        KOKKOS_LAMBDA(const std::int64_t i) { dst(i) = static_cast<T>(tmp(i)); });
    exec.fence();
  }
}

HostView1<float> host_zeros(std::size_t n) { return HostView1<float>("meshtrain::ckpt.host", n); }

// The pieces of the registry inside each range of `ranges`, with their data in `state`.
// only: 0 every parameter, 1 dense ones only, 2 MoE experts only (ZeRO-0 under mesh.ep, where
// dp and expert-dp split the buffer differently).
template <class Ptr>
void add_pieces(const model::ParameterRegistry& reg, const std::vector<ShardPiece>& ranges,
                bool dedup, const HostState& state, std::vector<io::TensorPiece>& pieces,
                std::vector<Ptr>& data, int only = 0) {
  for (const auto& r : ranges) {
    if (r.length == 0) continue;
    for (const auto& pc : io::pieces_for_range(reg, r.flat, r.flat + r.length, dedup)) {
      const bool expert = pc.param->grad_group == model::ParamGroup::expert_dp;
      if ((only == 1 && expert) || (only == 2 && !expert)) continue;
      pieces.push_back(pc);
      data.push_back(state.at(pc.flat_offset(), pc.count));
    }
  }
}

}  // namespace

template <class T>
std::string Engine<T>::save_checkpoint(const std::string& dir, std::int64_t steps_done,
                                       io::CheckpointAttributes a, io::Transfer transfer,
                                       int keep) {
  MESHTRAIN_CONFIG_CHECK(!dir.empty(), "saving a checkpoint needs ckpt.dir");
  const prof::Range save_range("checkpoint save");
  std::optional<prof::Range> phase;
  phase.emplace("checkpoint: state to host");
  const model::ParameterRegistry& reg = model_->registry();
  const std::size_t n = reg.size();
  const ExecSpace exec = model_->exec();
  const int zero = ctx_->config().dp.zero_stage;
  const optim::ShardedAdamWT<T>& opt = zopt_->adamw();

  // Where each family lives on this rank.
  const auto shard = [&](optim::StateKind k) {
    HostView1<float> h = host_zeros(opt.shard_size());
    opt.get_state(k, h);
    return HostState{opt.pieces(), h};
  };
  HostState params;
  if (opt.has_master()) params = shard(optim::StateKind::master);
  else if (zero == 3) params = {opt.pieces(), host_float<T>(exec, sync_->shard_params())};
  else params = {whole(n), host_float<T>(exec, model_->params())};
  const HostState m = shard(optim::StateKind::exp_avg), v = shard(optim::StateKind::exp_avg_sq);
  // The disjoint part of the flat buffer this rank writes.
  // ZeRO-0: dense parameters split over their replicas (dp x cp); MoE experts (each ep rank's
  // own, replicated over expert-dp x cp) split over those. ZeRO >= 1: the shard pieces, which already are both.
  std::vector<ShardPiece> ranges, expert_ranges;
  auto split = [&](std::size_t d, std::size_t D) {
    return std::vector<ShardPiece>{ShardPiece{n * d / D, 0, n * (d + 1) / D - n * d / D}};
  };
  const bool ep_split = zero == 0 && ctx_->ep_size() > 1;
  if (zero >= 1) {
    ranges = opt.pieces();
  } else {
    ranges = split(static_cast<std::size_t>(ctx_->replicas().rank()),
                   static_cast<std::size_t>(ctx_->replicas().size()));
    if (ep_split)
      expert_ranges = split(static_cast<std::size_t>(ctx_->expert_replicas().rank()),
                            static_cast<std::size_t>(ctx_->expert_replicas().size()));
  }
  std::vector<io::SaveGroup> groups{{io::kModelPrefix, {}, {}},
                                    {io::kExpAvgPrefix, {}, {}},
                                    {io::kExpAvgSqPrefix, {}, {}}};
  const HostState* states[] = {&params, &m, &v};
  for (int g = 0; g < 3; ++g) {
    add_pieces(reg, ranges, true, *states[g], groups[g].pieces, groups[g].data, ep_split ? 1 : 0);
    if (ep_split)
      add_pieces(reg, expert_ranges, true, *states[g], groups[g].pieces, groups[g].data, 2);
  }

  const auto& c = ctx_->config();
  a.model = cfg_;
  save_expert_bias(a);
  a.layout = {c.shape.dp, c.shape.pp, c.shape.tp, zero, c.order.str(), c.shape.cp};
  io::CheckpointWriter writer(ctx_->mesh().world().get(), dir, steps_done);
  phase.reset();
  phase.emplace("checkpoint: write");
  writer.write(a, groups, transfer);
  phase.reset();
  if (fault::hooks().crash_at_checkpoint == steps_done && world_rank() == 0) {
    logging::each("test hook: rank 0 kills itself after writing ", writer.tmp_path());
    std::raise(SIGKILL);
  }
  const prof::Range commit_range("checkpoint: commit");
  return writer.commit(keep);
}

template <class T>
io::CheckpointAttributes Engine<T>::load_checkpoint(const std::string& spec,
                                                    const std::string& dir, bool verify,
                                                    io::Transfer transfer) {
  const prof::Range load_range("checkpoint load");
  const model::ParameterRegistry& reg = model_->registry();
  const std::size_t n = reg.size();
  const ExecSpace exec = model_->exec();
  const bool zero3 = ctx_->config().dp.zero_stage == 3;
  optim::ShardedAdamWT<T>& opt = zopt_->adamw();
  const std::vector<ShardPiece> opt_pieces = opt.pieces();
  const std::size_t opt_size = opt.shard_size();

  // The parameters this rank holds (its whole slice, or its ZeRO-3 shard, which is the
  // optimizer's), and m and v of the optimizer's shard. Copies among dp and tp replicas are
  // read by every holder (no dedup).
  const HostState params = zero3 ? HostState{opt_pieces, host_zeros(opt_size)}
                                 : HostState{whole(n), host_zeros(n)};
  const HostState m{opt_pieces, host_zeros(opt_size)}, v{opt_pieces, host_zeros(opt_size)};
  std::vector<io::LoadGroup> groups{{io::kModelPrefix, {}, {}},
                                    {io::kExpAvgPrefix, {}, {}},
                                    {io::kExpAvgSqPrefix, {}, {}}};
  add_pieces(reg, params.pieces, false, params, groups[0].pieces, groups[0].data);
  add_pieces(reg, opt_pieces, false, m, groups[1].pieces, groups[1].data);
  add_pieces(reg, opt_pieces, false, v, groups[2].pieces, groups[2].data);
  io::CheckpointAttributes a = io::load_checkpoint(ctx_->mesh().world().get(), spec, cfg_, groups,
                                                   verify, dir, transfer);
  if (zero3) {
    from_host_float<T>(exec, params.data, sync_->shard_params());
    sync_->params_updated();  // drop any gathered copy of the old values
  } else {
    from_host_float<T>(exec, params.data, model_->params());
  }
  if (opt.has_master()) {
    HostView1<float> master = params.data;
    if (!zero3) {  // the optimizer's pieces out of the whole slice
      master = host_zeros(opt_size);
      for (const auto& p : opt_pieces)
        for (std::size_t i = 0; i < p.length; ++i) master(p.shard + i) = params.data(p.flat + i);
    }
    opt.set_state(optim::StateKind::master, master);
  }
  opt.set_state(optim::StateKind::exp_avg, m.data);
  opt.set_state(optim::StateKind::exp_avg_sq, v.data);
  restore_expert_bias(a);
  return a;
}

#define MESHTRAIN_ENGINE_CKPT(T)                                                               \
  template std::string Engine<T>::save_checkpoint(const std::string&, std::int64_t,           \
                                                  io::CheckpointAttributes, io::Transfer, int); \
  template io::CheckpointAttributes Engine<T>::load_checkpoint(                               \
      const std::string&, const std::string&, bool, io::Transfer);
MESHTRAIN_ENGINE_CKPT(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_ENGINE_CKPT(bf16)
MESHTRAIN_ENGINE_CKPT(fp16)
#endif
#undef MESHTRAIN_ENGINE_CKPT

}  // namespace meshtrain::parallel
