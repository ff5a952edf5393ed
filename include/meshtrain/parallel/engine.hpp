#pragma once
// The parallel engine: one object that composes every parallel mechanism of a run, built once
// from the model configuration, the world and the options (TorchTitan's parallelize_* steps, in
// one factory). In order, the constructor
//   1. builds the process mesh and one communicator per group (ParallelContext),
//   2. cuts the model into pipeline stages and chunks and builds this rank's slice of it
//      (tensor and sequence parallelism live inside the model, over the tp group),
//   3. applies data parallelism and ZeRO to it (GradSync as the model's layer hooks),
//   4. builds the sharded optimizer over what ZeRO leaves this rank (ZeroOptimizer),
//   5. and the pipeline runner that executes the schedule (pp = 1 is the trivial schedule).
// A single rank is an engine over a 1 x 1 x 1 mesh: there is one training path.
//
// The trainer sees only what a training loop needs: run one step's micro-batches from a batch
// source, the optimizer step, the global loss and gradient norm, evaluation, checkpoints as this
// rank's registry pieces, initialisation and the whole model for export.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "meshtrain/io/checkpoint.hpp"
#include "meshtrain/io/checkpoint_async.hpp"
#include "meshtrain/io/hf_export.hpp"
#include "meshtrain/kernels/attention/attention.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/optim/adamw.hpp"
#include "meshtrain/parallel/checkpoint_staging.hpp"
#include "meshtrain/parallel/context.hpp"
#include "meshtrain/parallel/loss_holder.hpp"
#include "meshtrain/parallel/step_batch.hpp"

namespace meshtrain::comm {
class FlightRecorder;
}

namespace meshtrain::parallel {

template <class T> class GradSync;
template <class T> class ZeroOptimizer;
template <class T> class PipelineRunner;

struct EngineOptions {
  ParallelConfig parallel;   // mesh, rank order, backend, sequence parallelism, schedule, ZeRO
  int micro_batch = 8;       // sequences per micro-batch
  int seq_len = 128;
  int n_micro = 1;           // micro-batches per step on each data-parallel rank
  bool recompute = false;    // activation checkpointing per block
  bool recompute_mlp_act = false;  // keep only the MLP pre-activation (model::ModelLayout)
  int head_chunk_tokens = 0;  // rows of the LM head at once; 0 auto (model::ModelLayout)
  model::Fp8Recipe fp8;       // train.precision=fp8's linears (model::ModelLayout)
  optim::AdamWConfig adamw;
  kernels::AttentionOptions attention;  // attention backend (--attn.*), set process-wide
};

// What one step's forward and backward cost in communication (host wall time; meaningful on the
// CPU build) and the pipeline's idle share. `reported`: the run has parallel machinery whose
// figures are worth printing (more than one rank, ZeRO or offload); `pipelined`: pp > 1.
struct StepComm {
  double bubble = 0, dp_comm_ms = 0, dp_hidden = 0, tp_comm_ms = 0;
  bool reported = false, pipelined = false;
};

// One MoE block's router figures over the last forward_backward's global batch (issue 20):
// tokens per expert (min, max, coefficient of variation of the (token, choice) pairs routed to
// each expert, before capacity drops), the share of (token, choice) pairs the capacity dropped,
// the aux and z losses (mean over the global batch's micro-batches), and the host time of the
// expert path (all-to-alls, expert GEMMs) and of its all-to-alls alone, averaged over the ranks
// that ran it (host wall time: exact on the CPU build; how much of it the GPU hid is not
// measured).
struct MoeLayerMetrics {
  int layer = 0;
  double load_min = 0, load_max = 0, load_cv = 0, dropped = 0, aux = 0, z = 0, expert_ms = 0;
  double a2a_ms = 0;
};

template <class T>
class Engine {
 public:
  // Collective over `world`. ConfigError (identically on every rank) for layouts the model,
  // the schedule or the world cannot take. Parameters are uninitialised until
  // init_parameters, import_hf or load_checkpoint.
  Engine(MPI_Comm world, const model::GptConfig& cfg, const EngineOptions& opt,
         ExecSpace exec = ExecSpace{});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // ---- initialisation (collective) ----
  // GPT-2 initialisation from the counter-based RNG: each rank draws exactly its own slice.
  void init_parameters(std::uint64_t seed);
  // A HuggingFace folder (config.json + model.safetensors), sliced for this rank.
  void import_hf(const std::string& dir);
  // The caller wrote this rank's parameters into model().params() (tests, tools): derive the
  // optimizer's master copy from them. Not available at ZeRO-3 (no full buffer).
  void parameters_ready();

