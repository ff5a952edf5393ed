// The engine's checkpoints: what each rank saves and restores under its layout.
//
// Save: the model group is the fp32 truth of the parameters (fp32 runs: the parameters — the
// model's buffer, or the shard at ZeRO-3; 16-bit and offloaded runs: the optimizer's fp32
// master), the optim groups Adam's m and v. Each rank writes the disjoint part of its (tp, pp)
// slice that parallel::ownership gives it (ownership.hpp: its optimizer shard at ZeRO >= 1, an
// even split of the flat buffer over its replicas at ZeRO 0), deduplicated.
// Restore: each rank reads what its new layout holds: its whole parameter slice (ZeRO-3: its
// shard), and the master, m and v of its optimizer shard. Nothing depends on the saving layout.
#include <type_traits>

#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/profile.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/parallel/checkpoint_staging.hpp"
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

// out = float(src[offset, offset + out.extent(0))) for a device buffer of the compute type
// (16-bit types convert on the device).
template <class T>
void copy_to_float(const ExecSpace& exec, View1<const T> src, std::size_t offset,
                   HostView1<float> out) {
  const std::size_t n = out.extent(0);
  MESHTRAIN_CHECK(offset + n <= src.span(), "checkpoint: elements [", offset, ", ", offset + n,
                  ") of a buffer of ", src.span());
  if constexpr (std::is_same_v<T, float>) {
    exec.fence();
    Kokkos::deep_copy(out, slice(src, offset, n));
  } else {
    View1<float> tmp = alloc<float>("ckpt.convert", n);
    Kokkos::parallel_for(
        "meshtrain::ckpt_to_float",
        Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(n)),
        KOKKOS_LAMBDA(const std::int64_t i) { tmp(i) = static_cast<float>(src(offset + i)); });
    exec.fence();
    Kokkos::deep_copy(out, tmp);
  }
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

// The pieces of the registry inside each range of `ranges` (what this rank reads), with their
// data in `state`; copies another rank also holds are kept.
void add_pieces(const model::ParameterRegistry& reg, const std::vector<ShardPiece>& ranges,
                const HostState& state, std::vector<io::TensorPiece>& pieces,
                std::vector<float*>& data) {
  for (const auto& r : ranges) {
    if (r.length == 0) continue;
    for (const auto& pc : io::pieces_for_range(reg, r.flat, r.flat + r.length, false)) {
      pieces.push_back(pc);
      data.push_back(state.at(pc.flat_offset(), pc.count));
    }
  }
}

}  // namespace

template <class T>
void Engine<T>::stage_into(CheckpointStaging& st) {
  const ExecSpace exec = model_->exec();
  const int zero = ctx_->config().dp.zero_stage;
  const optim::ShardedAdamWT<T>& opt = zopt_->adamw();
  const Ownership& part = st.part;
  auto host = [](const PinnedView1<float>& v, std::size_t off, std::size_t len) {
    return HostView1<float>(v.data() + off, len);  // unmanaged: how host code sees pinned memory
  };
  const std::vector<ShardPiece>* lists[] = {&part.dense, &part.expert};
  // Adam's m and v, and the fp32 master where the optimizer keeps one.
  auto state = [&](optim::StateKind k, const PinnedView1<float>& dst) {
    if (part.whole_shard) {
      opt.get_state(k, host(dst, 0, part.staged));
      return;
    }
    for (const auto* l : lists)  // ZeRO 0: the optimizer's shard is the flat buffer
      for (const auto& r : *l) opt.get_state(k, r.flat, host(dst, r.shard, r.length));
  };
  state(optim::StateKind::exp_avg, st.exp_avg);
  state(optim::StateKind::exp_avg_sq, st.exp_avg_sq);
  if (opt.has_master()) {
    state(optim::StateKind::master, st.params);
  } else if (zero == 3) {  // the shard of parameters is the optimizer's
    copy_to_float<T>(exec, sync_->shard_params(), 0, host(st.params, 0, part.staged));
  } else {  // the model's flat buffer, at the flat positions of the ranges
    for (const auto* l : lists)
      for (const auto& r : *l)
        copy_to_float<T>(exec, model_->params(), r.flat, host(st.params, r.shard, r.length));
  }
}

template <class T>
Ownership Engine<T>::ownership_here() const {
  const optim::ShardedAdamWT<T>& opt = zopt_->adamw();
  OwnershipInputs in;
  in.n = model_->registry().size();
  in.zero_stage = ctx_->config().dp.zero_stage;
  in.shard_pieces = opt.pieces();
  in.shard_size = opt.shard_size();
  in.replicas = {ctx_->replicas().rank(), ctx_->replicas().size()};
  in.ep = ctx_->ep_size();
  if (in.ep > 1)
    in.expert_replicas = {ctx_->expert_replicas().rank(), ctx_->expert_replicas().size()};
  return ownership(in);
}

template <class T>
void Engine<T>::reserve_checkpoint_staging() {
  if (staging_) return;
  auto st = std::make_unique<CheckpointStaging>();
  st->part = ownership_here();
  const std::size_t n = st->part.staged;
  // Zero-filled: the pages are touched now, at start-up, not during the first save.
  auto buf = [&](const char* label) {
    return PinnedView1<float>(std::string("meshtrain::ckpt.staging_") + label, n);
  };
  st->params = buf("params");
  st->exp_avg = buf("exp_avg");
  st->exp_avg_sq = buf("exp_avg_sq");
  staging_ = std::move(st);
}

