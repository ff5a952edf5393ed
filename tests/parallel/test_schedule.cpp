// Pipeline schedules without MPI: coverage, ordering, deadlock freedom (a discrete simulation of
// all ranks), FIFO matching per rank pair (NCCL has no tags), the in-flight activation bound
// and the bubble of an ideal pipeline.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "harness.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/parallel/schedule.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

namespace {

std::string describe(const ScheduleSpec& s) {
  return cat(schedule_name(s.kind), " pp=", s.pp, " m=", s.n_micro, " v=", s.chunks);
}

// Every spec of the test matrix that validate() accepts.
std::vector<ScheduleSpec> matrix() {
  std::vector<ScheduleSpec> out;
  for (int pp : {1, 2, 3, 4, 8})
    for (ScheduleKind k :
         {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved})
      for (int v : {1, 2, 3}) {
        if (v > 1 && k != ScheduleKind::interleaved) continue;
        std::set<int> ms{1, pp, 2 * pp, 2 * pp + 1, 3 * pp};
        for (int m : ms) {
          const ScheduleSpec s{k, pp, m, v};
          if (k == ScheduleKind::interleaved && v > 1 && pp > 1 && m % pp != 0) continue;
          out.push_back(s);
        }
      }
  return out;
}

using Key = std::tuple<int, int, bool, int, int>;  // src, dst, grad, micro, boundary
Key key_of(const ScheduleSpec& s, int src, int dst, int stage, const Action& a) {
  const MessageKey k = message_key(s, stage, a);
  return {src, dst, k.grad, k.micro, k.boundary};
}
bool is_send(Op op) { return op == Op::send_act || op == Op::send_grad; }
bool is_recv(Op op) { return op == Op::recv_act || op == Op::recv_grad; }

struct SimResult {
  bool completed = true;
  std::string stuck;          // where the ranks blocked, when not completed
  double makespan = 0;
  std::vector<double> busy;   // compute time per rank
  int unmatched_sends = 0;    // messages sent but never received
};

// Every rank executes its list in order; sends never block (buffered), a receive blocks until
// the matching send has executed. Compute costs tf (forward) and tb (backward) per whole
// stage, split evenly over the chunks; communication is free. Event times are exact: an action
// starts when its predecessor on the rank and, for a receive, the matching send are done.
SimResult simulate(const ScheduleSpec& s, double tf = 1.0, double tb = 2.0) {
  std::vector<std::vector<Action>> lists;
  for (int r = 0; r < s.pp; ++r) lists.push_back(build_schedule(s, r));
  std::vector<std::size_t> pc(lists.size(), 0);
  std::vector<double> now(lists.size(), 0.0);
  SimResult res;
  res.busy.assign(lists.size(), 0.0);
  std::map<Key, double> sent;
  std::set<Key> received;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.pp; ++r) {
      auto& l = lists[static_cast<std::size_t>(r)];
      auto& i = pc[static_cast<std::size_t>(r)];
      auto& t = now[static_cast<std::size_t>(r)];
      while (i < l.size()) {
        const Action& a = l[i];
        if (is_recv(a.op)) {
          const Key k = key_of(s, a.peer, r, r, a);
          auto it = sent.find(k);
          if (it == sent.end()) break;
          t = std::max(t, it->second);
          REQUIRE(received.insert(k).second);  // received once
        } else if (is_send(a.op)) {
          REQUIRE(sent.emplace(key_of(s, r, a.peer, r, a), t).second);  // sent once
        } else {
          const double c = (a.op == Op::forward ? tf : tb) / s.chunks;
          t += c;
          res.busy[static_cast<std::size_t>(r)] += c;
        }
        ++i;
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.pp; ++r) {
    const auto& l = lists[static_cast<std::size_t>(r)];
    const std::size_t i = pc[static_cast<std::size_t>(r)];
    if (i < l.size()) {
      res.completed = false;
      res.stuck += cat(" rank ", r, " at ", to_string(l[i]), ";");
    }
    res.makespan = std::max(res.makespan, now[static_cast<std::size_t>(r)]);
  }
  res.unmatched_sends = static_cast<int>(sent.size() - received.size());
  return res;
}

std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

}  // namespace

