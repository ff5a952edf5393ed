#include "meshtrain/train/trainer.hpp"

#include <algorithm>
#include <climits>
#include <fstream>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "meshtrain/core/json.hpp"

#include "meshtrain/core/fault_injection.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/core/memory.hpp"
#include "meshtrain/core/profile.hpp"
#include "meshtrain/core/signals.hpp"
#include "meshtrain/core/timer.hpp"

namespace meshtrain::train {

std::string format_duration(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t < 60) std::snprintf(buf, sizeof buf, "%lds", t);
  else if (t < 3600) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  return buf;
}

parallel::EngineOptions engine_options(const TrainConfig& cfg,
                                       const parallel::ParallelConfig& parallel, bool recompute) {
  parallel::EngineOptions o;
  o.parallel = parallel;
  o.micro_batch = cfg.micro_batch;
  o.seq_len = cfg.seq_len;
  o.n_micro = cfg.grad_accum;
  o.recompute = recompute;
  o.adamw = cfg.adamw;
  return o;
}

template <class T>
TrainerT<T>::TrainerT(parallel::Engine<T>& engine, const TrainConfig& cfg,
                      const io::TokenDataset& train, const io::TokenDataset* val)
    : TrainerT(engine, cfg, io::BlendedDataset({{"train", 1.0, &train, val}}, false)) {}

template <class T>
TrainerT<T>::TrainerT(parallel::Engine<T>& engine, const TrainConfig& cfg, io::BlendedDataset data)
    : engine_(engine),
      cfg_(cfg),
      data_(std::move(data)),
      scaler_(optim::LossScalerConfig{cfg.loss_scale_init, cfg.loss_scale_window,
                                      cfg.loss_scale_min, 16777216.0f,
                                      cfg.loss_scale_hysteresis,
                                      cfg.loss_scale_consecutive_hysteresis,
                                      !cfg.loss_scale_static}),
      guard_(cfg.divergence, cfg.loss_scaling) {
  MESHTRAIN_CONFIG_CHECK(cfg_.micro_batch == engine.micro_batch(), "train.micro_batch mismatch");
  MESHTRAIN_CONFIG_CHECK(cfg_.seq_len == engine.seq_len(), "train.seq_len mismatch");
  MESHTRAIN_CONFIG_CHECK(cfg_.grad_accum > 0, "train.grad_accum=", cfg_.grad_accum,
                         " must be positive");
  MESHTRAIN_CONFIG_CHECK(cfg_.grad_accum == engine.n_micro(), "train.grad_accum mismatch");
  MESHTRAIN_CONFIG_CHECK(data_.seq_len() == cfg_.seq_len, "dataset windows do not match seq_len");
  // Opened for appending here (to fail early), on world rank 0 only; run() truncates it unless
  // it continues a restored run, whose earlier records the file keeps.
  metrics_.open(cfg_.metrics_file, engine_.world_rank() == 0, true);
  tensorboard_.open(cfg_.tensorboard_dir, engine_.world_rank() == 0);
  // Asynchronous saves: the writer's communicator and the staging buffers now, not at the
  // first save (the memory preflight counted them; pinning takes a while on GPU nodes).
  if (cfg_.ckpt.async_write && !cfg_.ckpt.dir.empty()) {
    writer_ = engine_.background_writer();
    engine_.reserve_checkpoint_staging();
  }
}