template <class T>
std::size_t Engine<T>::checkpoint_staging_bytes() const {
  return staging_ ? parallel::checkpoint_staging_bytes(staging_->part) : 0;
}

template <class T>
io::StagedCheckpoint Engine<T>::stage_checkpoint(const std::string& dir, std::int64_t steps_done,
                                                 io::CheckpointAttributes a,
                                                 io::Transfer transfer, int keep) {
  MESHTRAIN_CONFIG_CHECK(!dir.empty(), "saving a checkpoint needs ckpt.dir");
  reserve_checkpoint_staging();
  const prof::Range save_range("checkpoint save (staged for the background writer)");
  return stage(*staging_, dir, steps_done, std::move(a), transfer, keep);
}

template <class T>
io::StagedCheckpoint Engine<T>::stage(CheckpointStaging& st, const std::string& dir,
                                      std::int64_t steps_done, io::CheckpointAttributes a,
                                      io::Transfer transfer, int keep) {
  const model::ParameterRegistry& reg = model_->registry();
  {
    const prof::Range phase("checkpoint: state to host");
    stage_into(st);
  }
  // The pieces of each staged range, with their data in the staging buffers.
  const Ownership& part = st.part;
  std::vector<ShardPiece> ranges = part.dense;
  ranges.insert(ranges.end(), part.expert.begin(), part.expert.end());
  auto state = [&](const PinnedView1<float>& v) {
    return HostState{ranges, HostView1<float>(v.data(), part.staged)};
  };
  const HostState params = state(st.params), m = state(st.exp_avg), v = state(st.exp_avg_sq);
  io::StagedCheckpoint s;
  s.groups = {{io::kModelPrefix, {}, {}}, {io::kExpAvgPrefix, {}, {}}, {io::kExpAvgSqPrefix, {}, {}}};
  const HostState* states[] = {&params, &m, &v};
  for (const OwnedPiece& o : owned_pieces(reg, part, true))
    for (int g = 0; g < 3; ++g) {
      auto& G = s.groups[static_cast<std::size_t>(g)];
      G.pieces.push_back(o.piece);
      G.data.push_back(states[g]->at(o.piece.flat_offset(), o.piece.count));
    }
  const auto& c = ctx_->config();
  a.model = cfg_;
  save_expert_bias(a);
  a.layout = {c.shape.dp, c.shape.pp, c.shape.tp, c.dp.zero_stage, c.order.str(), c.shape.cp};
  s.dir = dir;
  s.step = steps_done;
  s.attrs = std::move(a);
  s.transfer = transfer;
  s.keep = keep;
  return s;
}

template <class T>
std::string Engine<T>::save_checkpoint(const std::string& dir, std::int64_t steps_done,
                                       io::CheckpointAttributes a, io::Transfer transfer,
                                       int keep) {
  MESHTRAIN_CONFIG_CHECK(!dir.empty(), "saving a checkpoint needs ckpt.dir");
  // Synchronous: staged into buffers of this save alone (the persistent ones may be in use by
  // a background write), written and committed over the world on this thread.
  CheckpointStaging st;
  st.part = ownership_here();
  st.params = PinnedView1<float>("meshtrain::ckpt.host", st.part.staged);
  st.exp_avg = PinnedView1<float>("meshtrain::ckpt.host", st.part.staged);
  st.exp_avg_sq = PinnedView1<float>("meshtrain::ckpt.host", st.part.staged);
  const prof::Range save_range("checkpoint save");
  const io::StagedCheckpoint s = stage(st, dir, steps_done, std::move(a), transfer, keep);
  return io::write_staged(ctx_->mesh().world().get(), s, {}, true);
}

template <class T>
std::unique_ptr<io::BackgroundWriter> Engine<T>::background_writer() const {
  return std::make_unique<io::BackgroundWriter>(ctx_->mesh().world().get());
}

template <class T>
void Engine<T>::agree(const std::string& what, const std::function<void()>& f) const {
  meshtrain::agree(ctx_->mesh().world().get(), what, f);
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
  add_pieces(reg, params.pieces, params, groups[0].pieces, groups[0].data);
  add_pieces(reg, opt_pieces, m, groups[1].pieces, groups[1].data);
  add_pieces(reg, opt_pieces, v, groups[2].pieces, groups[2].data);
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
  template io::StagedCheckpoint Engine<T>::stage_checkpoint(                                  \
      const std::string&, std::int64_t, io::CheckpointAttributes, io::Transfer, int);         \
  template void Engine<T>::reserve_checkpoint_staging();                                      \
  template std::size_t Engine<T>::checkpoint_staging_bytes() const;                           \
  template std::unique_ptr<io::BackgroundWriter> Engine<T>::background_writer() const;        \
  template void Engine<T>::agree(const std::string&, const std::function<void()>&) const;     \
  template io::CheckpointAttributes Engine<T>::load_checkpoint(                               \
      const std::string&, const std::string&, bool, io::Transfer);
MESHTRAIN_ENGINE_CKPT(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_ENGINE_CKPT(bf16)
MESHTRAIN_ENGINE_CKPT(fp16)
#endif
#undef MESHTRAIN_ENGINE_CKPT

}  // namespace meshtrain::parallel
