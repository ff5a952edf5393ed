// The trainer's checkpoints: what each rank saves and restores under its layout.
//
// Save: the model group is the fp32 truth of the parameters (fp32 runs: the parameters; 16-bit
// and offloaded runs: the optimizer's fp32 master), the optim groups Adam's m and v. Each
// data-parallel rank writes a disjoint part of its (tp, pp) slice: with ZeRO >= 1 exactly the
// optimizer's shard pieces, with ZeRO 0 the range [n·d/dp, n·(d+1)/dp) of the flat buffer;
// io::pieces_for_range drops the copies that another rank writes (replicated tensors on tp ranks
// != 0, the last stage's tied wte).
// Restore: each rank reads what its new layout holds: its whole parameter slice (ZeRO-3: its
// shard), and the master, m and v of its optimizer shard. Nothing depends on the saving layout.
#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <type_traits>

#include "meshtrain/core/log.hpp"
#include "meshtrain/core/signals.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/parallel/context.hpp"
#include "meshtrain/parallel/grad_sync.hpp"
#include "meshtrain/parallel/zero_optimizer.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::train {

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
template <class Ptr>
void add_pieces(const model::ParameterRegistry& reg, const std::vector<ShardPiece>& ranges,
                bool dedup, const HostState& state, std::vector<io::TensorPiece>& pieces,
                std::vector<Ptr>& data) {
  for (const auto& r : ranges) {
    if (r.length == 0) continue;
    for (const auto& pc : io::pieces_for_range(reg, r.flat, r.flat + r.length, dedup)) {
      pieces.push_back(pc);
      data.push_back(state.at(pc.flat_offset(), pc.count));
    }
  }
}

}  // namespace

template <class T>
MPI_Comm TrainerT<T>::world_comm() const {
  return par_ ? par_->mesh().world().get() : MPI_COMM_SELF;
}

template <class T>
std::string TrainerT<T>::save_checkpoint(std::int64_t steps_done) {
  MESHTRAIN_CONFIG_CHECK(!cfg_.ckpt.dir.empty(), "saving a checkpoint needs ckpt.dir");
  const model::ParameterRegistry& reg = model_.registry();
  const std::size_t n = reg.size();
  const ExecSpace exec = model_.exec();
  const int zero = par_ ? par_->config().dp.zero_stage : 0;

  // Where each family lives on this rank.
  HostState params, m, v;
  std::vector<ShardPiece> ranges;  // the disjoint part of the flat buffer this rank writes
  if (!par_) {
    if constexpr (std::is_same_v<T, float>)
      params = {whole(n), host_float<T>(exec, model_.params())};
    else
      params = {whole(n), host_float<float>(exec, opt_->master())};
    m = {whole(n), host_float<float>(exec, opt_->exp_avg())};
    v = {whole(n), host_float<float>(exec, opt_->exp_avg_sq())};
    ranges = whole(n);
  } else {
    const optim::ShardedAdamWT<T>& opt = zopt_->adamw();
    const auto shard = [&](optim::StateKind k) {
      HostView1<float> h = host_zeros(opt.shard_size());
      opt.get_state(k, h);
      return HostState{opt.pieces(), h};
    };
    if (opt.has_master()) params = shard(optim::StateKind::master);
    else if (zero == 3) params = {opt.pieces(), host_float<T>(exec, sync_->shard_params())};
    else params = {whole(n), host_float<T>(exec, model_.params())};
    m = shard(optim::StateKind::exp_avg);
    v = shard(optim::StateKind::exp_avg_sq);
    if (zero >= 1) {
      ranges = opt.pieces();
    } else {
      const std::size_t d = static_cast<std::size_t>(par_->dp_rank());
      const std::size_t D = static_cast<std::size_t>(par_->dp_size());
      ranges = {ShardPiece{n * d / D, 0, n * (d + 1) / D - n * d / D}};
    }
  }
  std::vector<io::SaveGroup> groups{{io::kModelPrefix, {}, {}},
                                    {io::kExpAvgPrefix, {}, {}},
                                    {io::kExpAvgSqPrefix, {}, {}}};
  const HostState* states[] = {&params, &m, &v};
  for (int g = 0; g < 3; ++g)
    add_pieces(reg, ranges, true, *states[g], groups[g].pieces, groups[g].data);

  io::CheckpointAttributes a;
  a.tokens_seen = steps_done * tokens_per_step();
  a.seed = cfg_.seed;
  a.loss_scale = scaler_.scale();
  a.loss_scale_good_steps = scaler_.good_steps();
  a.loss_scale_skipped = scaler_.skipped();
  a.config_text = cfg_.config_text;
  a.model = model_.config();
  if (par_) {
    const auto& c = par_->config();
    a.layout = {c.shape.dp, c.shape.pp, c.shape.tp, zero, c.order.str()};
  }
  a.extra["train.precision"] = std::is_same_v<T, float> ? "fp32" : "16-bit";
  a.extra["train.tokens_per_step"] = std::to_string(tokens_per_step());
  if (!skipped_batches_.empty()) a.extra["train.skipped_batches"] = format_batches(skipped_batches_);

  io::CheckpointWriter writer(world_comm(), cfg_.ckpt.dir, steps_done);
  writer.write(a, groups, cfg_.ckpt.transfer);
  const int rank = par_ ? par_->world().rank() : 0;
  if (cfg_.test.crash_at_checkpoint == steps_done && rank == 0) {
    logging::each("test hook: rank 0 kills itself after writing ", writer.tmp_path());
    std::raise(SIGKILL);
  }
  last_checkpoint_ = writer.commit(cfg_.ckpt.keep);
  return last_checkpoint_;
}

