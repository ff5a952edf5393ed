#include "meshtrain/train/trainer.hpp"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "meshtrain/core/log.hpp"
#include "meshtrain/core/memory.hpp"
#include "meshtrain/core/signals.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/comm/flight_recorder.hpp"
#include "meshtrain/parallel/context.hpp"
#include "meshtrain/parallel/grad_sync.hpp"
#include "meshtrain/parallel/pipeline_runner.hpp"
#include "meshtrain/parallel/zero_optimizer.hpp"

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

template <class T>
TrainerT<T>::TrainerT(model::GptT<T>& model, const TrainConfig& cfg, const io::TokenDataset& train,
                      const io::TokenDataset* val, const parallel::ParallelContext* par)
    : model_(model),
      cfg_(cfg),
      train_(train),
      val_(val),
      par_(par),
      scaler_(cfg.loss_scale_init, cfg.loss_scale_window),
      guard_(cfg.divergence, cfg.loss_scaling) {
  MESHTRAIN_CONFIG_CHECK(cfg_.micro_batch == model.micro_batch(), "train.micro_batch mismatch");
  MESHTRAIN_CONFIG_CHECK(cfg_.seq_len == model.seq_len(), "train.seq_len mismatch");
  MESHTRAIN_CONFIG_CHECK(cfg_.grad_accum > 0, "train.grad_accum=", cfg_.grad_accum,
                         " must be positive");
  MESHTRAIN_CONFIG_CHECK(train_.seq_len() == cfg_.seq_len, "dataset windows do not match seq_len");
  const std::size_t n = static_cast<std::size_t>(cfg_.micro_batch) * cfg_.seq_len;
  inputs_ = alloc<std::int32_t>("batch.inputs", n);
  targets_ = alloc<std::int32_t>("batch.targets", n);
  h_inputs_ = Kokkos::create_mirror_view(inputs_);
  h_targets_ = Kokkos::create_mirror_view(targets_);
  if (!par_) {
    opt_ = std::make_unique<optim::AdamWT<T>>(model.registry(), cfg.adamw, model.exec());
    opt_->init_master(model_.params());
  } else {
    sync_ = std::make_unique<parallel::GradSync<T>>(parallel::model_buffers(model), par_->dp(),
                                                    par_->config().dp, model.exec());
    model_.set_hooks(sync_.get());
    if (par_->config().shape.pp > 1) {
      sync_->set_embedding_group(par_->embedding());
      // The schedule interleaves micro-batches of different units: ZeRO 0/1 reduce a bucket
      // once its units have completed every micro-batch's backward.
      sync_->set_micro_batches(cfg_.grad_accum);
    }
    zopt_ = std::make_unique<parallel::ZeroOptimizer<T>>(
        *sync_, cfg.adamw, &par_->model_parallel(), model.exec());
    if (par_->config().shape.pp > 1) {
      runner_ = std::make_unique<parallel::PipelineRunner<T>>(model_, par_->pp(),
                                                              par_->schedule(), par_->stage());
      for (int m = 0; m < cfg_.grad_accum; ++m) {
        mb_inputs_.push_back(alloc<std::int32_t>("batch.inputs", n));
        mb_targets_.push_back(alloc<std::int32_t>("batch.targets", n));
      }
    }
    if (par_->config().dp.zero_stage < 3) parameters_ready();
  }
  // Opened for appending here (to fail early), on world rank 0 only; run() truncates it unless
  // it continues a restored run, whose earlier records the file keeps.
  metrics_.open(cfg_.metrics_file, !par_ || par_->world().rank() == 0, true);
}

template <class T>
TrainerT<T>::~TrainerT() {
  if (par_) model_.set_hooks(nullptr);
}

template <class T>
void TrainerT<T>::parameters_ready(View1<const T> full) {
  if (!par_) return;
  if (par_->config().dp.zero_stage == 3) {
    MESHTRAIN_CHECK(full.span() >= model_.registry().size(),
                    "ZeRO-3: parameters_ready needs the initialised full parameter buffer");
    sync_->scatter_params(full);
  }
  zopt_->init_master();
}

