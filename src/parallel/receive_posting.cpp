#include "meshtrain/parallel/receive_posting.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

namespace {

bool is_recv(Op op) { return op == Op::recv_act || op == Op::recv_grad; }
bool is_send(Op op) { return op == Op::send_act || op == Op::send_grad; }
bool is_compute(Op op) { return op == Op::forward || op == Op::backward; }

struct Stage {
  std::vector<Action> actions;
  std::vector<std::size_t> recv_at;  // action index of each receive, list order
  std::vector<std::size_t> post;     // where each receive is posted
  std::vector<int> recv_k;           // per receive: its index among those from its peer
  std::vector<int> send_k;           // per action (sends): index among those to its peer
};

// One step of every stage under the strict model; returns true when all complete, else fills
// `stuck` with each stage's position (the compute it waits at; actions.size() when done).
bool replay(std::vector<Stage>& st, std::vector<std::size_t>& stuck) {
  const std::size_t S = st.size();
  // Per direction from * S + to: messages of that direction issued by the sender / by the
  // receiver (flat, not a map: the planner replays long schedules for many layouts).
  std::vector<int> sent(S * S, 0), posted(S * S, 0);
  std::vector<std::size_t> pos(S, 0);
  // Per stage: the messages it issued that are not known complete, as (direction, k).
  std::vector<std::vector<std::pair<std::size_t, int>>> pending(S);
  std::vector<std::size_t> next_recv(S, 0);  // receives issued so far (list order)
  auto done = [&](const std::pair<std::size_t, int>& m) {
    return sent[m.first] > m.second && posted[m.first] > m.second;
  };
  auto direction = [S](int from, int to) {
    return static_cast<std::size_t>(from) * S + static_cast<std::size_t>(to);
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (std::size_t s = 0; s < S; ++s) {
      Stage& g = st[s];
      while (pos[s] < g.actions.size()) {
        const std::size_t i = pos[s];
        // Receives posted before action i (in list order).
        while (next_recv[s] < g.recv_at.size() && g.post[next_recv[s]] <= i) {
          const std::size_t r = next_recv[s]++;
          const std::size_t d = direction(g.actions[g.recv_at[r]].peer, static_cast<int>(s));
          const int k = posted[d]++;
          pending[s].push_back({d, k});
          moved = true;
        }
        const Action& a = g.actions[i];
        if (is_compute(a.op)) {
          // A device synchronisation: every message issued so far must be done.
          bool all = true;
          for (const auto& m : pending[s]) all = all && done(m);
          if (!all) break;
          pending[s].clear();
        } else if (is_send(a.op)) {
          const std::size_t d = direction(static_cast<int>(s), a.peer);
          const int k = sent[d]++;
          pending[s].push_back({d, k});
        }
        ++pos[s];
        moved = true;
      }
    }
  }
  stuck = pos;
  for (std::size_t s = 0; s < S; ++s)
    if (pos[s] < st[s].actions.size()) return false;
  return true;
}

using Postings = std::vector<std::vector<std::size_t>>;  // per stage

Postings all_stages(const ScheduleSpec& spec) {
  std::vector<Stage> st(static_cast<std::size_t>(spec.pp));
  for (int s = 0; s < spec.pp; ++s) {
    Stage& g = st[static_cast<std::size_t>(s)];
    g.actions = build_schedule(spec, s);
    std::map<int, int> from_count;
    for (std::size_t i = 0; i < g.actions.size(); ++i)
      if (is_recv(g.actions[i].op)) {
        g.recv_at.push_back(i);
        g.post.push_back(i);
        g.recv_k.push_back(from_count[g.actions[i].peer]++);
      }
  }
  std::vector<std::size_t> stuck;
  for (int round = 0; !replay(st, stuck); ++round) {
    // Each stage waiting at a compute for a send of its own: the peer posts that receive (and
    // its earlier ones from this stage) where the peer now waits.
    bool changed = false;
    std::map<std::pair<int, int>, int> sends_before;  // (from, to) -> sends issued before stuck
    for (std::size_t s = 0; s < st.size(); ++s)
      for (std::size_t i = 0; i < stuck[s] && i < st[s].actions.size(); ++i)
        if (is_send(st[s].actions[i].op)) ++sends_before[{static_cast<int>(s), st[s].actions[i].peer}];
    for (const auto& [key, count] : sends_before) {
      Stage& p = st[static_cast<std::size_t>(key.second)];
      const std::size_t here = stuck[static_cast<std::size_t>(key.second)];
      // The last of them, and every receive before it in list order (receives are issued in
      // list order: the peers' send orders).
      std::size_t last = p.recv_at.size();
      for (std::size_t r = 0; r < p.recv_at.size(); ++r)
        if (p.actions[p.recv_at[r]].peer == key.first && p.recv_k[r] < count) last = r;
      if (last == p.recv_at.size()) continue;
      for (std::size_t r = 0; r <= last; ++r)
        if (p.post[r] > here) {
          p.post[r] = here;
          changed = true;
        }
    }
    MESHTRAIN_CHECK(changed && round < 10000, "receive_posting: no posting of the ",
                    schedule_name(spec.kind), " schedule (pp ", spec.pp, ", ", spec.n_micro,
                    " micro-batches, ", spec.chunks, " chunks) completes a step on NCCL");
  }
  Postings out;
  for (Stage& g : st) out.push_back(std::move(g.post));
  return out;
}

}  // namespace

std::vector<std::size_t> receive_posting(const ScheduleSpec& spec, int stage) {
  // Every stage's answer comes from one replay of all stages, and the planner asks for the same
  // schedules under many layouts: each schedule is replayed once per process.
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int>, std::shared_ptr<const Postings>> memo;
  const auto key = std::make_tuple(static_cast<int>(spec.kind), spec.pp, spec.n_micro,
                                   spec.chunks);
  std::shared_ptr<const Postings> p;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto it = memo.find(key);
    if (it != memo.end()) p = it->second;
  }
  if (!p) {
    p = std::make_shared<const Postings>(all_stages(spec));
    const std::lock_guard<std::mutex> lock(mutex);
    memo.emplace(key, p);
  }
  MESHTRAIN_CHECK(stage >= 0 && stage < spec.pp, "receive_posting: stage ", stage,
                  " outside pp ", spec.pp);
  return (*p)[static_cast<std::size_t>(stage)];
}

}  // namespace meshtrain::parallel
