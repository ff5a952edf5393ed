// Every stage of a pipeline runs its MessageFlow (two steps, so the step boundary is crossed
// too) against simulated networks:
//  - MPI: each send and receive progresses on its own once both ends have posted it; the host
//    blocks where the flow waits, and computes run on the host.
//  - NCCL: computes run on a compute stream, which waits (without the host) for the messages
//    the flow waits on; messages run on communication streams in issue order, each starting
//    once the computes issued before it have run (the communicator orders its stream after
//    the compute stream), and a message moves only while both its send and its receive are at
//    the head of their streams (NCCL may hold a send until its receive is posted). Either one
//    stream per stage for every message (one NCCL communicator), or one per direction of each
//    pair of stages (Communicator::prepare_p2p).
// Messages between a pair of stages match in issue order (NCCL has no tags); every match is
// checked to be the same message (message_key) on both ends. Every schedule must complete on
// MPI and on NCCL with a stream per direction; on one NCCL stream, receives posted ahead must
// hang a 2-stage pipeline in its first step, as the first NCCL runs on an H200 did (both stages
// waiting in a receive): the negative control that shows the simulator sees the hang.
#include <map>
#include <string>
#include <vector>

#include "harness.hpp"
#include "meshtrain/parallel/message_flow.hpp"
#include "meshtrain/parallel/schedule.hpp"

using namespace meshtrain::parallel;

namespace {

// What one stage's host does over the steps, as the flow drives its executor.
struct Program final : PipelineExecutor {
  struct Item {
    enum Kind { issue, compute, wait } kind;
    int msg;  // issue and wait: index into msgs
  };
  struct Msg {
    bool send;
    int peer;
    MessageKey key;
  };
  const std::vector<Action>* actions = nullptr;
  ScheduleSpec spec;
  int stage = 0;
  int step = 0;
  std::vector<Item> host;
  std::vector<Msg> msgs;
  std::map<std::pair<int, std::size_t>, int> msg_of;  // (step, action) -> msg
  std::vector<int> unwaited_sends;