template <class T>
View1<const T> TrainerT<T>::full_parameters(View1<T> out) {
  if (!par_ || par_->config().dp.zero_stage < 3) return model_.params();
  sync_->gather_params(out);
  return out;
}

template <class T>
std::int64_t TrainerT<T>::tokens_per_step() const {
  const std::int64_t dp = par_ ? par_->dp_size() : 1;
  return static_cast<std::int64_t>(cfg_.micro_batch) * cfg_.grad_accum * cfg_.seq_len * dp;
}

// Micro-batch `micro` of this dp rank in step s: sequences [first, first + micro_batch) of the
// global batch, which is a function of (seed, step) only (invariant 3).
template <class T>
void TrainerT<T>::fill_micro_batch(std::int64_t s, int micro, View1<std::int32_t> in,
                                   View1<std::int32_t> tg, HostView1<std::int32_t> hin,
                                   HostView1<std::int32_t> htg) {
  const int dp = par_ ? par_->dp_size() : 1, dp_rank = par_ ? par_->dp_rank() : 0;
  const int global_batch = cfg_.micro_batch * cfg_.grad_accum * dp;
  const int first = (dp_rank * cfg_.grad_accum + micro) * cfg_.micro_batch;
  train_.fill(cfg_.seed, batch_of_step(s, skipped_batches_), global_batch, first, cfg_.micro_batch,
              hin.data(), htg.data());
  // The host fills the next batch while the device may still run the previous micro-batch;
  // deep_copy into the device buffer orders itself after it.
  Kokkos::deep_copy(model_.exec(), in, hin);
  Kokkos::deep_copy(model_.exec(), tg, htg);
}

template <class T>
void TrainerT<T>::single_rank_micro_batches(std::int64_t s, float grad_scale) {
  model_.zero_grads();
  for (int mb = 0; mb < cfg_.grad_accum; ++mb) {
    fill_micro_batch(s, mb, inputs_, targets_, h_inputs_, h_targets_);
    model_.forward_train(inputs_, targets_, grad_scale);
    model_.backward();
  }
}

template <class T>
void TrainerT<T>::parallel_micro_batches(std::int64_t s, float grad_scale, StepMetrics& m) {
  sync_->reset_stats();
  sync_->begin_step();
  const double tp0 = model_.tp_comm_seconds();
  if (!runner_) {
    for (int mb = 0; mb < cfg_.grad_accum; ++mb) {
      fill_micro_batch(s, mb, inputs_, targets_, h_inputs_, h_targets_);
      sync_->set_last_micro(mb + 1 == cfg_.grad_accum);
      model_.forward_train(inputs_, targets_, grad_scale);
      model_.backward();
    }
  } else {
    // Every stage reads the micro-batch: the first embeds its tokens, the last needs the
    // targets (the data is local, so no stage waits for another's batch).
    for (int mb = 0; mb < cfg_.grad_accum; ++mb)
      fill_micro_batch(s, mb, mb_inputs_[mb], mb_targets_[mb], h_inputs_, h_targets_);
    const auto st = runner_->step(
        [&](int micro) {
          return parallel::MicroBatch{mb_inputs_[static_cast<std::size_t>(micro)],
                                      mb_targets_[static_cast<std::size_t>(micro)]};
        },
        grad_scale);
    m.bubble = st.bubble();
  }
  // Waits for the buckets; with pp > 1 also sums the tied wte gradient of the first and last
  // stage over the embedding group, which keeps the two copies identical after the update.
  sync_->finish();
  m.tp_comm_ms = (model_.tp_comm_seconds() - tp0) * 1e3;
}

template <class T>
float TrainerT<T>::global_loss_sum() const {
  float loss_sum = 0;
  Kokkos::deep_copy(loss_sum, model_.loss_sum());
  if (!par_) return loss_sum;
  // The last stage's tp rank 0 of every dp rank holds a share of the global batch's loss.
  double total = par_->last_stage() && par_->tp_rank() == 0 ? loss_sum : 0.0;
  world_all_reduce(&total, 1, MPI_DOUBLE, MPI_SUM);
  return static_cast<float>(total);
}

