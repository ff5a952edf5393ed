// Replays of GradSync's and the pipeline runner's buffer pools (pools.hpp). The logic mirrors
// src/parallel/grad_sync.cpp and src/parallel/pipeline_runner.cpp step for step; when either
// changes how it acquires or releases buffers, change the replay with it (test_plan_memory
// compares the prediction with the allocations of the real objects).
#include "pools.hpp"

#include <algorithm>
#include <deque>

namespace meshtrain::plan::detail {

namespace {

// detail::BufferPool: best fit among free buffers, else a new buffer of exactly n.
class Pool {
 public:
  int acquire(std::size_t n) {
    int best = -1;
    for (int i = 0; i < static_cast<int>(size_.size()); ++i)
      if (!busy_[i] && size_[i] >= n && (best < 0 || size_[i] < size_[best])) best = i;
    if (best < 0) {
      size_.push_back(n);
      busy_.push_back(false);
      best = static_cast<int>(size_.size()) - 1;
    }
    busy_[best] = true;
    return best;
  }
  void release(int id) { busy_[id] = false; }
  bool has_free(std::size_t n) const {
    for (std::size_t i = 0; i < size_.size(); ++i)
      if (!busy_[i] && size_[i] >= n) return true;
    return false;
  }
  std::size_t count() const { return size_.size(); }
  std::size_t elems() const {
    std::size_t s = 0;
    for (auto v : size_) s += v;
    return s;
  }

 private:
  std::vector<std::size_t> size_;
  std::vector<bool> busy_;
};

// GradSync's hook logic for ZeRO 2/3, with "a collective completes by the next poll".
class ZeroReplay {
 public:
  ZeroReplay(const model::ParameterRegistry& reg, const std::vector<parallel::Bucket>& buckets,
             const parallel::ZeroPartition& part, int dp, int stage, bool deferred_wte)
      : buckets_(buckets), stage_(stage), dp_(dp), instant_(dp == 1) {
    const int U = static_cast<int>(reg.units().size());
    const int B = static_cast<int>(buckets.size());
    unit_bucket_.assign(U, -1);
    for (int b = 0; b < B; ++b) {
      for (int u = buckets[b].first_unit; u <= buckets[b].last_unit; ++u) unit_bucket_[u] = b;
      piece_.push_back(part.groups()[part.group_of(buckets[b].range.begin)].piece);
    }
    head_ = reg.head_unit();
    tied_ = head_ >= 0 ? reg.embedding_unit() : -1;
    grad_buf_.assign(B, -1);
    inflight_.assign(B, -1);
    grad_active_.assign(B, false);
    grad_launch_.assign(B, 0);
    pending_.assign(B, 0);
    param_buf_.assign(U, -1);
    if (deferred_wte && reg.embedding_unit() >= 0) deferred_ = unit_bucket_[reg.embedding_unit()];
    reset_counts();
  }

  void before_forward(int u) {
    poll(true);
    if (stage_ < 3) return;
    ensure_params(u);
    const int next = u + 1 < n_units() ? u + 1 : -1;
    if (u == tied_) {
      if (head_ >= 0 && param_buf_[head_] < 0 && next >= 0 && next != head_) start_gather(next);
      return;
    }
    keep_only(u, next);
    if (next >= 0) start_gather(next);
  }
  void before_backward(int u) {
    poll(false);
    if (stage_ == 3) {
      ensure_params(u);
      if (u != tied_) {
        const int next = u - 1 >= 0 && u - 1 != tied_ ? u - 1 : -1;
        keep_only(u, next);
        if (next >= 0) start_gather(next);
      }
    }
    ensure_grad_buffer(unit_bucket_[u]);
  }
  void after_backward(int u) {
    poll(false);
    const int b = unit_bucket_[u];
    if (--pending_[b] == 0) {
      pending_[b] = units_in(b);
      if (b != deferred_) launch(b);
    }
    if (stage_ == 3) release_params(u);
  }
  void finish() {
    poll(false);
    for (int b = 0; b < n_buckets(); ++b)
      if (grad_buf_[b] >= 0) launch(b);
    for (int b = 0; b < n_buckets(); ++b) {
      grad_active_[b] = false;
      complete_bucket(b);
    }
    reset_counts();
    if (stage_ == 3)
      for (int u = 0; u < n_units(); ++u) release_params(u);
  }
  ZeroPools pools() const { return {grad_pool_.elems(), param_pool_.elems()}; }