  void grow_pool(int) override {}
  void issue(const Message& m) override {
    const Action& a = (*actions)[m.action];
    const bool send = a.op == Op::send_act || a.op == Op::send_grad;
    const int k = static_cast<int>(msgs.size());
    msgs.push_back({send, a.peer, message_key(spec, stage, a)});
    msg_of[{step, m.action}] = k;
    if (send) unwaited_sends.push_back(k);
    host.push_back({Item::issue, k});
  }
  void wait(std::size_t a) override { host.push_back({Item::wait, msg_of.at({step, a})}); }
  bool test(std::size_t) override { return false; }  // no send is seen done early
  void compute(std::size_t, int) override { host.push_back({Item::compute, -1}); }
  void wait_all_sends() override {
    for (int k : unwaited_sends) host.push_back({Item::wait, k});
    unwaited_sends.clear();
  }
};

std::vector<Program> record(const ScheduleSpec& spec, int recv_ahead = 2) {
  std::vector<Program> progs(static_cast<std::size_t>(spec.pp));
  for (int s = 0; s < spec.pp; ++s) {
    MessageFlow flow(build_schedule(spec, s), chunk_slots_needed(spec, s), recv_ahead);
    Program& p = progs[static_cast<std::size_t>(s)];
    p.actions = &flow.actions();
    p.spec = spec;
    p.stage = s;
    for (p.step = 0; p.step < 2; ++p.step) flow.run_step(p);
    p.actions = nullptr;
  }
  return progs;
}

// partner[s][k]: (stage, msg) at the other end of stage s's message k: the j-th send s -> p
// with the j-th receive of p from s. Both ends must carry the same message.
using Partner = std::vector<std::vector<std::pair<std::size_t, int>>>;
Partner match(const std::vector<Program>& progs) {
  Partner partner(progs.size());
  std::map<std::pair<int, int>, std::vector<int>> sends, recvs;  // (from, to) -> msgs in order
  for (std::size_t s = 0; s < progs.size(); ++s) {
    partner[s].assign(progs[s].msgs.size(), {0, -1});
    for (std::size_t k = 0; k < progs[s].msgs.size(); ++k) {
      const auto& m = progs[s].msgs[k];
      if (m.send)
        sends[{static_cast<int>(s), m.peer}].push_back(static_cast<int>(k));
      else
        recvs[{m.peer, static_cast<int>(s)}].push_back(static_cast<int>(k));
    }
  }
  REQUIRE(sends.size() == recvs.size());
  for (const auto& [pair, sk] : sends) {
    const auto from = static_cast<std::size_t>(pair.first), to = static_cast<std::size_t>(pair.second);
    const auto& rk = recvs[pair];
    REQUIRE(sk.size() == rk.size());
    for (std::size_t j = 0; j < sk.size(); ++j) {
      REQUIRE(progs[from].msgs[static_cast<std::size_t>(sk[j])].key ==
              progs[to].msgs[static_cast<std::size_t>(rk[j])].key);
      partner[from][static_cast<std::size_t>(sk[j])] = {to, rk[j]};
      partner[to][static_cast<std::size_t>(rk[j])] = {from, sk[j]};
    }
  }
  return partner;
}

// MPI: true when every host reaches its end.
bool run_mpi(const std::vector<Program>& progs) {
  const Partner partner = match(progs);
  const std::size_t S = progs.size();
  std::vector<std::size_t> pos(S, 0);
  std::vector<std::vector<bool>> posted(S);
  for (std::size_t s = 0; s < S; ++s) posted[s].assign(progs[s].msgs.size(), false);
  auto done = [&](std::size_t s, int k) {
    const auto [p, q] = partner[s][static_cast<std::size_t>(k)];
    return posted[s][static_cast<std::size_t>(k)] && posted[p][static_cast<std::size_t>(q)];
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (std::size_t s = 0; s < S; ++s)
      for (; pos[s] < progs[s].host.size(); ++pos[s], moved = true) {
        const Program::Item& it = progs[s].host[pos[s]];
        if (it.kind == Program::Item::wait && !done(s, it.msg)) break;
        if (it.kind == Program::Item::issue) posted[s][static_cast<std::size_t>(it.msg)] = true;
      }
  }
  for (std::size_t s = 0; s < S; ++s)
    if (pos[s] < progs[s].host.size()) return false;
  return true;
}

// NCCL: true when every stream of every stage finishes; otherwise `stuck` says where each
// stage's compute stream stopped.
bool run_nccl(const std::vector<Program>& progs, bool stream_per_direction,
              std::string* stuck = nullptr) {
  const Partner partner = match(progs);
  const std::size_t S = progs.size();
  struct Stage {
    std::vector<Program::Item> compute;        // computes and waits, in host order
    std::map<int, std::vector<int>> streams;   // stream -> msgs in issue order
    std::vector<std::size_t> after;            // per msg: compute items issued before it
    std::vector<int> stream_of;                // per msg
  };
  std::vector<Stage> st(S);
  for (std::size_t s = 0; s < S; ++s) {
    st[s].after.assign(progs[s].msgs.size(), 0);
    st[s].stream_of.assign(progs[s].msgs.size(), 0);
    for (const Program::Item& it : progs[s].host) {
      if (it.kind != Program::Item::issue) {
        st[s].compute.push_back(it);
        continue;
      }
      const auto& m = progs[s].msgs[static_cast<std::size_t>(it.msg)];
      // A stream per direction of each pair: sends to p apart from receives from p.
      const int stream = stream_per_direction ? 2 * m.peer + (m.send ? 1 : 0) : 0;
      st[s].streams[stream].push_back(it.msg);
      st[s].after[static_cast<std::size_t>(it.msg)] = st[s].compute.size();
      st[s].stream_of[static_cast<std::size_t>(it.msg)] = stream;
    }
  }
  std::vector<std::size_t> cpos(S, 0);
  std::vector<std::map<int, std::size_t>> spos(S);  // stream -> msgs done
  std::vector<std::vector<bool>> done(S);
  for (std::size_t s = 0; s < S; ++s) done[s].assign(progs[s].msgs.size(), false);
  auto at_head = [&](std::size_t s, int k) {
    const int stream = st[s].stream_of[static_cast<std::size_t>(k)];
    const auto& v = st[s].streams.at(stream);
    const std::size_t p = spos[s][stream];
    return p < v.size() && v[p] == k && cpos[s] >= st[s].after[static_cast<std::size_t>(k)];
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (std::size_t s = 0; s < S; ++s)  // compute streams
      for (; cpos[s] < st[s].compute.size(); ++cpos[s], moved = true) {
        const Program::Item& it = st[s].compute[cpos[s]];
        if (it.kind == Program::Item::wait && !done[s][static_cast<std::size_t>(it.msg)]) break;
      }
    for (std::size_t s = 0; s < S; ++s)  // messages whose two ends are at their heads
      for (auto& [stream, v] : st[s].streams) {
        const std::size_t p = spos[s][stream];
        if (p >= v.size() || !at_head(s, v[p])) continue;
        const auto [q, qk] = partner[s][static_cast<std::size_t>(v[p])];
        if (!at_head(q, qk)) continue;
        done[s][static_cast<std::size_t>(v[p])] = done[q][static_cast<std::size_t>(qk)] = true;
        ++spos[q][st[q].stream_of[static_cast<std::size_t>(qk)]];
        ++spos[s][stream];
        moved = true;
      }
  }
  bool all = true;
  for (std::size_t s = 0; s < S; ++s) {
    bool mine = cpos[s] == st[s].compute.size();
    for (const auto& [stream, v] : st[s].streams) mine = mine && spos[s][stream] == v.size();
    all = all && mine;
    if (stuck && !mine) {
      *stuck += "stage " + std::to_string(s) + " stopped at compute-stream item " +
                std::to_string(cpos[s]) + " of " + std::to_string(st[s].compute.size());
      for (const auto& [stream, v] : st[s].streams) {
        const std::size_t p = spos[s][stream];
        if (p == v.size()) continue;
        const auto& m = progs[s].msgs[static_cast<std::size_t>(v[p])];
        *stuck += std::string("; stream head: ") + (m.send ? "send " : "receive ") +
                  (m.key.grad ? "gradient" : "activation") + " of micro-batch " +
                  std::to_string(m.key.micro) + " at boundary " + std::to_string(m.key.boundary) +
                  (m.send ? " to " : " from ") + std::to_string(m.peer);
      }
      *stuck += "\n";
    }
  }
  return all;
}

std::vector<ScheduleSpec> specs() {
  std::vector<ScheduleSpec> out;
  for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved})
    for (int pp : {2, 3, 4})
      for (int micro : {1, 2, 3, 4, 6, 8})
        for (int chunks : {1, 2, 3}) {
          if ((kind == ScheduleKind::interleaved) != (chunks > 1)) continue;
          if (kind == ScheduleKind::interleaved && micro % pp != 0) continue;
          ScheduleSpec spec;
          spec.kind = kind;
          spec.pp = pp;
          spec.n_micro = micro;
          spec.chunks = chunks;
          out.push_back(spec);
        }
  return out;
}