template <class T>
StepMetrics TrainerT<T>::step(std::int64_t s, bool read_back) {
  Timer t;
  StepMetrics m;
  // Every target of a full window counts, so the global count is known without communication.
  const float loss_scale = cfg_.loss_scaling ? scaler_.scale() : 1.0f;
  float grad_scale = 1.0f / static_cast<float>(tokens_per_step());
  if (cfg_.test.nan_batch >= 0 && batch_of_step(s, skipped_batches_) == cfg_.test.nan_batch)
    grad_scale = NAN;  // test hook: a batch whose gradients are not finite
  model_.reset_loss_sum();
  bool applied = true;
  if (!par_) {
    single_rank_micro_batches(s, grad_scale * loss_scale);
    // The finite check runs for every precision: a non-finite update is never applied.
    applied = opt_->step(model_.params(), model_.grads(), s, loss_scale, true);
  } else {
    parallel_micro_batches(s, grad_scale * loss_scale, m);
    applied = zopt_->step(s, loss_scale, true);
    const auto gs = sync_->grad_stats();
    m.dp_comm_ms = gs.total_seconds * 1e3;
    m.dp_hidden = gs.hidden_fraction();
  }
  if (cfg_.loss_scaling) scaler_.update(applied);
  m.step = s;
  m.loss_scale = loss_scale;
  m.skipped = !applied;
  m.lr = optim::lr_at(cfg_.adamw, s);
  if (read_back) this->read_back(m);  // the one host synchronisation of a logged step
  model_.exec().fence();
  m.step_seconds = t.seconds();
  m.tokens_per_second = tokens_per_step() / m.step_seconds;
  const int ranks = par_ ? par_->mesh().size() : 1;
  // Model FLOP/s per device, as MFU is defined (Megatron, PaLM): total over the job / ranks.
  m.tflops = model_.config().flops_per_token(cfg_.seq_len) * m.tokens_per_second / 1e12 / ranks;
  m.mfu = cfg_.peak_tflops > 0 ? m.tflops / cfg_.peak_tflops : 0;
  m.memory_bytes = kDeviceIsHost ? host_peak_rss_bytes() : device_used_bytes();
  return m;
}

template <class T>
void TrainerT<T>::read_back(StepMetrics& m) {
  float norm = 0;
  m.loss = global_loss_sum() * (1.0f / static_cast<float>(tokens_per_step()));
  Kokkos::deep_copy(norm, par_ ? zopt_->grad_norm() : opt_->grad_norm());
  m.grad_norm = norm;
}

template <class T>
float TrainerT<T>::evaluate() {
  if (!val_) return NAN;
  model_.reset_loss_sum();
  const std::size_t per_batch = static_cast<std::size_t>(cfg_.micro_batch) * cfg_.seq_len;
  View1<T> x;  // pipeline: the activation arriving from the previous virtual stage
  if (runner_) x = alloc<T>("eval.activation", model_.activation_elems());
  for (int b = 0; b < cfg_.eval_batches; ++b) {
    val_->fill_sequential(static_cast<std::uint64_t>(b) * cfg_.micro_batch, cfg_.micro_batch,
                          h_inputs_.data(), h_targets_.data());
    Kokkos::deep_copy(model_.exec(), inputs_, h_inputs_);
    Kokkos::deep_copy(model_.exec(), targets_, h_targets_);
    if (!runner_) {
      model_.forward_eval(inputs_, targets_);
      continue;
    }
    // Forward only, one micro-batch through the virtual stages in order: stage k % pp runs
    // chunk k / pp, receiving from the previous virtual stage and sending to the next.
    const auto& spec = par_->schedule();
    const int n = spec.n_pieces(), me = par_->stage();
    for (int k = 0; k < n; ++k) {
      if (k % spec.pp != me) continue;
      if (k > 0) par_->pp().recv(x, (k - 1) % spec.pp, 1);
      View1<const T> out = model_.forward(k / spec.pp, 0, inputs_, x, targets_, 0.0f, false);
      if (k + 1 < n) par_->pp().send(out, (k + 1) % spec.pp, 1);
    }
  }
  float sum = 0;
  if (!par_) {
    Kokkos::deep_copy(sum, model_.loss_sum());
  } else {  // every dp rank evaluated the same batches: take dp rank 0's
    Kokkos::deep_copy(sum, model_.loss_sum());
    double total = par_->last_stage() && par_->tp_rank() == 0 && par_->dp_rank() == 0 ? sum : 0.0;
    world_all_reduce(&total, 1, MPI_DOUBLE, MPI_SUM);
    sum = static_cast<float>(total);
  }
  return sum / static_cast<float>(per_batch * cfg_.eval_batches);
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
  if (cfg_.loss_scaling)
    text += cat(" | scale ", m.loss_scale, m.skipped ? " (inf/nan: step skipped)" : "");
  if (par_) {
    char extra[160];
    std::snprintf(extra, sizeof extra, " | dp comm %.1f ms (%.0f%% hidden) | tp comm %.1f ms",
                  m.dp_comm_ms, 100.0 * m.dp_hidden, m.tp_comm_ms);
    text += extra;
    if (runner_) text += cat(" | bubble ", static_cast<int>(100 * m.bubble + 0.5), "%");
  }
  logging::info(text);
  metrics_.write(step_record(m, par_ ? par_->mesh().size() : 1, tokens_per_step()));
}