 private:
  int n_units() const { return static_cast<int>(unit_bucket_.size()); }
  int n_buckets() const { return static_cast<int>(buckets_.size()); }
  int units_in(int b) const { return buckets_[b].last_unit - buckets_[b].first_unit + 1; }
  void reset_counts() {
    for (int b = 0; b < n_buckets(); ++b) pending_[b] = units_in(b);
  }
  // A hook's test of the requests in flight: with dp = 1 they are complete; otherwise taken to
  // be still in flight (the peers may not have joined; MPI progresses only inside MPI calls),
  // which makes the replayed pool the largest the run can reach.
  void poll(bool /*in_forward*/) {
    if (instant_) complete_all();
  }
  void complete_bucket(int b) {
    if (inflight_[b] >= 0) grad_pool_.release(inflight_[b]);
    inflight_[b] = -1;
  }
  void ensure_grad_buffer(int b) {
    if (grad_buf_[b] >= 0) return;
    const std::size_t need = piece_[b] * dp_;
    const std::size_t limit = tied_ >= 0 ? 3 : 2;
    poll(false);
    while (!grad_pool_.has_free(need) && grad_pool_.count() >= limit) {
      int oldest = -1;
      for (int i = 0; i < n_buckets(); ++i)
        if (grad_active_[i] && (oldest < 0 || grad_launch_[i] < grad_launch_[oldest])) oldest = i;
      if (oldest < 0) break;
      grad_active_[oldest] = false;
      complete_bucket(oldest);
    }
    grad_buf_[b] = grad_pool_.acquire(need);
  }
  void launch(int b) {
    grad_active_[b] = false;
    complete_bucket(b);
    inflight_[b] = grad_buf_[b];
    grad_buf_[b] = -1;
    grad_active_[b] = true;
    grad_launch_[b] = ++clock_;
  }
  void start_gather(int u) {
    if (param_buf_[u] >= 0) return;
    param_buf_[u] = param_pool_.acquire(piece_[unit_bucket_[u]] * dp_);
  }
  void ensure_params(int u) {
    start_gather(u);
    // Waiting for the gather: collectives on one communicator complete in the order they were
    // launched, so every reduce-scatter launched before it has completed too.
    complete_all();
  }
  void complete_all() {
    for (int b = 0; b < n_buckets(); ++b)
      if (grad_active_[b]) {
        grad_active_[b] = false;
        complete_bucket(b);
      }
  }
  void release_params(int u) {
    if (param_buf_[u] < 0) return;
    param_pool_.release(param_buf_[u]);
    param_buf_[u] = -1;
  }
  void keep_only(int a, int b) {
    for (int u = 0; u < n_units(); ++u)
      if (u != a && u != b && u != tied_) release_params(u);
  }

