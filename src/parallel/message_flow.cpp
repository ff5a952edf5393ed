#include "meshtrain/parallel/message_flow.hpp"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "meshtrain/core/error.hpp"
#include "meshtrain/parallel/receive_posting.hpp"

namespace meshtrain::parallel {

namespace {

constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

bool is_compute(const Action& a) { return a.op == Op::forward || a.op == Op::backward; }
bool is_recv(const Action& a) { return a.op == Op::recv_act || a.op == Op::recv_grad; }

}  // namespace

PostPolicy post_policy_for(bool stream_ordered) {
  return stream_ordered ? PostPolicy::at_use : PostPolicy::ahead;
}

const char* post_policy_name(PostPolicy p) { return p == PostPolicy::at_use ? "at_use" : "ahead"; }

MessageFlow::MessageFlow(std::vector<Action> actions, std::vector<int> chunk_slots,
                         PostPolicy policy, int recv_ahead, int max_pool,
                         std::vector<std::size_t> post_before)
    : actions_(std::move(actions)),
      chunk_slots_(std::move(chunk_slots)),
      policy_(policy),
      recv_ahead_(std::max(recv_ahead, 0)),
      max_pool_(std::max(max_pool, 0)),
      post_before_(std::move(post_before)) {
  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    if (is_recv(a)) recv_at_.push_back(i);
    MESHTRAIN_CHECK(a.chunk >= 0 && a.chunk < static_cast<int>(chunk_slots_.size()) &&
                        chunk_slots_[static_cast<std::size_t>(a.chunk)] > 0,
                    "MessageFlow: ", to_string(a), " in a chunk without activation slots (",
                    chunk_slots_.size(), " chunks)");
  }
  if (policy_ == PostPolicy::at_use && post_before_.empty()) post_before_ = recv_at_;  // at use
  MESHTRAIN_CHECK(policy_ != PostPolicy::at_use || post_before_.size() == recv_at_.size(),
                  "MessageFlow: ", post_before_.size(), " posting positions for ",
                  recv_at_.size(), " receives");
  for (std::size_t r = 0; r < post_before_.size(); ++r)
    MESHTRAIN_CHECK(post_before_[r] <= recv_at_[r] && (r == 0 || post_before_[r - 1] <= post_before_[r]),
                    "MessageFlow: receive ", r, " posted at action ", post_before_[r],
                    " (after its use or out of list order)");
  slot_send_.resize(chunk_slots_.size());
  for (std::size_t c = 0; c < chunk_slots_.size(); ++c)
    slot_send_[c].assign(static_cast<std::size_t>(chunk_slots_[c]), kNone);
}

void MessageFlow::reap(PipelineExecutor& ex) {
  auto done = [&](const Message& m) {
    if (!ex.test(m.action)) return false;
    free_.push_back(m.buffer);
    return true;
  };
  grad_sends_.erase(std::remove_if(grad_sends_.begin(), grad_sends_.end(), done),
                    grad_sends_.end());
}

int MessageFlow::take(PipelineExecutor& ex) {
  if (free_.empty()) reap(ex);
  if (free_.empty() && max_pool_ > 0 && pool_ >= max_pool_ && !grad_sends_.empty()) {
    // The cap: the oldest gradient send's buffer, once the device has sent it.
    const Message m = grad_sends_.front();
    grad_sends_.erase(grad_sends_.begin());
    ex.wait(m.action);
    return m.buffer;
  }
  if (free_.empty()) {
    ex.grow_pool(pool_);
    return pool_++;
  }
  const int b = free_.back();
  free_.pop_back();
  return b;
}

// The activation sent from this compute's (chunk, slot) must have left before the forward of
// the slot's next micro-batch overwrites it, and before the backward of its own micro-batch
// (recompute rewrites block outputs); by then it has, long ago (the next stage received it
// before sending the gradient this backward consumes), but the wait makes it explicit.
void MessageFlow::compute(PipelineExecutor& ex, std::size_t i, int input) {
  const Action& a = actions_[i];
  const auto c = static_cast<std::size_t>(a.chunk);
  std::size_t& sent = slot_send_[c][static_cast<std::size_t>(a.micro % chunk_slots_[c])];
  if (sent != kNone) {
    ex.wait(sent);
    sent = kNone;
  }
  ex.compute(i, input);
  if (input >= 0) free_.push_back(input);
}