  // ---- one training step ----
  // Forward and backward of this rank's micro-batches of the step, gradients reduced over dp.
  // `batch` fills sequences of the step's global batch of global_batch() sequences; the engine
  // asks for this data-parallel rank's. grad_scale = 1 / (counted target tokens of the global
  // batch), times the loss scale.
  StepComm forward_backward(const BatchSource& batch, float grad_scale);
  // Clip by the global norm and update; false when the norm was not finite and the update was
  // skipped (only checked with check_finite). Same contract as optim::AdamWT::step.
  bool optimizer_step(std::int64_t step, float loss_scale = 1.0f, bool check_finite = false);
  // Collective: the sum of token losses of the last forward_backward over the global batch.
  float global_loss_sum();
  // The global gradient norm of the last optimizer step (reads it back).
  float grad_norm() const;
  // Collective: per MoE block, its router figures of the last forward_backward (empty for a
  // dense model).
  std::vector<MoeLayerMetrics> moe_metrics();
  // Mean token loss over `batches` micro-batches that `batch` fills (first = b x micro_batch);
  // every data-parallel rank evaluates the same batches. Collective; the same on every rank.
  float evaluate(const BatchSource& batch, int batches);
  // Waits for everything queued on the execution-space instance.
  void fence() const;

  // ---- checkpoints (collective over the world) ----
  // Writes this rank's part of the state (fp32 parameters or master, Adam's m and v: the pieces
  // of its ZeRO partition of its tensor/pipeline slice, no duplicate writers) into
  // <dir>/step_XXXXXXXX.h5 with `attrs` (the engine fills in the model and the layout) and
  // commits it, keeping the `keep` newest (0: all). Returns the committed file.
  std::string save_checkpoint(const std::string& dir, std::int64_t steps_done,
                              io::CheckpointAttributes attrs, io::Transfer transfer, int keep);
  // Asynchronous saves (issue 36), in two steps. stage_checkpoint copies the same part of the
  // state into host staging buffers kept for the run (page-locked on CUDA builds; allocated on
  // first use or by reserve_checkpoint_staging) and returns it with its attributes, ready for
  // io::write_staged on any thread and communicator over the world's ranks (the file is the one
  // save_checkpoint writes, byte for byte). Collective (expert biases). The buffers are reused:
  // the write of the previous staged checkpoint must have ended.
  io::StagedCheckpoint stage_checkpoint(const std::string& dir, std::int64_t steps_done,
                                        io::CheckpointAttributes attrs, io::Transfer transfer,
                                        int keep);
  void reserve_checkpoint_staging();
  // Host bytes of the staging buffers held (0 before the first stage or reserve): what the
  // planner counts as MemoryBreakdown::host_ckpt.
  std::size_t checkpoint_staging_bytes() const;
  // Collective: a writer thread with its own duplicate of the world (io/checkpoint_async.hpp).
  // Needs MPI_THREAD_MULTIPLE.
  std::unique_ptr<io::BackgroundWriter> background_writer() const;
  // Reads what this rank's layout holds from the checkpoint `spec` names (whatever layout saved
  // it). ConfigError on every rank for a missing or corrupt file or another model.
  io::CheckpointAttributes load_checkpoint(const std::string& spec, const std::string& dir,
                                           bool verify, io::Transfer transfer);

  // ---- HuggingFace export (collective over the world) ----
  // Writes the model as a HuggingFace folder on world rank 0 (io/hf_export.hpp), streamed
  // tensor by tensor from the ranks that hold each slice: no rank holds more than one tensor
  // of it in host memory. Returns this rank's host-buffer figures. ConfigError (agreed) when
  // the folder cannot be written.
  io::HfExportStats export_hf(const std::string& dir, const io::HfExportOptions& opt);

  // ---- the whole model (sampling) ----
  // Calls f(model) on world rank 0 with the whole model: this rank's own when it holds all of
  // it (one rank, parameters allocated), else a gathered fp32 copy (collective). Other ranks
  // take part in the gather and do not call f.
  template <class F>
  void with_whole_model(F&& f);

