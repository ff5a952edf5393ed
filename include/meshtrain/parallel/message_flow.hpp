#pragma once
// Which message buffer each pipeline message of a step uses, and when receives are posted: the
// pure policy of the pipeline runner. Like schedule.cpp it touches neither MPI nor Kokkos; the
// runner executes it with real sends and receives (PipelineRunner implements
// PipelineExecutor) and the planner replays it to predict the message pool
// (plan::replay_pipeline_buffers), so both follow one set of rules:
//  - receives are posted in list order (the peer's send order: NCCL has no tags), `recv_ahead`
//    ahead of the one the next action may wait for;
//  - a received buffer goes back to the pool after the compute that consumes it (the model
//    copies its chunk input);
//  - an input gradient is copied into a pool buffer for its send (the model overwrites it at
//    its next backward); the buffer returns once the send has completed;
//  - a request for a buffer takes the most recently freed one, else reaps completed gradient
//    sends, else grows the pool.
#include <cstddef>
#include <vector>

#include "meshtrain/parallel/schedule.hpp"

namespace meshtrain::parallel {

class PipelineExecutor {
 public:
  virtual ~PipelineExecutor() = default;
  virtual void grow_pool(int buffer) = 0;                       // a new message buffer
  virtual void post_recv(std::size_t action, int buffer) = 0;  // into pool buffer `buffer`
  virtual void wait_recv(std::size_t action) = 0;
  // Forward or backward of action `action`; input: the pool buffer holding its received input
  // (-1: none, e.g. the first stage's forward).
  virtual void compute(std::size_t action, int input) = 0;
  virtual void send_act(std::size_t action) = 0;                // from the model's output
  virtual void send_grad(std::size_t action, int buffer) = 0;  // copy d(input) into `buffer`
  virtual bool grad_send_done(int buffer) = 0;                  // test a gradient send
  virtual void wait_all_sends() = 0;                            // end of the step
};

class MessageFlow {
 public:
  MessageFlow(std::vector<Action> actions, int recv_ahead);
  // One step: every action in order, with the buffers chosen here.
  void run_step(PipelineExecutor& ex);
  int pool_size() const { return pool_; }
  const std::vector<Action>& actions() const { return actions_; }
  std::size_t receives() const { return recv_at_.size(); }

 private:
  int take(PipelineExecutor& ex);
  void reap(PipelineExecutor& ex);

  std::vector<Action> actions_;
  std::vector<std::size_t> recv_at_;  // indices of the receive actions, in list order
  int recv_ahead_;
  int pool_ = 0;
  std::vector<int> free_;
  std::vector<int> grad_sends_;       // buffers of gradient sends in flight, in issue order
};

// Message buffers the runner of `stage` allocates over a step (the pool peaks in the first):
// MessageFlow replayed with gradient sends that complete once the peer has received them,
// except the latest, which the peer is still consuming when this rank asks for its next buffer.
int predicted_message_buffers(const ScheduleSpec& spec, int stage, int recv_ahead = 2);

}  // namespace meshtrain::parallel