  const std::vector<parallel::Bucket>& buckets_;
  int stage_, dp_;
  bool instant_;  // dp = 1: collectives complete when first tested; otherwise when waited for
  int head_ = -1, tied_ = -1;
  int deferred_ = -1;  // pp > 1: the bucket holding wte, reduced in finish()
  long clock_ = 0;
  std::vector<int> unit_bucket_, grad_buf_, inflight_, pending_, param_buf_;
  std::vector<std::size_t> piece_;
  std::vector<bool> grad_active_;
  std::vector<long> grad_launch_;
  Pool grad_pool_, param_pool_;
};

}  // namespace

ZeroPools replay_zero_pools(const model::ParameterRegistry& reg,
                            const std::vector<parallel::Bucket>& buckets,
                            const parallel::ZeroPartition& part, int dp, int zero_stage,
                            const parallel::ScheduleSpec& spec, int stage,
                            const std::vector<model::LayerRange>& chunks) {
  if (zero_stage < 2) return {};
  // GradSync::set_embedding_group defers the wte bucket on the stages of the embedding group.
  const bool deferred = spec.pp > 1 && (stage == 0 || stage == spec.pp - 1);
  ZeroReplay z(reg, buckets, part, dp, zero_stage, deferred);
  const int eu = reg.embedding_unit(), hu = reg.head_unit();
  const int last = static_cast<int>(chunks.size()) - 1;
  // The hooks of GptT::forward / backward for chunk c (gpt.cpp, gpt_layers.cpp).
  auto forward = [&](int c) {
    if (c == 0 && reg.has_embedding() && eu >= 0) z.before_forward(eu);
    for (int l = chunks[c].first; l < chunks[c].last; ++l) z.before_forward(reg.unit_of_layer(l));
    if (c == last && hu >= 0) {  // the head, whose backward runs inside its forward
      z.before_forward(hu);
      if (eu >= 0) z.before_forward(eu);
      z.before_backward(hu);
      if (eu >= 0) z.before_backward(eu);
      z.after_backward(hu);
      if (eu >= 0 && !reg.has_embedding()) z.after_backward(eu);
    }
  };
  auto backward = [&](int c) {
    for (int l = chunks[c].last - 1; l >= chunks[c].first; --l) {
      z.before_backward(reg.unit_of_layer(l));
      z.after_backward(reg.unit_of_layer(l));
    }
    if (c == 0 && reg.has_embedding() && eu >= 0) {
      z.before_backward(eu);
      z.after_backward(eu);
    }
  };
  const auto actions = spec.pp > 1 ? parallel::build_schedule(spec, stage)
                                   : std::vector<parallel::Action>{};
  for (int step = 0; step < 2; ++step) {  // the pools reach their size in the first step
    if (spec.pp == 1) {
      for (int m = 0; m < spec.n_micro; ++m) {
        forward(0);
        backward(0);
      }
    } else {
      for (const auto& a : actions) {
        if (a.op == parallel::Op::forward) forward(a.chunk);
        if (a.op == parallel::Op::backward) backward(a.chunk);
      }
    }
    z.finish();
  }
  return z.pools();
}

int replay_pipeline_buffers(const parallel::ScheduleSpec& spec, int stage, int recv_ahead) {
  using parallel::Op;
  const auto actions = parallel::build_schedule(spec, stage);
  std::vector<std::size_t> recv_at;
  for (std::size_t i = 0; i < actions.size(); ++i)
    if (actions[i].op == Op::recv_act || actions[i].op == Op::recv_grad) recv_at.push_back(i);
  int pool = 0;
  std::vector<int> free_list, grad_sends;
  auto take = [&] {
    if (free_list.empty() && grad_sends.size() > 1) {
      // reap_sends: sends complete once the peer has received them, except the latest, which
      // the peer is still consuming when this rank asks for its next buffer.
      free_list.insert(free_list.end(), grad_sends.begin(), grad_sends.end() - 1);
      grad_sends.erase(grad_sends.begin(), grad_sends.end() - 1);
    }
    if (free_list.empty()) return pool++;
    const int b = free_list.back();
    free_list.pop_back();
    return b;
  };
  for (int step = 0; step < 2; ++step) {
    std::size_t next_post = 0, received = 0;
    std::deque<int> posted;
    int input = -1;
    for (const auto& a : actions) {
      const std::size_t upto = std::min(received + 1 + recv_ahead, recv_at.size());
      while (next_post < upto) {
        posted.push_back(take());
        ++next_post;
      }
      switch (a.op) {
        case Op::recv_act:
        case Op::recv_grad:
          input = posted.front();
          posted.pop_front();
          ++received;
          break;
        case Op::forward:
        case Op::backward:
          if (input >= 0) free_list.push_back(input);
          input = -1;
          break;
        case Op::send_act: break;
        case Op::send_grad: grad_sends.push_back(take()); break;
      }
    }
    free_list.insert(free_list.end(), grad_sends.begin(), grad_sends.end());
    grad_sends.clear();
  }
  return pool;
}

}  // namespace meshtrain::plan::detail