  // ---- agreement ----
  // Collective: whether `flag` is set on any rank of the world.
  bool any_rank(bool flag) const;
  // Collective: flags[i] = the maximum over the world (one all-reduce).
  void max_over_ranks(int* flags, int n) const;
  // Collective: core/agree.hpp's agree over the world.
  void agree(const std::string& what, const std::function<void()>& f) const;
  // Whether this rank's share of the last forward_backward's loss is finite (0 where the rank
  // computes no loss). Reads one scalar back.
  bool loss_finite_here() const;

  // ---- what the loop needs to know ----
  const model::GptConfig& config() const { return cfg_; }
  int micro_batch() const { return opt_.micro_batch; }
  int seq_len() const { return opt_.seq_len; }
  // Rows of each sequence this rank holds: seq_len / cp.
  int local_seq_len() const { return opt_.seq_len / opt_.parallel.shape.cp; }
  int n_micro() const { return opt_.n_micro; }
  int world_size() const;
  int world_rank() const;
  int global_batch() const;             // sequences per step over the job
  std::int64_t tokens_per_step() const;  // global_batch() x seq_len
  std::string describe() const;          // the layout, for the banner
  std::string advice() const;            // a warning about the layout, or empty

  // ---- the parts (tests, benchmarks, the planner's validation) ----
  model::GptT<T>& model() { return *model_; }
  const model::GptT<T>& model() const { return *model_; }
  const ParallelContext& context() const { return *ctx_; }
  const GradSync<T>& sync() const { return *sync_; }
  const ZeroOptimizer<T>& optimizer() const { return *zopt_; }
  // This rank's full flat parameters: the model's buffer, or at ZeRO-3 gathered into `out`
  // (collective over dp).
  View1<const T> full_parameters(View1<T> out);

 private:
  std::unique_ptr<model::Gpt> gather_to_rank0();
  // moe.expert_bias (engine_moe.cpp): after an applied optimizer step, every rank moves the
  // biases of its blocks by the step's load summed over the world (the same on every rank).
  void update_expert_bias();
  // Checkpoints: every block's biases into attrs.state ("<block>mlp.router.expert_bias",
  // collective: each stage's first rank contributes its blocks), and back from a loaded file's
  // state (or, from a file written before the /state group, its extra.moe.expert_bias.<block>).
  void save_expert_bias(io::CheckpointAttributes& attrs);
  void restore_expert_bias(const io::CheckpointAttributes& attrs);
  // What this rank writes to checkpoints and exports (parallel::ownership of its layout).
  Ownership ownership_here() const;
  // Checkpoint staging (engine_checkpoint.cpp): the copy into buffers and the staged pieces
  // over them.
  void stage_into(CheckpointStaging& st);
  io::StagedCheckpoint stage(CheckpointStaging& st, const std::string& dir, std::int64_t steps_done,
                             io::CheckpointAttributes a, io::Transfer transfer, int keep);
  // Collective: the sum of the loss sums of the ranks that hold the loss (loss_holder.hpp).
  double loss_over_world(LossBatches batches);
  // In-place MPI_Allreduce over the world, recorded for the watchdog ("world.host").
  void world_all_reduce(void* buf, int count, MPI_Datatype type, MPI_Op op) const;

  model::GptConfig cfg_;
  EngineOptions opt_;
  std::unique_ptr<ParallelContext> ctx_;
  std::unique_ptr<model::GptT<T>> model_;
  std::unique_ptr<GradSync<T>> sync_;
  std::unique_ptr<ZeroOptimizer<T>> zopt_;
  std::unique_ptr<PipelineRunner<T>> runner_;
  std::unique_ptr<StepBatches> batches_;  // the step's data, where this stage reads it
  std::unique_ptr<CheckpointStaging> staging_;  // asynchronous saves' buffers
  mutable std::unique_ptr<comm::FlightRecorder> host_recorder_;  // world_all_reduce's
};

template <class T>
template <class F>
void Engine<T>::with_whole_model(F&& f) {
  if (world_size() == 1 && model_->params().span() > 0) {
    f(*model_);
    return;
  }
  std::unique_ptr<model::Gpt> whole = gather_to_rank0();
  if (whole) f(*whole);
}

}  // namespace meshtrain::parallel