TEST_CASE("schedule kinds parse by name", "[parallel][schedule]") {
  REQUIRE(parse_schedule_kind("gpipe") == ScheduleKind::gpipe);
  REQUIRE(parse_schedule_kind("1f1b") == ScheduleKind::one_f_one_b);
  REQUIRE(parse_schedule_kind("interleaved") == ScheduleKind::interleaved);
  for (auto k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved})
    REQUIRE(parse_schedule_kind(schedule_name(k)) == k);
  const std::string msg = config_error([] { parse_schedule_kind("pipedream"); });
  REQUIRE(msg.find("pp.schedule") != std::string::npos);
  REQUIRE(msg.find("pipedream") != std::string::npos);
}

TEST_CASE("every forward and backward runs once, on its rank, backward after forward",
          "[parallel][schedule]") {
  for (const ScheduleSpec& s : matrix()) {
    INFO(describe(s));
    for (int r = 0; r < s.pp; ++r) {
      INFO("rank " << r);
      const auto list = build_schedule(s, r);
      std::map<std::pair<int, int>, int> fwd_at, bwd_at;
      for (int i = 0; i < static_cast<int>(list.size()); ++i) {
        const Action& a = list[static_cast<std::size_t>(i)];
        REQUIRE(a.micro >= 0);
        REQUIRE(a.micro < s.n_micro);
        REQUIRE(a.chunk >= 0);
        REQUIRE(a.chunk < s.chunks);
        const int vs = s.virtual_stage(r, a.chunk);
        switch (a.op) {
          case Op::forward:
            REQUIRE(a.peer == -1);
            REQUIRE(fwd_at.emplace(std::pair{a.micro, a.chunk}, i).second);
            break;
          case Op::backward:
            REQUIRE(a.peer == -1);
            REQUIRE(bwd_at.emplace(std::pair{a.micro, a.chunk}, i).second);
            REQUIRE(fwd_at.count({a.micro, a.chunk}) == 1);
            break;
          case Op::recv_act:
          case Op::send_grad:
            REQUIRE(vs > 0);  // the first virtual stage reads tokens
            REQUIRE(a.peer == (r + s.pp - 1) % s.pp);
            break;
          case Op::send_act:
          case Op::recv_grad:
            REQUIRE(vs < s.n_pieces() - 1);  // the last one computes the loss
            REQUIRE(a.peer == (r + 1) % s.pp);
            break;
        }
        // A receive feeds the compute right after it; a send follows the compute before it.
        if (is_recv(a.op)) {
          const Action& n = list.at(static_cast<std::size_t>(i + 1));
          REQUIRE(n.op == (a.op == Op::recv_act ? Op::forward : Op::backward));
          REQUIRE((n.micro == a.micro && n.chunk == a.chunk));
        }
        if (is_send(a.op)) {
          const Action& p = list.at(static_cast<std::size_t>(i - 1));
          REQUIRE(p.op == (a.op == Op::send_act ? Op::forward : Op::backward));
          REQUIRE((p.micro == a.micro && p.chunk == a.chunk));
        }
      }
      REQUIRE(fwd_at.size() == static_cast<std::size_t>(s.n_micro * s.chunks));
      REQUIRE(bwd_at.size() == fwd_at.size());
    }
  }
}

TEST_CASE("all ranks together complete: no deadlock, every message received once",
          "[parallel][schedule]") {
  for (const ScheduleSpec& s : matrix()) {
    INFO(describe(s));
    const SimResult res = simulate(s);
    INFO("blocked:" << res.stuck);
    REQUIRE(res.completed);
    REQUIRE(res.unmatched_sends == 0);
  }
}

TEST_CASE("each rank receives from a peer in the order the peer sends (FIFO per pair)",
          "[parallel][schedule]") {
  // NCCL matches point-to-point messages of a pair in issue order; posting receives in list
  // order is then correct only if the orders agree.
  for (const ScheduleSpec& s : matrix()) {
    INFO(describe(s));
    std::map<std::pair<int, int>, std::vector<Key>> sends, recvs;
    for (int r = 0; r < s.pp; ++r)
      for (const Action& a : build_schedule(s, r)) {
        if (is_send(a.op)) sends[{r, a.peer}].push_back(key_of(s, r, a.peer, r, a));
        if (is_recv(a.op)) recvs[{a.peer, r}].push_back(key_of(s, a.peer, r, r, a));
      }
    REQUIRE(sends.size() == recvs.size());
    for (const auto& [pair, seq] : sends) {
      INFO("pair " << pair.first << " -> " << pair.second);
      REQUIRE(recvs[pair] == seq);
    }
  }
}