std::string name(const ScheduleSpec& s) {
  return std::string(schedule_name(s.kind)) + " pp " + std::to_string(s.pp) + " micro " +
         std::to_string(s.n_micro) + " chunks " + std::to_string(s.chunks);
}

}  // namespace

TEST_CASE("MessageFlow: every schedule completes on MPI and on NCCL with a stream per direction",
          "[parallel][policy]") {
  for (const ScheduleSpec& spec : specs())
    for (int ahead : {0, 2}) {
      INFO(name(spec) << ", receives posted " << ahead << " ahead");
      const auto progs = record(spec, ahead);
      REQUIRE(run_mpi(progs));
      std::string stuck;
      const bool done = run_nccl(progs, true, &stuck);
      INFO(stuck);
      REQUIRE(done);
    }
}

TEST_CASE("MessageFlow: on one NCCL stream, receives posted ahead hang (negative control)",
          "[parallel][policy]") {
  // What meshtrain 95f472d did on an H200: pp 2 with 1F1B or GPipe and 1, 2 or 4 micro-batches
  // hung in the first step, both stages outstanding on a receive.
  for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b})
    for (int micro : {1, 2, 4}) {
      ScheduleSpec spec;
      spec.kind = kind;
      spec.pp = 2;
      spec.n_micro = micro;
      INFO(name(spec));
      std::string stuck;
      REQUIRE_FALSE(run_nccl(record(spec), false, &stuck));
      INFO(stuck);
      // Both stages stopped with a receive at the head of their one stream.
      REQUIRE(stuck.find("stage 0") != std::string::npos);
      REQUIRE(stuck.find("stage 1") != std::string::npos);
      REQUIRE(stuck.find("stream head: receive") != std::string::npos);
    }
}
