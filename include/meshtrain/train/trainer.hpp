#pragma once
// The training loop: micro-batches with gradient accumulation, AdamW with warmup + cosine LR,
// evaluation on the validation split every N steps, a progress line per step (loss, lr, grad
// norm, tokens/s, model TFLOP/s and MFU, memory, ETA) and a JSON-lines metrics file for plots.
#include <cstdint>
#include <fstream>
#include <string>

#include "meshtrain/io/dataset.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/optim/adamw.hpp"
#include "meshtrain/optim/loss_scaler.hpp"

namespace meshtrain::train {

struct TrainConfig {
  int micro_batch = 8;
  int grad_accum = 1;         // micro-batches per step on each data-parallel rank
  int seq_len = 128;
  std::int64_t steps = 100;
  std::uint64_t seed = 1337;
  int eval_every = 50;        // 0: never (the final evaluation still runs when val data exists)
  int eval_batches = 8;
  int log_every = 1;
  double peak_tflops = 0;     // for MFU; 0: not reported
  std::string metrics_file;   // JSON lines; empty: none
  optim::AdamWConfig adamw;
  bool loss_scaling = false;  // dynamic loss scaling (fp16)
  float loss_scale_init = 65536.0f;
  int loss_scale_window = 1000;
};

struct StepMetrics {
  std::int64_t step = 0;
  float loss = 0, lr = 0, grad_norm = 0;
  double step_seconds = 0, tokens_per_second = 0, tflops = 0, mfu = 0;
  std::size_t memory_bytes = 0;
  float loss_scale = 1;   // the scale this step used (1 without loss scaling)
  bool skipped = false;   // inf/nan gradients: the update was skipped
};

template <class T>
class TrainerT {
 public:
  // `val` may be null (no evaluation).
  TrainerT(model::GptT<T>& model, const TrainConfig& cfg, const io::TokenDataset& train,
           const io::TokenDataset* val);

  // Runs cfg.steps steps from step 0. Returns the metrics of the last step.
  StepMetrics run();
  // One optimizer step (0-based index); synchronises only when the step is logged.
  StepMetrics step(std::int64_t step, bool read_back);
  // Mean loss over cfg.eval_batches sequential validation batches.
  float evaluate();
  std::int64_t tokens_per_step() const;

 private:
  void log_step(const StepMetrics& m, double eta_seconds);
  model::GptT<T>& model_;
  TrainConfig cfg_;
  const io::TokenDataset& train_;
  const io::TokenDataset* val_;
  optim::AdamWT<T> opt_;
  optim::DynamicLossScaler scaler_;
  View1<std::int32_t> inputs_, targets_;
  HostView1<std::int32_t> h_inputs_, h_targets_;
  std::ofstream metrics_;
};

using Trainer = TrainerT<float>;

// Human-readable duration: 45s, 3m12s, 1h04m.
std::string format_duration(double seconds);

}  // namespace meshtrain::train