TEST_CASE("in-flight activation bound of each schedule", "[parallel][schedule]") {
  for (const ScheduleSpec& s : matrix()) {
    INFO(describe(s));
    const int m = s.n_micro, pp = s.pp, v = s.chunks;
    for (int r = 0; r < pp; ++r) {
      INFO("rank " << r);
      int expect = 0;
      if (s.kind == ScheduleKind::gpipe) expect = m;  // GPipe keeps every micro-batch
      else if (v == 1) expect = std::min(pp - r, m);  // 1F1B: pp on stage 0, pp - r in general
      else if (m == pp) expect = v * m;               // Megatron: one group, all forwards first
      else expect = std::min(2 * (pp - r - 1) + (v - 1) * pp + 1, v * m);  // warm-up + 1
      REQUIRE(max_in_flight(s, r) == expect);

      // The micro-batches in flight in one chunk are consecutive, so slot = micro % n_slots
      // with n_slots = slots_needed() never gives two live micro-batches the same slot.
      const int n_slots = slots_needed(s, r);
      REQUIRE(n_slots >= 1);
      REQUIRE(n_slots <= expect);
      // Per chunk: each chunk's own peak (chunk_slots_needed, what the model allocates) is
      // enough, is at most the stage's, and the largest of them is the stage's.
      const std::vector<int> per_chunk = chunk_slots_needed(s, r);
      REQUIRE(static_cast<int>(per_chunk.size()) == v);
      REQUIRE(*std::max_element(per_chunk.begin(), per_chunk.end()) == n_slots);
      std::vector<std::set<int>> live(static_cast<std::size_t>(v));
      for (const Action& a : build_schedule(s, r)) {
        auto& l = live[static_cast<std::size_t>(a.chunk)];
        const int k = per_chunk[static_cast<std::size_t>(a.chunk)];
        if (a.op == Op::forward) {
          for (int other : l) REQUIRE(other % n_slots != a.micro % n_slots);
          for (int other : l) REQUIRE(other % k != a.micro % k);
          l.insert(a.micro);
          REQUIRE(static_cast<int>(l.size()) <= k);
        } else if (a.op == Op::backward) {
          REQUIRE(*l.begin() == a.micro);  // oldest first
          l.erase(a.micro);
        }
        if (!l.empty()) REQUIRE(*l.rbegin() - *l.begin() + 1 == static_cast<int>(l.size()));
      }
    }
  }
}

TEST_CASE("idle time of an ideal pipeline matches the analytic bubble", "[parallel][schedule]") {
  for (const ScheduleSpec& s : matrix()) {
    INFO(describe(s));
    const SimResult res = simulate(s, 1.0, 2.0);
    REQUIRE(res.completed);
    // Every schedule here reaches the ideal: the work of one stage plus pp - 1 fill-and-drain
    // steps of 1/v of a micro-batch's forward and backward each.
    const double work = s.n_micro * 3.0;
    const double bubble = 1.0 - work / res.makespan;
    for (double b : res.busy) REQUIRE(b == mt_test::Approx(work));
    INFO("measured " << bubble << " analytic " << analytic_bubble(s));
    REQUIRE(bubble == mt_test::Approx(analytic_bubble(s)).margin(1e-12));
  }
  // Reference points: pp = 4, m = 8.
  REQUIRE(analytic_bubble({ScheduleKind::one_f_one_b, 4, 8, 1}) == mt_test::Approx(3.0 / 11));
  REQUIRE(analytic_bubble({ScheduleKind::interleaved, 4, 8, 2}) == mt_test::Approx(3.0 / 19));
  REQUIRE(analytic_bubble({ScheduleKind::gpipe, 1, 5, 1}) == 0.0);
}

TEST_CASE("n_micro = 1 is naive model parallelism", "[parallel][schedule]") {
  for (auto k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
    const ScheduleSpec s{k, 3, 1, 1};
    REQUIRE(build_schedule(s, 0) ==
            std::vector<Action>{{Op::forward, 0, 0, -1}, {Op::send_act, 0, 0, 1},
                                {Op::recv_grad, 0, 0, 1}, {Op::backward, 0, 0, -1}});
    REQUIRE(build_schedule(s, 1) ==
            std::vector<Action>{{Op::recv_act, 0, 0, 0}, {Op::forward, 0, 0, -1},
                                {Op::send_act, 0, 0, 2}, {Op::recv_grad, 0, 0, 2},
                                {Op::backward, 0, 0, -1}, {Op::send_grad, 0, 0, 0}});
    REQUIRE(build_schedule(s, 2) ==
            std::vector<Action>{{Op::recv_act, 0, 0, 1}, {Op::forward, 0, 0, -1},
                                {Op::backward, 0, 0, -1}, {Op::send_grad, 0, 0, 1}});
  }
}

