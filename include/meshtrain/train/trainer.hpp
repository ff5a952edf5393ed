#pragma once
// The training loop: micro-batches with gradient accumulation, AdamW with warmup + cosine LR,
// evaluation on the validation split every N steps, a progress line per step (loss, lr, grad
// norm, tokens/s, model TFLOP/s and MFU, memory, ETA) and a JSON-lines metrics file for plots.
//
// Checkpoints (DESIGN "Training under a layout"): at a step boundary the trainer saves the fp32
// parameters and Adam's moments, each data-parallel rank writing only its partition, and any
// layout restores them; a stop signal (SIGUSR1/SIGTERM, agreed over the world at every step
// boundary) saves a checkpoint and ends run() early with stopped() set. With ckpt.async a save
// costs the training thread only the copy into host staging buffers; a background thread writes
// and commits it while the next steps run (trainer_async.cpp).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/io/blend.hpp"
#include "meshtrain/io/checkpoint.hpp"
#include "meshtrain/io/dataset.hpp"
#include "meshtrain/optim/adamw.hpp"
#include "meshtrain/optim/loss_scaler.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/divergence.hpp"
#include "meshtrain/train/metrics_writer.hpp"
#include "meshtrain/train/tensorboard.hpp"

namespace meshtrain::train {

struct CheckpointConfig {
  std::string dir;            // empty: never save (a stop signal still ends the run)
  std::int64_t every = 0;     // save after every N steps; 0: only on a stop signal / at the end
  bool final = true;          // save after the last step
  int keep = 0;               // keep the N newest checkpoints; 0: all
  io::Transfer transfer = io::Transfer::automatic;
  bool verify = true;         // verify the per-tensor checksums on restore
  // ckpt.async: stage each save in host buffers and write it on a background thread while
  // training goes on (needs MPI_THREAD_MULTIPLE: the caller checks). At most one write is in
  // flight; the next save, a stop, a rollback and the end of run() wait for it.
  bool async_write = false;
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
  double fp8_flops_share = 0; // of the model FLOPs, computed by FP8 GEMMs (model::fp8_flops_share)
  std::string metrics_file;   // JSON lines; empty: none
  optim::AdamWConfig adamw;
  bool loss_scaling = false;  // dynamic loss scaling (fp16)
  float loss_scale_init = 65536.0f;
  int loss_scale_window = 1000;
  float loss_scale_min = 1.0f;
  int loss_scale_hysteresis = 1;       // overflows before the scale halves (DeepSpeed's)
  bool loss_scale_consecutive_hysteresis = false;
  bool loss_scale_static = false;      // keep loss_scale_init (DeepSpeed's loss_scale > 0)
  std::string tensorboard_dir;         // TensorBoard event files (world rank 0); empty: none
  std::string memory_file;             // every rank's peak memory at the end (JSON, world
                                       // rank 0; `meshtrain doctor`); empty: not gathered
  std::int64_t profile_first = -1, profile_last = -1;  // 1-based steps between the profiler's
                                                       // start and stop (-1: no capture)
  std::string config_text;    // the resolved configuration (INI), stored in checkpoints
  DivergenceConfig divergence;  // non-finite steps (train.on_nonfinite, ...)
  CheckpointConfig ckpt;
};

struct StepMetrics {
  std::int64_t step = 0;
  float loss = 0, lr = 0, grad_norm = 0;
  double step_seconds = 0, tokens_per_second = 0, tflops = 0, mfu = 0;
  double fp8_share = 0;  // TrainConfig::fp8_flops_share: MFU stays against the bf16 peak
  std::size_t memory_bytes = 0;
  float loss_scale = 1;   // the scale this step used (1 without loss scaling)
  bool skipped = false;   // inf/nan gradients: the update was skipped
  // Parallel runs: pipeline idle share of the step (this rank), dp gradient communication and
  // the share of it hidden behind backward, tensor-parallel communication (host wall time).
  double bubble = 0, dp_comm_ms = 0, dp_hidden = 0, tp_comm_ms = 0;
  bool comm_reported = false, pipelined = false;  // which of those the progress line shows
  double ckpt_ms = 0;     // a checkpoint was saved after this step, taking the training
                          // thread this long (ckpt.async: staging it, and waiting for the
                          // previous write if it was still in flight)
  bool ckpt_writing = false;  // a background checkpoint write was in flight when it started
  // Mixture of Experts (logged steps): per MoE block, and the router losses summed over blocks
  // (the mean over the global batch's micro-batches; added to the objective, not to `loss`).
  std::vector<parallel::MoeLayerMetrics> moe;
  double moe_aux = 0, moe_z = 0;
  // Tokens each data source has supplied through this step (the data order's count: a batch
  // that a rollback left out counts as drawn); one entry without a blend.
  std::vector<std::uint64_t> source_tokens;
};

// Validation losses: the mean over the sources that have validation data, weighted by the
// blend, and each source's (NaN where a source has none). Without a blend: one source.
struct EvalLosses {
  float loss = 0;
  std::vector<float> by_source;
};

template <class T>
class TrainerT {
 public:
  // The engine holds the model under its layout (one rank: a 1 x 1 x 1 mesh) with initialised
  // parameters; its micro-batch, accumulation and sequence length must be cfg's. `val` may be
  // null (no evaluation).
  TrainerT(parallel::Engine<T>& engine, const TrainConfig& cfg, const io::TokenDataset& train,
           const io::TokenDataset* val);
  // Trains on `data` (a blend of sources, data.blend; each evaluated on its own validation
  // shards). The datasets it points to must outlive the trainer.
  TrainerT(parallel::Engine<T>& engine, const TrainConfig& cfg, io::BlendedDataset data);

