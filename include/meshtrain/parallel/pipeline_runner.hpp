#pragma once
// Runs one rank's pipeline schedule (schedule.hpp) for one training step: the model's chunk
// forwards and backwards in schedule order, activations and their gradients exchanged with the
// neighbouring stages through non-blocking point-to-point messages on the pp communicator; and
// evaluation's forward-only schedule the same way.
//
// Communication overlaps compute. Receives are issued in list order, which matches the peer's
// send order (NCCL has no tags); sends never block the schedule. When a receive is posted is
// MessageFlow's PostPolicy: on MPI (host progress) recv_ahead receives are kept posted ahead of
// the one being waited for; on NCCL (stream-ordered, Communicator::stream_ordered) a receive
// posted ahead is a kernel that spins until its data come, and any device synchronisation
// inside a compute (freeing memory does one) would wait for it, so receives are posted at their
// use, or earlier where receive_posting's replay of all stages shows a crossing send needs it
// (interleaved schedules). Which buffer each message uses and when it is issued and waited for
// is MessageFlow's (a pure policy the planner replays); the runner executes it. On NCCL the pp
// communicator gives each direction of each neighbour pair a stream of its own
// (Communicator::prepare_p2p), so a posted receive does not hold back this rank's own sends.
// Buffers:
//  - an activation is sent straight from the model's output view of (chunk, slot), valid until
//    that slot's next forward; its request is waited before this slot's next compute, by which
//    time the next stage has already received it;
//  - an input gradient (the model's d(chunk input), valid until the next backward) is copied
//    into a pooled buffer that is returned to the pool when its send completes;
//  - receives land in pooled buffers returned after the compute that consumes them (the model
//    copies its chunk input).
// Idle time (waiting on messages, and for sends at the end of the step) is measured per step:
// the pipeline bubble of this stage. On a GPU with NCCL, waits do not block the host, so the
// wall-clock figures are only meaningful with host execution (the CPU build).
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/parallel/message_flow.hpp"
#include "meshtrain/parallel/partition.hpp"
#include "meshtrain/parallel/schedule.hpp"
#include "meshtrain/parallel/step_batch.hpp"

namespace meshtrain::parallel {

// The model layout of pipeline rank `stage`: its chunks of `pieces` (partition.hpp), the
// embedding on stage 0, the head on stage pp - 1, and one activation slot per micro-batch the
// schedule keeps in flight in a chunk. tp, sequence parallelism and recompute left as given.
model::ModelLayout pipeline_layout(const ScheduleSpec& spec, const std::vector<LayerRange>& pieces,
                                   int stage, model::ModelLayout base = {});

// The step's data of micro-batch m (step_batch.hpp). The runner asks for it only where a chunk
// reads it: at the forward of the chunk that embeds and of the one that holds the head.
using MicroBatch = StepBatch;
using BatchProvider = std::function<StepBatch(int micro)>;

struct PipelineStepStats {
  double wall_s = 0;     // this rank's step: first action to the last send completed
  double idle_s = 0;     // waiting for receives and, at the end, for sends
  double compute_s = 0;  // inside the model's forward and backward calls
  int messages = 0;      // sent and received
  double bubble() const { return wall_s > 0 ? idle_s / wall_s : 0.0; }
};

template <class T>
class PipelineRunner : private PipelineExecutor {
 public:
  // `pp`: the pipeline communicator (rank = stage, size = spec.pp). The model must hold this
  // stage's chunks (pipeline_layout) with at least slots_needed(spec, stage) slots. Both must
  // outlive the runner. recv_ahead: receives kept posted ahead of the one being waited for
  // (host-progress backends; NCCL posts at use).
  // Collective over the stage and its pipeline neighbours (Communicator::prepare_p2p).
  PipelineRunner(model::GptT<T>& model, comm::Communicator& pp, const ScheduleSpec& spec,
                 int stage, int recv_ahead = 2);
  ~PipelineRunner() override;
  PipelineRunner(const PipelineRunner&) = delete;
  PipelineRunner& operator=(const PipelineRunner&) = delete;

  // One step: every micro-batch forward and backward through this rank's chunks. Parameter
  // gradients accumulate into the model (zero them before, reduce the tied wte over the
  // embedding group after); the last stage adds the token losses to model.loss_sum().
  // grad_scale = 1 / (counted target tokens of the global batch).
  PipelineStepStats step(const BatchProvider& batch, float grad_scale);
  // Forward only (evaluation): micro-batches 0 .. n_micro - 1 through this rank's chunks in the
  // order of the forward-only schedule (ScheduleKind::forward_only, from the same builder),
  // with the step's messages, slots and buffers; the last stage adds the token losses to
  // model.loss_sum(). Collective over the pipeline like step().
  PipelineStepStats forward_only(int n_micro, const BatchProvider& batch);

  const std::vector<Action>& actions() const { return flow_.actions(); }
  int n_slots() const { return n_slots_; }
  const ScheduleSpec& spec() const { return spec_; }
  int stage() const { return stage_; }
  // Bytes of the message pool so far: predicted_message_buffers() (message_flow.hpp) buffers of
  // activation_elems() once the first step has run.
  std::size_t pool_bytes() const { return pool_.size() * model_.activation_elems() * sizeof(T); }

 private:
  PipelineStepStats run(MessageFlow& flow, const BatchProvider& batch, float grad_scale,
                        bool train);
  int tag(const Action& a) const;
  // PipelineExecutor: what MessageFlow asks for.
  void grow_pool(int buffer) override;
  void issue(const Message& m) override;
  void wait(std::size_t action) override;
  bool test(std::size_t action) override;
  void compute(std::size_t action, int input) override;
  void wait_all_sends() override;

  model::GptT<T>& model_;
  comm::Communicator& pp_;
  ScheduleSpec spec_;
  int stage_;
  int n_slots_;
  std::vector<int> chunk_slots_;          // slots per chunk (the schedule's per-chunk peak)
  int recv_ahead_;
  MessageFlow flow_;                      // the step's
  std::unique_ptr<MessageFlow> forward_flow_;  // forward_only's, over forward_micro_ batches
  int forward_micro_ = 0;
  std::vector<View1<T>> pool_;            // message buffers of activation_elems()
  std::vector<comm::Request> messages_;   // per action: its send or receive in flight
  // the step in progress
  MessageFlow* running_ = nullptr;        // the flow being executed
  const BatchProvider* batch_ = nullptr;
  float grad_scale_ = 0;
  bool train_ = true;
  View1<const T> out_;                    // what the last compute produced
  PipelineStepStats st_;
};

using PipelineRunnerF = PipelineRunner<float>;

}  // namespace meshtrain::parallel