TEST_CASE("interleaved: chunk boundaries wrap from the last rank to the first",
          "[parallel][schedule]") {
  const ScheduleSpec s{ScheduleKind::interleaved, 2, 2, 2};
  // virtual stages: rank 0 chunk 0 -> rank 1 chunk 0 -> rank 0 chunk 1 -> rank 1 chunk 1
  const auto r1 = build_schedule(s, 1);
  const auto r0 = build_schedule(s, 0);
  REQUIRE(std::count(r1.begin(), r1.end(), Action{Op::send_act, 0, 0, 0}) == 1);
  REQUIRE(std::count(r0.begin(), r0.end(), Action{Op::recv_act, 0, 1, 1}) == 1);
  REQUIRE(std::count(r0.begin(), r0.end(), Action{Op::send_grad, 0, 1, 1}) == 1);
  REQUIRE(std::count(r1.begin(), r1.end(), Action{Op::recv_grad, 1, 0, 0}) == 1);
  REQUIRE(message_key(s, 1, {Op::send_act, 0, 0, 0}) == MessageKey{false, 0, 1});
  REQUIRE(message_key(s, 0, {Op::recv_act, 0, 1, 1}) == MessageKey{false, 0, 1});
  // Megatron's forward order on rank 0 with pp = 2, v = 2, m = 4:
  // (m0 c0) (m1 c0) (m0 c1) (m1 c1) (m2 c0) (m3 c0) (m2 c1) (m3 c1)
  std::vector<std::pair<int, int>> fwd;
  for (const Action& a : build_schedule({ScheduleKind::interleaved, 2, 4, 2}, 0))
    if (a.op == Op::forward) fwd.emplace_back(a.micro, a.chunk);
  REQUIRE(fwd == std::vector<std::pair<int, int>>{
                     {0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {3, 0}, {2, 1}, {3, 1}});
}

TEST_CASE("bad schedule specs are configuration errors naming the option",
          "[parallel][schedule]") {
  auto has = [](const std::function<void()>& f, const char* what) {
    const std::string msg = config_error(f);
    INFO(msg);
    return msg.find(what) != std::string::npos;
  };
  REQUIRE(has([] { validate({ScheduleKind::gpipe, 0, 4, 1}); }, "mesh.pp"));
  REQUIRE(has([] { validate({ScheduleKind::gpipe, 2, 0, 1}); }, "train.grad_accum"));
  REQUIRE(has([] { validate({ScheduleKind::interleaved, 2, 2, 0}); }, "pp.virtual_chunks"));
  REQUIRE(has([] { validate({ScheduleKind::one_f_one_b, 2, 4, 2}); }, "pp.virtual_chunks"));
  REQUIRE(has([] { validate({ScheduleKind::interleaved, 4, 6, 2}); }, "train.grad_accum"));
  REQUIRE(has([] { validate({ScheduleKind::interleaved, 4, 1, 2}); }, "pp.virtual_chunks"));
  REQUIRE(has([] { build_schedule({ScheduleKind::interleaved, 4, 6, 2}, 0); }, "train.grad_accum"));
  // more stages than blocks
  REQUIRE(has([] { validate({ScheduleKind::one_f_one_b, 8, 8, 1}, 4); }, "model.n_layer=4"));
  REQUIRE(has([] { validate({ScheduleKind::interleaved, 2, 4, 3}, 4); }, "pp.virtual_chunks"));
  // interleaving with layers not divisible by pp * v
  REQUIRE(has([] { validate({ScheduleKind::interleaved, 2, 4, 2}, 10); }, "not divisible"));
  REQUIRE_NOTHROW(validate({ScheduleKind::interleaved, 2, 4, 2}, 12));
  REQUIRE_NOTHROW(validate({ScheduleKind::one_f_one_b, 4, 1, 1}, 7));
  REQUIRE_NOTHROW(validate({ScheduleKind::interleaved, 1, 3, 2}, 4));  // pp = 1: any m
}