template <class T>
StepMetrics TrainerT<T>::step(std::int64_t s, bool read_back) {
  Timer t;
  StepMetrics m;
  m.ckpt_writing = writer_ && writer_->state() == io::BackgroundWriter::State::writing;
  // Every target of a full window counts, so the global count is known without communication.
  const float loss_scale = cfg_.loss_scaling ? scaler_.scale() : 1.0f;
  // The step's global batch is a function of (seed, batch index) only (invariant 3); the batch
  // index is the step's unless rollbacks left batches out.
  const std::int64_t data_batch = io::batch_of_step(s, skipped_batches_);
  float grad_scale = 1.0f / static_cast<float>(tokens_per_step());
  if (fault::hooks().nan_batch >= 0 && data_batch == fault::hooks().nan_batch)
    grad_scale = NAN;  // test hook: a batch whose gradients are not finite
  const int global_batch = engine_.global_batch();
  const auto batch = [&](int first, int count, std::int32_t* in, std::int32_t* tg) {
    data_.fill(cfg_.seed, data_batch, global_batch, first, count, in, tg);
  };
  const parallel::StepComm c = engine_.forward_backward(batch, grad_scale * loss_scale);
  // The finite check runs for every precision: a non-finite update is never applied.
  const bool applied = engine_.optimizer_step(s, loss_scale, true);
  if (cfg_.loss_scaling) scaler_.update(applied);
  m.step = s;
  m.loss_scale = loss_scale;
  m.skipped = !applied;
  m.lr = optim::lr_at(cfg_.adamw, s);
  m.bubble = c.bubble;
  m.dp_comm_ms = c.dp_comm_ms;
  m.dp_hidden = c.dp_hidden;
  m.tp_comm_ms = c.tp_comm_ms;
  m.comm_reported = c.reported;
  m.pipelined = c.pipelined;
  if (read_back) this->read_back(m);  // the one host synchronisation of a logged step
  engine_.fence();
  m.step_seconds = t.seconds();
  m.tokens_per_second = tokens_per_step() / m.step_seconds;
  // Model FLOP/s per device, as MFU is defined (Megatron, PaLM): total over the job / ranks.
  m.tflops = engine_.config().flops_per_token(cfg_.seq_len) * m.tokens_per_second / 1e12 /
             engine_.world_size();
  m.mfu = cfg_.peak_tflops > 0 ? m.tflops / cfg_.peak_tflops : 0;
  m.fp8_share = cfg_.fp8_flops_share;
  m.memory_bytes = kDeviceIsHost ? host_peak_rss_bytes() : device_used_bytes();
  // What each source has supplied: a function of the data order, the same on every rank.
  const std::vector<std::uint64_t> before = data_.drawn(data_batch, global_batch);
  const std::vector<std::uint64_t> after = data_.drawn(data_batch + 1, global_batch);
  for (std::uint64_t n : after) m.source_tokens.push_back(n * static_cast<std::uint64_t>(cfg_.seq_len));
  report_epochs(s, before, after);
  return m;
}

template <class T>
void TrainerT<T>::read_back(StepMetrics& m) {
  m.loss = engine_.global_loss_sum() * (1.0f / static_cast<float>(tokens_per_step()));
  m.grad_norm = engine_.grad_norm();
  m.moe = engine_.moe_metrics();
  for (const auto& l : m.moe) {
    m.moe_aux += l.aux;
    m.moe_z += l.z;
  }
}