void MessageFlow::send(PipelineExecutor& ex, std::size_t i) {
  const Action& a = actions_[i];
  if (a.op == Op::send_act) {
    const auto c = static_cast<std::size_t>(a.chunk);
    slot_send_[c][static_cast<std::size_t>(a.micro % chunk_slots_[c])] = i;
    ex.issue({i, -1});
    return;
  }
  const Message m{i, take(ex)};
  ex.issue(m);
  grad_sends_.push_back(m);
}

void MessageFlow::run_step(PipelineExecutor& ex) {
  std::size_t next_post = 0, received = 0;
  std::deque<Message> posted;  // list order
  int input = -1;  // pool buffer holding the received input of the next compute
  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    // ahead: the receive this action may wait for, and recv_ahead after it, are in flight;
    // at_use: those posted before this action (receive_posting).
    std::size_t upto =
        std::min(received + 1 + static_cast<std::size_t>(recv_ahead_), recv_at_.size());
    if (policy_ == PostPolicy::at_use) {
      upto = next_post;
      while (upto < recv_at_.size() && post_before_[upto] <= i) ++upto;
    }
    while (next_post < upto) {
      const Message m{recv_at_[next_post++], take(ex)};
      ex.issue(m);
      posted.push_back(m);
    }
    if (is_recv(a)) {
      MESHTRAIN_CHECK(!posted.empty() && posted.front().action == i, "PipelineRunner: receive ",
                      to_string(a), " was not posted");
      ex.wait(i);
      input = posted.front().buffer;
      posted.pop_front();
      ++received;
    } else if (is_compute(a)) {
      compute(ex, i, input);
      input = -1;
    } else {
      send(ex, i);
    }
  }
  MESHTRAIN_CHECK(posted.empty() && received == recv_at_.size(),
                  "PipelineRunner: receives left over at the end of the step");
  ex.wait_all_sends();
  for (const Message& m : grad_sends_) free_.push_back(m.buffer);
  grad_sends_.clear();
  for (auto& slots : slot_send_) std::fill(slots.begin(), slots.end(), kNone);
}

namespace {

// MessageFlow replayed for two steps with gradient sends that complete once the peer has
// received them, except the latest: the buffers it grows to.
int replay_pool(const ScheduleSpec& spec, int stage, PostPolicy policy, int recv_ahead,
                int max_pool) {
  struct Replay final : PipelineExecutor {
    const std::vector<Action>* actions = nullptr;
    std::size_t latest = kNone;  // the latest gradient send
    void grow_pool(int) override {}
    void issue(const Message& m) override {
      if ((*actions)[m.action].op == Op::send_grad) latest = m.action;
    }
    void wait(std::size_t) override {}
    bool test(std::size_t action) override { return action != latest; }
    void compute(std::size_t, int) override {}
    void wait_all_sends() override { latest = kNone; }
  } replay;
  MessageFlow flow(build_schedule(spec, stage), chunk_slots_needed(spec, stage), policy,
                   recv_ahead, max_pool,
                   policy == PostPolicy::at_use ? receive_posting(spec, stage)
                                                : std::vector<std::size_t>{});
  replay.actions = &flow.actions();
  for (int step = 0; step < 2; ++step) flow.run_step(replay);
  return flow.pool_size();
}

}  // namespace

int predicted_message_buffers(const ScheduleSpec& spec, int stage, PostPolicy policy,
                              int recv_ahead) {
  // at_use: the runner allocates its capped pool whole, up front.
  if (policy == PostPolicy::at_use) return message_pool_cap(spec, stage);
  return replay_pool(spec, stage, policy, recv_ahead, 0);
}

int message_pool_cap(const ScheduleSpec& spec, int stage) {
  // A pure function of the schedule that the planner asks for under many layouts.
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int, int>, int> memo;
  const auto key = std::make_tuple(static_cast<int>(spec.kind), spec.pp, spec.n_micro,
                                   spec.chunks, stage);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto it = memo.find(key);
    if (it != memo.end()) return it->second;
  }
  const int grown = replay_pool(spec, stage, PostPolicy::at_use, 0, 0);
  const int cap = grown == 0 ? 0 : std::max(2, grown);
  const std::lock_guard<std::mutex> lock(mutex);
  memo.emplace(key, cap);
  return cap;
}

}  // namespace meshtrain::parallel