  // Runs the steps from start_step() to cfg.steps, saving checkpoints as cfg.ckpt says. Ends
  // early, with stopped() set, after saving a checkpoint when a stop signal has arrived on any
  // rank. Returns the metrics of the last step run.
  StepMetrics run();
  // Collective: restores the checkpoint `spec` names (a file, a folder, a `latest` file, or
  // "latest" in cfg.ckpt.dir) into the parameters, master weights, Adam moments and the loss
  // scaler; run() then continues at the saved step. Returns the saved attributes.
  // ConfigError (on every rank) for a missing or corrupt file or another model configuration.
  io::CheckpointAttributes restore(const std::string& spec);
  // Collective: saves the state after `steps_done` completed steps into cfg.ckpt.dir and waits
  // until it is committed (with ckpt.async, through the background writer). Returns the file.
  std::string save_checkpoint(std::int64_t steps_done);
  std::int64_t start_step() const { return start_step_; }
  bool stopped() const { return stopped_; }
  // One optimizer step (0-based index); synchronises only when the step is logged.
  StepMetrics step(std::int64_t step, bool read_back);
  // Mean loss over cfg.eval_batches sequential validation batches (of each source).
  float evaluate() { return evaluate_sources().loss; }
  EvalLosses evaluate_sources();
  const io::BlendedDataset& data() const { return data_; }
  std::int64_t tokens_per_step() const { return engine_.tokens_per_step(); }

 private:
  void log_step(const StepMetrics& m, double eta_seconds);
  // Collective: every rank's peak memory (one all-reduce over the world) into cfg.memory_file,
  // for `meshtrain doctor`'s headroom per rank.
  void record_memory_per_rank(std::int64_t steps_done);
  void read_back(StepMetrics& m);  // loss and gradient norm of the step just run (collective)
  // trainer_guard.cpp: the step boundary's agreement (stop flag and step health, one
  // all-reduce over the world), the rollback, and the end of a diverged run.
  struct Boundary {
    bool stop = false;
    StepHealth health;
    bool write_failed = false, write_busy = false;  // background checkpoint write, any rank
  };
  Boundary agree_at_boundary(std::int64_t steps_done, const StepMetrics& m);
  // trainer_async.cpp: asynchronous saves (ckpt.async). start_save stages the state and hands
  // it to the background writer (waiting for the previous write first); finish_save waits,
  // agreed over the world, until the write in flight has ended on every rank; after_boundary
  // collects a write that every rank has finished, or ends the run when one failed.
  void start_save(std::int64_t steps_done);
  void finish_save(std::int64_t steps_done, bool log = true);
  void after_boundary(const Boundary& b, std::int64_t steps_done);
  void collect_write(bool log);
  [[noreturn]] void write_failed(std::int64_t steps_done);
  io::CheckpointAttributes checkpoint_attributes(std::int64_t steps_done) const;
  std::int64_t roll_back(std::int64_t step);  // returns the step to continue from
  [[noreturn]] void diverged(std::int64_t steps_done);
  void signal_test_hooks(std::int64_t steps_done);
  // trainer_data.cpp: the data sources' side of the loop.
  void describe_data() const;
  void report_epochs(std::int64_t step, const std::vector<std::uint64_t>& before,
                     const std::vector<std::uint64_t>& after) const;
  std::string data_record(std::int64_t steps_done) const;  // extra.data.sources (JSON)
  void restore_data(const io::CheckpointAttributes& a);
  void log_eval(std::int64_t step, const EvalLosses& e, bool final);
  parallel::Engine<T>& engine_;
  TrainConfig cfg_;
  io::BlendedDataset data_;
  optim::DynamicLossScaler scaler_;
  MetricsWriter metrics_;
  EventFileWriter tensorboard_;
  bool capturing_ = false;  // between the profiler's start and stop (profile.steps)
  std::int64_t start_step_ = 0;
  bool stopped_ = false;
  DivergenceGuard guard_;
  std::vector<std::int64_t> skipped_batches_;  // data batches left out by rollbacks (sorted)
  std::string last_checkpoint_;                // saved or restored by this run, for messages
  std::unique_ptr<io::BackgroundWriter> writer_;  // ckpt.async
};

using Trainer = TrainerT<float>;

// The engine options that train with `cfg` (micro-batch, accumulation, sequence length, the
// optimizer) under `parallel` (default: one rank).
parallel::EngineOptions engine_options(const TrainConfig& cfg,
                                       const parallel::ParallelConfig& parallel = {},
                                       bool recompute = false);

// Human-readable duration: 45s, 3m12s, 1h04m.
std::string format_duration(double seconds);

}  // namespace meshtrain::train