template <class T>
StepMetrics TrainerT<T>::run() {
  logging::info("training: ", cfg_.steps, " steps of ", tokens_per_step(), " tokens (micro-batch ",
                cfg_.micro_batch, " x ", cfg_.grad_accum, " accumulation",
                par_ ? cat(" x ", par_->dp_size(), " dp ranks") : std::string(), " x seq ",
                cfg_.seq_len, "), ", train_.num_windows(), " training windows",
                start_step_ > 0 ? cat("; continuing after step ", start_step_) : std::string());
  if (metrics_ && start_step_ == 0)  // a fresh run starts a fresh file
    metrics_.open(cfg_.metrics_file, true, false);
  const CheckpointConfig& ck = cfg_.ckpt;
  StepMetrics last;
  double elapsed = 0;
  std::int64_t timed = 0;
  for (std::int64_t s = start_step_; s < cfg_.steps; ++s) {
    const std::int64_t done = s + 1;  // steps completed after this one
    bool logged = cfg_.log_every > 0 && (done % cfg_.log_every == 0 || s == start_step_ ||
                                         done == cfg_.steps);
    last = step(s, logged);
    if (s > start_step_) {  // the first step includes one-time start-up costs
      elapsed += last.step_seconds;
      ++timed;
    }
    // Every rank takes the same decisions: the stop flag and the step's health are agreed
    // over the world. Nothing is saved from a step that was not finite.
    const Boundary b = agree_at_boundary(done, last);
    const DivergenceAction act = guard_.on_step(s, b.health);
    if (act == DivergenceAction::stop) {  // show the step, then end the run on every rank
      if (!logged) read_back(last);
      log_step(last, 0);
      diverged(last);
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
      saved = save_checkpoint(done);
      last.ckpt_ms = t.seconds() * 1e3;
    }
    const double per_step = timed ? elapsed / timed : last.step_seconds;
    if (logged) log_step(last, per_step * (cfg_.steps - done));
    if (save)
      logging::info("saved checkpoint ", saved, " (step ", done, ", ",
                    static_cast<long long>(last.ckpt_ms + 0.5), " ms)");
    if (stop) {
      logging::warn("stop requested (SIGUSR1/SIGTERM) after step ", done, "/", cfg_.steps, ": ",
                    save ? "checkpoint saved, stopping" : "no ckpt.dir, stopping without a save");
      stopped_ = true;
      return last;
    }
    if (val_ && cfg_.eval_every > 0 && done % cfg_.eval_every == 0 && done != cfg_.steps) {
      const float vl = evaluate();
      logging::info("step ", done, " | val loss ", vl);
      metrics_.write({{"step", done}, {"val_loss", vl}});
    }
  }
  if (val_) {
    const float vl = evaluate();
    logging::info("final val loss ", vl, " (", cfg_.eval_batches, " batches)");
    metrics_.write({{"step", cfg_.steps}, {"val_loss", vl}});
  }
  return last;
}

template class TrainerT<float>;
#if MESHTRAIN_HAVE_BF16
template class TrainerT<bf16>;
template class TrainerT<fp16>;
#endif

}  // namespace meshtrain::train