template <class T>
io::CheckpointAttributes TrainerT<T>::restore(const std::string& spec) {
  const model::ParameterRegistry& reg = model_.registry();
  const std::size_t n = reg.size();
  const ExecSpace exec = model_.exec();
  const bool zero3 = par_ && par_->config().dp.zero_stage == 3;
  const std::vector<ShardPiece> opt_pieces = par_ ? zopt_->adamw().pieces() : whole(n);
  const std::size_t opt_size = par_ ? zopt_->adamw().shard_size() : n;

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
  const Timer t;
  io::CheckpointAttributes a =
      io::load_checkpoint(world_comm(), spec, model_.config(), groups, cfg_.ckpt.verify,
                          cfg_.ckpt.dir, cfg_.ckpt.transfer);

  if (!par_) {
    from_host_float<T>(exec, params.data, model_.params());
    if constexpr (!std::is_same_v<T, float>)
      from_host_float<float>(exec, params.data, opt_->master());
    from_host_float<float>(exec, m.data, opt_->exp_avg());
    from_host_float<float>(exec, v.data, opt_->exp_avg_sq());
  } else {
    optim::ShardedAdamWT<T>& opt = zopt_->adamw();
    if (zero3) {
      from_host_float<T>(exec, params.data, sync_->shard_params());
      sync_->params_updated();  // drop any gathered copy of the old values
    } else {
      from_host_float<T>(exec, params.data, model_.params());
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
  }
  scaler_.set_state(static_cast<float>(a.loss_scale), static_cast<int>(a.loss_scale_good_steps),
                    a.loss_scale_skipped);
  start_step_ = a.step;
  last_checkpoint_ = a.path;
  const auto skipped = a.extra.find("train.skipped_batches");
  skipped_batches_ = skipped == a.extra.end() ? std::vector<std::int64_t>{}
                                              : parse_batches(skipped->second);

  const auto& L = a.layout;
  logging::info("resumed from ", a.path, " after step ", a.step, " (", a.tokens_seen,
                " tokens; saved under dp ", L.dp, " x pp ", L.pp, " x tp ", L.tp, ", ZeRO ", L.zero,
                ") in ", static_cast<long long>(t.seconds() * 1e3 + 0.5), " ms");
  if (a.seed != cfg_.seed)
    logging::warn("train.seed=", cfg_.seed, " differs from the checkpoint's seed ", a.seed,
                  ": the data order from here on is not the one the saved run would have seen");
  if (a.step > 0 && a.tokens_seen != a.step * tokens_per_step())
    logging::warn("the checkpoint saw ", a.tokens_seen / a.step, " tokens per step, this run "
                  "trains ", tokens_per_step(), ": the global batch changed");
  if (a.step >= cfg_.steps)
    logging::warn("the checkpoint is at step ", a.step, " and train.steps=", cfg_.steps,
                  ": nothing left to train");
  return a;
}

template <class T>
void TrainerT<T>::signal_test_hooks(std::int64_t steps_done) {
  const auto& h = cfg_.test;
  const int rank = par_ ? par_->world().rank() : 0;
  const int size = par_ ? par_->world().size() : 1;
  if (h.signal_at_step == steps_done && rank == (h.signal_rank < 0 ? size - 1 : h.signal_rank)) {
    logging::each("test hook: raising SIGUSR1 after step ", steps_done);
    std::raise(SIGUSR1);
  }
  if (h.wait_signal_at_step == steps_done && rank == 0) {
    logging::each("test hook: waiting for a stop signal after step ", steps_done);
    const Timer t;
    while (!signals::stop_requested() && t.seconds() < 120) usleep(10000);
  }
}

#define MESHTRAIN_TRAINER_CKPT(T)                                                    \
  template MPI_Comm TrainerT<T>::world_comm() const;                                 \
  template std::string TrainerT<T>::save_checkpoint(std::int64_t);                   \
  template io::CheckpointAttributes TrainerT<T>::restore(const std::string&);       \
  template void TrainerT<T>::signal_test_hooks(std::int64_t);
MESHTRAIN_TRAINER_CKPT(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_TRAINER_CKPT(bf16)
MESHTRAIN_TRAINER_CKPT(fp16)
#endif
#undef MESHTRAIN_TRAINER_CKPT

}  // namespace meshtrain::train
