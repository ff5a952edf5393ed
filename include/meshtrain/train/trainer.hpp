#pragma once
// The training loop: micro-batches with gradient accumulation, AdamW with warmup + cosine LR,
// evaluation on the validation split every N steps, a progress line per step (loss, lr, grad
// norm, tokens/s, model TFLOP/s and MFU, memory, ETA) and a JSON-lines metrics file for plots.
//
// Checkpoints (DESIGN "Training under a layout"): at a step boundary the trainer saves the fp32
// parameters and Adam's moments, each data-parallel rank writing only its partition, and any
// layout restores them; a stop signal (SIGUSR1/SIGTERM, agreed over the world at every step
// boundary) saves a checkpoint and ends run() early with stopped() set.
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/io/checkpoint.hpp"
#include "meshtrain/io/dataset.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/optim/adamw.hpp"
#include "meshtrain/optim/loss_scaler.hpp"
#include "meshtrain/train/divergence.hpp"
#include "meshtrain/train/metrics_writer.hpp"

namespace meshtrain::comm {
class FlightRecorder;
}

namespace meshtrain::parallel {
class ParallelContext;
template <class T> class GradSync;
template <class T> class ZeroOptimizer;
template <class T> class PipelineRunner;
}  // namespace meshtrain::parallel

namespace meshtrain::train {

struct CheckpointConfig {
  std::string dir;            // empty: never save (a stop signal still ends the run)
  std::int64_t every = 0;     // save after every N steps; 0: only on a stop signal / at the end
  bool final = true;          // save after the last step
  int keep = 0;               // keep the N newest checkpoints; 0: all
  io::Transfer transfer = io::Transfer::automatic;
  bool verify = true;         // verify the per-tensor checksums on restore
};

// Fault injection for the tests of the executable (set from MESHTRAIN_TEST_* variables by
// `meshtrain train`, never in production runs). Steps count completed steps.
struct TestHooks {
  std::int64_t crash_at_checkpoint = -1;  // rank 0 raises SIGKILL after writing that step's
                                          // .tmp file, before the commit
  std::int64_t signal_at_step = -1;       // world rank signal_rank raises SIGUSR1 after that
  int signal_rank = -1;                   // step (-1: the last rank)
  std::int64_t wait_signal_at_step = -1;  // world rank 0 waits (up to 120 s) at that step's
                                          // boundary until a stop signal arrives from outside
  std::int64_t nan_batch = -1;            // the gradients of data batch N are NaN on every
                                          // rank (a bad batch), wherever it is trained
  std::int64_t throw_at_step = -1;        // world rank throw_rank (-1: the last) throws an
  int throw_rank = -1;                    // Error of its own after that step (not agreed)
};

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
  std::string config_text;    // the resolved configuration (INI), stored in checkpoints
  DivergenceConfig divergence;  // non-finite steps (train.on_nonfinite, ...)
  CheckpointConfig ckpt;
  TestHooks test;
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
  double ckpt_ms = 0;     // a checkpoint was saved after this step, taking this long
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

  // Runs the steps from start_step() to cfg.steps, saving checkpoints as cfg.ckpt says. Ends
  // early, with stopped() set, after saving a checkpoint when a stop signal has arrived on any
  // rank. Returns the metrics of the last step run.
  StepMetrics run();
  // Collective: restores the checkpoint `spec` names (a file, a folder, a `latest` file, or
  // "latest" in cfg.ckpt.dir) into this rank's parameters, master weights, Adam moments and the
  // loss scaler; run() then continues at the saved step. Call it after parameters_ready (it
  // overwrites what that set up). Returns the saved attributes.
  // ConfigError (on every rank) for a missing or corrupt file or another model configuration.
  io::CheckpointAttributes restore(const std::string& spec);
  // Collective: saves the state after `steps_done` completed steps into cfg.ckpt.dir. Returns
  // the committed file.
  std::string save_checkpoint(std::int64_t steps_done);
  std::int64_t start_step() const { return start_step_; }
  bool stopped() const { return stopped_; }
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
  // trainer_guard.cpp: the step boundary's agreement (stop flag and step health, one
  // all-reduce over the world), the rollback, and the end of a diverged run.
  struct Boundary {
    bool stop = false;
    StepHealth health;
  };
  Boundary agree_at_boundary(std::int64_t steps_done, const StepMetrics& m);
  std::int64_t roll_back(std::int64_t step);  // returns the step to continue from
  // In-place MPI_Allreduce over the world, recorded for the watchdog ("world.host").
  void world_all_reduce(void* buf, int count, MPI_Datatype type, MPI_Op op) const;
  [[noreturn]] void diverged(const StepMetrics& m);
  void read_back(StepMetrics& m);  // loss and gradient norm of the step just run (collective)
  MPI_Comm world_comm() const;      // the job's ranks (MPI_COMM_SELF without a context)
  void signal_test_hooks(std::int64_t steps_done);
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
  MetricsWriter metrics_;
  std::int64_t start_step_ = 0;
  bool stopped_ = false;
  DivergenceGuard guard_;
  std::vector<std::int64_t> skipped_batches_;  // data batches left out by rollbacks (sorted)
  std::string last_checkpoint_;                // saved or restored by this run, for messages
  mutable std::unique_ptr<comm::FlightRecorder> host_recorder_;  // world_all_reduce's
};

using Trainer = TrainerT<float>;

// Human-readable duration: 45s, 3m12s, 1h04m.
std::string format_duration(double seconds);

}  // namespace meshtrain::train