template <class T>
void TrainerT<T>::log_step(const StepMetrics& m, double eta) {
  char line[320];
  std::snprintf(line, sizeof line,
                "step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %9.0f tok/s | %.3f TFLOP/s"
                " | MFU %5.1f%% | mem %.0f MiB | %6.1f ms | ETA %s",
                static_cast<long long>(m.step + 1), static_cast<long long>(cfg_.steps), m.loss,
                m.lr, m.grad_norm, m.tokens_per_second, m.tflops, 100.0 * m.mfu,
                m.memory_bytes / 1048576.0, m.step_seconds * 1e3, format_duration(eta).c_str());
  std::string text = line;
  if (m.fp8_share > 0) text += cat(" | FP8 ", std::lround(100.0 * m.fp8_share), "% of FLOPs");
  if (cfg_.loss_scaling)
    text += cat(" | scale ", m.loss_scale, m.skipped ? " (inf/nan: step skipped)" : "");
  if (!m.moe.empty()) {  // one field over the MoE blocks: worst balance and drops, expert time
    double cv = 0, drop = 0, ms = 0, a2a = 0;
    for (const auto& l : m.moe) {
      cv = std::max(cv, l.load_cv);
      drop = std::max(drop, l.dropped);
      ms += l.expert_ms;
      a2a += l.a2a_ms;
    }
    char extra[200];
    std::snprintf(extra, sizeof extra,
                  " | moe aux %.4f z %.4f cv %.2f drop %.1f%% a2a %.1f/%.1f ms", m.moe_aux,
                  m.moe_z, cv, 100.0 * drop, a2a, ms);
    text += extra;
  }
  if (m.comm_reported) {
    char extra[160];
    std::snprintf(extra, sizeof extra, " | dp comm %.1f ms (%.0f%% hidden) | tp comm %.1f ms",
                  m.dp_comm_ms, 100.0 * m.dp_hidden, m.tp_comm_ms);
    text += extra;
    if (m.pipelined) text += cat(" | bubble ", static_cast<int>(100 * m.bubble + 0.5), "%");
  }
  logging::info(text);
  Json record = step_record(m, engine_.world_size(), tokens_per_step());
  if (data_.blended()) {
    Json by = Json::object();
    for (std::size_t i = 0; i < m.source_tokens.size(); ++i)
      by[data_.sources()[i].name] = m.source_tokens[i];
    record["tokens_by_source"] = by;
  }
  metrics_.write(record);
  if (tensorboard_.active()) {
    const double ms = m.step_seconds * 1e3;
    std::vector<std::pair<std::string, double>> v = {
        {"train/loss", m.loss},           {"train/lr", m.lr},
        {"train/grad_norm", m.grad_norm}, {"perf/tokens_per_s", m.tokens_per_second},
        {"perf/step_ms", ms},             {"perf/tflops", m.tflops},
        {"memory/gib", m.memory_bytes / 1073741824.0}};
    if (cfg_.peak_tflops > 0) v.emplace_back("perf/mfu", m.mfu);
    if (cfg_.loss_scaling) v.emplace_back("train/loss_scale", m.loss_scale);
    if (m.comm_reported) {  // shares of the step: the seeds' "communication over 30 %"
      v.emplace_back("comm/dp_ms", m.dp_comm_ms);
      v.emplace_back("comm/dp_hidden", m.dp_hidden);
      v.emplace_back("comm/dp_exposed_share", ms > 0 ? m.dp_comm_ms * (1 - m.dp_hidden) / ms : 0);
      v.emplace_back("comm/tp_share", ms > 0 ? m.tp_comm_ms / ms : 0);
      if (m.pipelined) v.emplace_back("pipeline/bubble", m.bubble);
    }
    tensorboard_.scalars(m.step + 1, v);
  }
}

template <class T>
void TrainerT<T>::record_memory_per_rank(std::int64_t done) {
  if (cfg_.memory_file.empty()) return;  // the same on every rank
  const int n = engine_.world_size();
  std::vector<int> kib(static_cast<std::size_t>(n), 0);
  const std::size_t mine = kDeviceIsHost ? host_peak_rss_bytes() : device_used_bytes();
  kib[static_cast<std::size_t>(engine_.world_rank())] = static_cast<int>(
      std::min<std::size_t>(mine / 1024, static_cast<std::size_t>(INT32_MAX)));
  engine_.max_over_ranks(kib.data(), n);
  if (engine_.world_rank() != 0) return;
  Json per = Json::array();
  for (int k : kib) per.push_back(static_cast<std::int64_t>(k) * 1024);
  const Json rec{{"step", done}, {"memory_per_rank", per},
                 {"memory_capacity_bytes", device_capacity_bytes()}};
  std::ofstream out(cfg_.memory_file);
  out << json::dump(rec) << "\n";
  if (!out) logging::warn("cannot write '", cfg_.memory_file, "': the doctor will not see every "
                          "rank's peak memory");
}

