#pragma once
// The training loop: micro-batches with gradient accumulation, AdamW with warmup + cosine LR,
// evaluation on the validation split every N steps, a progress line per step (loss, lr, grad
// norm, tokens/s, model TFLOP/s and MFU, memory, ETA) and a JSON-lines metrics file for plots.
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/io/dataset.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/optim/adamw.hpp"
#include "meshtrain/optim/loss_scaler.hpp"

namespace meshtrain::parallel {
class ParallelContext;
template <class T> class GradSync;
template <class T> class ZeroOptimizer;
template <class T> class PipelineRunner;
}  // namespace meshtrain::parallel

namespace meshtrain::train {

struct TrainConfig {
  int micro_batch = 8;
  int grad_accum = 1;         // micro-batches per step on each data-parallel rank (the
                              // pipeline's micro-batch count)
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
  // Parallel runs: pipeline idle share of the step (this rank), dp gradient communication and
  // the share of it hidden behind backward, tensor-parallel communication (host wall time).
  double bubble = 0, dp_comm_ms = 0, dp_hidden = 0, tp_comm_ms = 0;
};

template <class T>
class TrainerT {
 public:
  // `val` may be null (no evaluation). `par` null: one rank holds the whole model. Otherwise the
  // model must have been built with par->layout(); the trainer adds the data-parallel gradient
  // synchronisation (ZeRO 0-3), the pipeline schedule and the sharded optimizer.
  TrainerT(model::GptT<T>& model, const TrainConfig& cfg, const io::TokenDataset& train,
           const io::TokenDataset* val, const parallel::ParallelContext* par = nullptr);
  ~TrainerT();

  // Runs cfg.steps steps from step 0. Returns the metrics of the last step.
  StepMetrics run();
  // One optimizer step (0-based index); synchronises only when the step is logged.
  StepMetrics step(std::int64_t step, bool read_back);
  // Mean loss over cfg.eval_batches sequential validation batches.
  float evaluate();
  std::int64_t tokens_per_step() const;
  // Parallel runs: the optimizer's fp32 master copy (and with ZeRO-3 the parameter shards) from
  // the initialised parameters. The constructor calls it for ZeRO 0-2 (the model's buffer);
  // with ZeRO-3 the caller passes a full flat buffer it initialised (init_parameters_into).
  void parameters_ready(View1<const T> full = {});
  // The full flat parameters of this rank (ZeRO-3: gathered from the shards into `out`;
  // otherwise the model's buffer). Collective over dp with ZeRO-3.
  View1<const T> full_parameters(View1<T> out);

 private:
  void log_step(const StepMetrics& m, double eta_seconds);
  void single_rank_micro_batches(std::int64_t s, float grad_scale);
  void parallel_micro_batches(std::int64_t s, float grad_scale, StepMetrics& m);
  void fill_micro_batch(std::int64_t s, int micro, View1<std::int32_t> in, View1<std::int32_t> tg,
                        HostView1<std::int32_t> hin, HostView1<std::int32_t> htg);
  float global_loss_sum() const;  // collective in parallel runs
  void eval_forward(int chunk_pass);
  model::GptT<T>& model_;
  TrainConfig cfg_;
  const io::TokenDataset& train_;
  const io::TokenDataset* val_;
  const parallel::ParallelContext* par_;
  std::unique_ptr<optim::AdamWT<T>> opt_;                // single rank
  std::unique_ptr<parallel::GradSync<T>> sync_;          // parallel
  std::unique_ptr<parallel::ZeroOptimizer<T>> zopt_;     // parallel
  std::unique_ptr<parallel::PipelineRunner<T>> runner_;  // pp > 1
  optim::DynamicLossScaler scaler_;
  std::vector<View1<std::int32_t>> mb_inputs_, mb_targets_;  // per micro-batch (pipeline)
  View1<std::int32_t> inputs_, targets_;
  HostView1<std::int32_t> h_inputs_, h_targets_;
  std::ofstream metrics_;
};

using Trainer = TrainerT<float>;

// Human-readable duration: 45s, 3m12s, 1h04m.
std::string format_duration(double seconds);

}  // namespace meshtrain::train
