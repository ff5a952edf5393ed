#pragma once
// When each pipeline message of a step is issued and waited for, and which message buffer it
// uses: the pure policy of the pipeline runner. Like schedule.cpp it touches neither MPI nor
// Kokkos; the runner executes it with real sends and receives (PipelineRunner implements
// PipelineExecutor), the planner replays it to predict the message pool
// (plan::replay_pipeline_buffers), and tests/parallel/test_message_flow_streams replays every
// stage of a pipeline against simulated MPI and NCCL networks, so all follow one set of rules:
//  - receives are posted in list order (the peer's send order: NCCL has no tags), `recv_ahead`
//    ahead of the one the next action may wait for;
//  - a compute waits for the activation sent from the (chunk, slot) it is about to overwrite
//    or recompute (the model's output view of the slot is what was sent);
//  - a received buffer goes back to the pool after the compute that consumes it (the model
//    copies its chunk input);
//  - an input gradient is copied into a pool buffer for its send (the model overwrites it at
//    its next backward); the buffer returns once the send has completed;
//  - a request for a buffer takes the most recently freed one, else reaps completed gradient
//    sends, else grows the pool.
// Receives posted ahead need a network on which a receive waiting for its message holds back
// nothing else: MPI's, and NCCL's once each direction of each neighbour pair has a
// communicator (a stream) of its own (Communicator::prepare_p2p).
#include <cstddef>
#include <vector>

#include "meshtrain/parallel/schedule.hpp"

namespace meshtrain::parallel {

// A message: the action that sends or receives it and its pool buffer (-1 for an activation,
// sent straight from the model's output of the compute just before).
struct Message {
  std::size_t action;
  int buffer;
};

class PipelineExecutor {
 public:
  virtual ~PipelineExecutor() = default;
  virtual void grow_pool(int buffer) = 0;  // a new message buffer
  // A receive into its pool buffer, an activation send from the last compute's output, a
  // gradient send from a copy of it in its pool buffer.
  virtual void issue(const Message& m) = 0;
  virtual void wait(std::size_t action) = 0;  // the message of `action` has completed
  virtual bool test(std::size_t action) = 0;  // whether the send of `action` has completed
  // Forward or backward of action `action`; input: the pool buffer holding its received input
  // (-1: none, e.g. the first stage's forward).
  virtual void compute(std::size_t action, int input) = 0;
  virtual void wait_all_sends() = 0;  // end of the step
};

class MessageFlow {
 public:
  // chunk_slots: the model's activation slots per chunk (chunk_slots_needed); a compute of
  // micro-batch m in chunk c uses slot m % chunk_slots[c].
  MessageFlow(std::vector<Action> actions, std::vector<int> chunk_slots, int recv_ahead = 2);
  // One step: every action in order, with the buffers chosen here.
  void run_step(PipelineExecutor& ex);
  int pool_size() const { return pool_; }
  const std::vector<Action>& actions() const { return actions_; }
  std::size_t receives() const { return recv_at_.size(); }

 private:
  int take(PipelineExecutor& ex);
  void reap(PipelineExecutor& ex);
  void compute(PipelineExecutor& ex, std::size_t i, int input);
  void send(PipelineExecutor& ex, std::size_t i);

  std::vector<Action> actions_;
  std::vector<int> chunk_slots_;
  std::vector<std::size_t> recv_at_;  // indices of the receive actions, in list order
  int recv_ahead_;
  int pool_ = 0;
  std::vector<int> free_;
  std::vector<Message> grad_sends_;   // gradient sends in flight, in issue order
  std::vector<std::vector<std::size_t>> slot_send_;  // per (chunk, slot): its latest act send
};

// Message buffers the runner of `stage` allocates over a step (the pool peaks in the first):
// MessageFlow replayed with gradient sends that complete once the peer has received them,
// except the latest, which the peer is still consuming when this rank asks for its next buffer.
int predicted_message_buffers(const ScheduleSpec& spec, int stage, int recv_ahead = 2);

}  // namespace meshtrain::parallel