template <class T>
StepMetrics TrainerT<T>::run() {
  // Copies of the model that each train on their share of the global batch.
  const int replicas = engine_.global_batch() / (cfg_.micro_batch * cfg_.grad_accum);
  logging::info("training: ", cfg_.steps, " steps of ", tokens_per_step(), " tokens (micro-batch ",
                cfg_.micro_batch, " x ", cfg_.grad_accum, " accumulation",
                replicas > 1 ? cat(" x ", replicas, " replicas") : std::string(), " x seq ",
                cfg_.seq_len, "), ", data_.num_windows(), " training windows",
                start_step_ > 0 ? cat("; continuing after step ", start_step_) : std::string());
  describe_data();
  if (metrics_ && start_step_ == 0)  // a fresh run starts a fresh file
    metrics_.open(cfg_.metrics_file, true, false);
  const CheckpointConfig& ck = cfg_.ckpt;
  bool has_val = false;
  for (const auto& src : data_.sources()) has_val = has_val || src.val;
  StepMetrics last;
  double elapsed = 0;
  std::int64_t timed = 0;
  for (std::int64_t s = start_step_; s < cfg_.steps; ++s) {
    const std::int64_t done = s + 1;  // steps completed after this one
    bool logged = cfg_.log_every > 0 && (done % cfg_.log_every == 0 || s == start_step_ ||
                                         done == cfg_.steps);
    if (!capturing_ && (done == cfg_.profile_first ||
                        (s == start_step_ && done > cfg_.profile_first &&
                         done <= cfg_.profile_last))) {
      prof::capture_start();  // profile.steps A:B (nsys --capture-range=cudaProfilerApi)
      capturing_ = true;
    }
    {
      const prof::Range r([&] { return cat("step ", done); });
      last = step(s, logged);
    }
    if (capturing_ && done >= cfg_.profile_last) {
      engine_.fence();  // the captured steps' kernels finish inside the window
      prof::capture_stop();
      capturing_ = false;
    }
    if (s > start_step_) {  // the first step includes one-time start-up costs
      elapsed += last.step_seconds;
      ++timed;
    }
    // Every rank takes the same decisions: the stop flag and the step's health are agreed
    // over the world. Nothing is saved from a step that was not finite.
    const Boundary b = agree_at_boundary(done, last);
    after_boundary(b, done);  // a background write ended: collected, or the run ends here
    const DivergenceAction act = guard_.on_step(s, b.health);
    if (act == DivergenceAction::stop) {  // show the step, then end the run on every rank
      if (!logged) read_back(last);
      log_step(last, 0);
      diverged(done);
    }
    if (act == DivergenceAction::rollback && !b.stop) {
      s = roll_back(s) - 1;
      continue;
    }
    if (act == DivergenceAction::skip && !(cfg_.loss_scaling && b.health.loss_finite))
      logging::warn(guard_.reason());  // loss scaling's own skips show in the progress line
    const bool stop = b.stop;
    // (A skipped step left the state as the previous step did; a rollback that a stop signal
    // pre-empted saves nothing: `latest` already holds the state to continue from.)
    const bool save = act != DivergenceAction::rollback && !ck.dir.empty() &&
                      (stop || (ck.every > 0 && done % ck.every == 0) ||
                       (ck.final && done == cfg_.steps));
    std::string saved;
    if (save) {
      if (!logged && cfg_.log_every > 0) {  // a checkpoint step is always logged
        read_back(last);
        logged = true;
      }
      const Timer t;
      if (writer_) {
        start_save(done);
        // The run ends here: the write completes first (stop signal: then exit 3).
        if (stop || done == cfg_.steps) finish_save(done, false);
      } else {
        save_checkpoint(done);
      }
      saved = last_checkpoint_;
      last.ckpt_ms = t.seconds() * 1e3;
    }
    const double per_step = timed ? elapsed / timed : last.step_seconds;
    if (logged) log_step(last, per_step * (cfg_.steps - done));
    if (save && writer_ && writer_->in_flight())
      logging::info("checkpoint of step ", done, " staged in ",
                    static_cast<long long>(last.ckpt_ms + 0.5), " ms; writing ",
                    io::checkpoint_file_name(done), " in the background");
    else if (save)
      logging::info("saved checkpoint ", saved, " (step ", done, ", ",
                    static_cast<long long>(last.ckpt_ms + 0.5), " ms)");
    if (stop) {
      finish_save(done);  // one still in flight when the stop saved nothing (a rollback's)
      if (capturing_) prof::capture_stop();
      capturing_ = false;
      logging::warn("stop requested (SIGUSR1/SIGTERM) after step ", done, "/", cfg_.steps, ": ",
                    save ? "checkpoint saved, stopping" : "no ckpt.dir, stopping without a save");
      stopped_ = true;
      return last;
    }
    if (has_val && cfg_.eval_every > 0 && done % cfg_.eval_every == 0 && done != cfg_.steps)
      log_eval(done, evaluate_sources(), false);
  }
  finish_save(cfg_.steps);  // the end of the run waits for a write still in flight
  if (capturing_) prof::capture_stop();
  capturing_ = false;
  record_memory_per_rank(cfg_.steps);
  if (has_val) log_eval(cfg_.steps, evaluate_sources(), true);
  return last;
}

template class TrainerT<float>;
#if MESHTRAIN_HAVE_BF16
template class TrainerT<bf16>;
template class TrainerT<fp16>;
#endif

}  // namespace meshtrain::train
