#include "meshtrain/train/trainer.hpp"

#include <cmath>
#include <cstdio>

#include "meshtrain/core/log.hpp"
#include "meshtrain/core/memory.hpp"
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

template <class T>
TrainerT<T>::TrainerT(model::GptT<T>& model, const TrainConfig& cfg, const io::TokenDataset& train,
                      const io::TokenDataset* val)
    : model_(model),
      cfg_(cfg),
      train_(train),
      val_(val),
      opt_(model.registry(), cfg.adamw, model.exec()),
      scaler_(cfg.loss_scale_init, cfg.loss_scale_window) {
  opt_.init_master(model_.params());
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
  if (!cfg_.metrics_file.empty()) {
    metrics_.open(cfg_.metrics_file);
    if (!metrics_)
      throw ConfigError(cat("cannot write the metrics file '", cfg_.metrics_file,
                            "' (train.metrics): check the folder exists and is writable"));
  }
}

template <class T>
std::int64_t TrainerT<T>::tokens_per_step() const {
  return static_cast<std::int64_t>(cfg_.micro_batch) * cfg_.grad_accum * cfg_.seq_len;
}

template <class T>
StepMetrics TrainerT<T>::step(std::int64_t s, bool read_back) {
  Timer t;
  const int global_batch = cfg_.micro_batch * cfg_.grad_accum;
  // Every target of a full window counts, so the global count is known without communication.
  const float loss_scale = cfg_.loss_scaling ? scaler_.scale() : 1.0f;
  const float grad_scale = 1.0f / static_cast<float>(tokens_per_step());
  model_.zero_grads();
  model_.reset_loss_sum();
  for (int mb = 0; mb < cfg_.grad_accum; ++mb) {
    // The host fills the next batch while the device may still run the previous micro-batch;
    // deep_copy into the device buffer orders itself after it.
    train_.fill(cfg_.seed, s, global_batch, mb * cfg_.micro_batch, cfg_.micro_batch,
                h_inputs_.data(), h_targets_.data());
    Kokkos::deep_copy(model_.exec(), inputs_, h_inputs_);
    Kokkos::deep_copy(model_.exec(), targets_, h_targets_);
    model_.forward_train(inputs_, targets_, grad_scale * loss_scale);
    model_.backward();
  }
  const bool applied = opt_.step(model_.params(), model_.grads(), s, loss_scale, cfg_.loss_scaling);
  if (cfg_.loss_scaling) scaler_.update(applied);
  StepMetrics m;
  m.step = s;
  m.loss_scale = loss_scale;
  m.skipped = !applied;
  m.lr = optim::lr_at(cfg_.adamw, s);
  if (read_back) {  // the one host synchronisation of a logged step
    float loss_sum = 0, norm = 0;
    Kokkos::deep_copy(loss_sum, model_.loss_sum());
    Kokkos::deep_copy(norm, opt_.grad_norm());
    m.loss = loss_sum * grad_scale;
    m.grad_norm = norm;
  }
  model_.exec().fence();
  m.step_seconds = t.seconds();
  m.tokens_per_second = tokens_per_step() / m.step_seconds;
  m.tflops = model_.config().flops_per_token(cfg_.seq_len) * m.tokens_per_second / 1e12;
  m.mfu = cfg_.peak_tflops > 0 ? m.tflops / cfg_.peak_tflops : 0;
  m.memory_bytes = kDeviceIsHost ? host_peak_rss_bytes() : device_used_bytes();
  return m;
}

template <class T>
float TrainerT<T>::evaluate() {
  if (!val_) return NAN;
  model_.reset_loss_sum();
  const std::size_t per_batch = static_cast<std::size_t>(cfg_.micro_batch) * cfg_.seq_len;
  for (int b = 0; b < cfg_.eval_batches; ++b) {
    val_->fill_sequential(static_cast<std::uint64_t>(b) * cfg_.micro_batch, cfg_.micro_batch,
                          h_inputs_.data(), h_targets_.data());
    Kokkos::deep_copy(model_.exec(), inputs_, h_inputs_);
    Kokkos::deep_copy(model_.exec(), targets_, h_targets_);
    model_.forward_eval(inputs_, targets_);
  }
  float sum = 0;
  Kokkos::deep_copy(sum, model_.loss_sum());
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
  logging::info(text);
  if (metrics_) {
    metrics_ << "{\"step\": " << m.step + 1 << ", \"loss\": " << m.loss << ", \"lr\": " << m.lr
             << ", \"grad_norm\": " << m.grad_norm << ", \"step_ms\": " << m.step_seconds * 1e3
             << ", \"tokens_per_s\": " << m.tokens_per_second << ", \"tflops\": " << m.tflops
             << ", \"mfu\": " << m.mfu << ", \"memory_bytes\": " << m.memory_bytes
             << ", \"loss_scale\": " << m.loss_scale << ", \"skipped\": " << (m.skipped ? 1 : 0)
             << ", \"tokens\": " << (m.step + 1) * tokens_per_step() << "}\n";
    metrics_.flush();
  }
}

template <class T>
StepMetrics TrainerT<T>::run() {
  logging::info("training: ", cfg_.steps, " steps of ", tokens_per_step(), " tokens (micro-batch ",
            cfg_.micro_batch, " x ", cfg_.grad_accum, " accumulation x seq ", cfg_.seq_len,
            "), ", train_.num_windows(), " training windows");
  StepMetrics last;
  double elapsed = 0;
  std::int64_t timed = 0;
  for (std::int64_t s = 0; s < cfg_.steps; ++s) {
    const bool logged = cfg_.log_every > 0 && ((s + 1) % cfg_.log_every == 0 || s == 0 ||
                                               s + 1 == cfg_.steps);
    last = step(s, logged);
    if (s > 0) {  // the first step includes one-time start-up costs
      elapsed += last.step_seconds;
      ++timed;
    }
    const double per_step = timed ? elapsed / timed : last.step_seconds;
    if (logged) log_step(last, per_step * (cfg_.steps - s - 1));
    if (val_ && cfg_.eval_every > 0 && (s + 1) % cfg_.eval_every == 0 && s + 1 != cfg_.steps) {
      const float vl = evaluate();
      logging::info("step ", s + 1, " | val loss ", vl);
      if (metrics_) metrics_ << "{\"step\": " << s + 1 << ", \"val_loss\": " << vl << "}\n";
    }
  }
  if (val_) {
    const float vl = evaluate();
    logging::info("final val loss ", vl, " (", cfg_.eval_batches, " batches)");
    if (metrics_) metrics_ << "{\"step\": " << cfg_.steps << ", \"val_loss\": " << vl << "}\n";
  }
  return last;
}

template class TrainerT<float>;
#if MESHTRAIN_HAVE_BF16
template class TrainerT<bf16>;
template class TrainerT<fp16>;
#endif

}  // namespace meshtrain::train
