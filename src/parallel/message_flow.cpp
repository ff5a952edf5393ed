#include "meshtrain/parallel/message_flow.hpp"

#include <algorithm>
#include <deque>

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

MessageFlow::MessageFlow(std::vector<Action> actions, int recv_ahead)
    : actions_(std::move(actions)), recv_ahead_(std::max(recv_ahead, 0)) {
  for (std::size_t i = 0; i < actions_.size(); ++i)
    if (actions_[i].op == Op::recv_act || actions_[i].op == Op::recv_grad) recv_at_.push_back(i);
}

void MessageFlow::reap(PipelineExecutor& ex) {
  auto done = [&](int b) {
    if (!ex.grad_send_done(b)) return false;
    free_.push_back(b);
    return true;
  };
  grad_sends_.erase(std::remove_if(grad_sends_.begin(), grad_sends_.end(), done),
                    grad_sends_.end());
}

int MessageFlow::take(PipelineExecutor& ex) {
  if (free_.empty()) reap(ex);
  if (free_.empty()) {
    ex.grow_pool(pool_);
    return pool_++;
  }
  const int b = free_.back();
  free_.pop_back();
  return b;
}

void MessageFlow::run_step(PipelineExecutor& ex) {
  std::size_t next_post = 0, received = 0;
  std::deque<std::pair<std::size_t, int>> posted;  // (action, buffer), list order
  int input = -1;  // pool buffer holding the received input of the next compute
  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    // The receive this action may wait for, and recv_ahead after it, are in flight.
    const std::size_t upto =
        std::min(received + 1 + static_cast<std::size_t>(recv_ahead_), recv_at_.size());
    while (next_post < upto) {
      const std::size_t r = recv_at_[next_post++];
      const int b = take(ex);
      ex.post_recv(r, b);
      posted.emplace_back(r, b);
    }
    switch (a.op) {
      case Op::recv_act:
      case Op::recv_grad:
        MESHTRAIN_CHECK(!posted.empty() && posted.front().first == i,
                        "PipelineRunner: receive ", to_string(a), " was not posted");
        ex.wait_recv(i);
        input = posted.front().second;
        posted.pop_front();
        ++received;
        break;
      case Op::forward:
      case Op::backward:
        ex.compute(i, input);
        if (input >= 0) free_.push_back(input);
        input = -1;
        break;
      case Op::send_act: ex.send_act(i); break;
      case Op::send_grad: {
        const int b = take(ex);
        ex.send_grad(i, b);
        grad_sends_.push_back(b);
        break;
      }
    }
  }
  MESHTRAIN_CHECK(posted.empty() && received == recv_at_.size(),
                  "PipelineRunner: receives left over at the end of the step");
  ex.wait_all_sends();
  free_.insert(free_.end(), grad_sends_.begin(), grad_sends_.end());
  grad_sends_.clear();
}

int predicted_message_buffers(const ScheduleSpec& spec, int stage, int recv_ahead) {
  struct Replay final : PipelineExecutor {
    int latest = -1;
    void grow_pool(int) override {}
    void post_recv(std::size_t, int) override {}
    void wait_recv(std::size_t) override {}
    void compute(std::size_t, int) override {}
    void send_act(std::size_t) override {}
    void send_grad(std::size_t, int b) override { latest = b; }
    bool grad_send_done(int b) override { return b != latest; }
    void wait_all_sends() override { latest = -1; }
  } replay;
  MessageFlow flow(build_schedule(spec, stage), recv_ahead);
  for (int step = 0; step < 2; ++step) flow.run_step(replay);
  return flow.pool_size();
}

}  // namespace meshtrain::parallel
