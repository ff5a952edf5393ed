// MessageFlow by simulation (no MPI): every stage of a pipeline runs its flow against a
// simulated network in which a message is delivered once both ends have posted it and a send
// completes at random tests after delivery (seeded). The buffers the policy chooses must never
// be reused while a message still lives in them: a receive buffer until the compute that reads
// it, a gradient-send buffer until the send completed. Receives are posted in the order the peer
// sends (NCCL matches in issue order), and the pool the planner predicts is an upper bound of
// what a stage allocates when sends complete no later than the prediction assumes.
#include <map>
#include <random>
#include <set>
#include <vector>

#include "harness.hpp"
#include "meshtrain/parallel/message_flow.hpp"
#include "meshtrain/parallel/schedule.hpp"

using namespace meshtrain::parallel;

namespace {

// One stage's executor: checks buffer lifetimes; sends complete when `done` says so.
struct Stage final : PipelineExecutor {
  const std::vector<Action>* actions = nullptr;
  std::mt19937_64 rng{1};
  std::set<int> live;                 // buffers holding a message still needed
  std::map<std::size_t, int> posted;  // receive action -> buffer
  std::map<std::size_t, int> sending; // gradient send action -> buffer, not yet completed
  int pool = 0;
  bool eager = false;                 // every send completes at its first test
  std::vector<std::size_t> recv_order;  // receive actions in the order posted

  void use(int b) {
    REQUIRE(b >= 0);
    REQUIRE(b < pool);
    REQUIRE(live.count(b) == 0);  // not reused while a message lives in it
    live.insert(b);
  }
  void grow_pool(int b) override { REQUIRE(b == pool++); }
  void issue(const Message& m) override {
    const Op op = (*actions)[m.action].op;
    if (op == Op::recv_act || op == Op::recv_grad) {
      use(m.buffer);
      posted[m.action] = m.buffer;
      recv_order.push_back(m.action);
    } else if (op == Op::send_grad) {
      use(m.buffer);
      sending[m.action] = m.buffer;
    } else {
      REQUIRE(op == Op::send_act);
      REQUIRE(m.buffer == -1);  // sent from the model's output
    }
  }
  void wait(std::size_t a) override {
    const Op op = (*actions)[a].op;
    if (op == Op::recv_act || op == Op::recv_grad) REQUIRE(posted.count(a) == 1);
  }
  void compute(std::size_t a, int input) override {
    const Op op = (*actions)[a].op;
    REQUIRE((op == Op::forward || op == Op::backward));
    if (input >= 0) live.erase(input);  // consumed (the model copies its input)
  }
  bool test(std::size_t a) override {
    REQUIRE(sending.count(a) == 1);
    if (!eager && std::uniform_int_distribution<int>(0, 1)(rng) == 0) return false;
    live.erase(sending.at(a));
    sending.erase(a);
    return true;
  }
  void wait_all_sends() override {
    for (const auto& [a, b] : sending) live.erase(b);
    sending.clear();
  }
};

}  // namespace

TEST_CASE("MessageFlow: buffers live until consumed, receives in the peer's order",
          "[parallel][policy]") {
  for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved})
    for (int pp : {2, 4})
      for (int micro : {4, 8}) {
        ScheduleSpec spec;
        spec.kind = kind;
        spec.pp = pp;
        spec.n_micro = micro;
        spec.chunks = kind == ScheduleKind::interleaved ? 2 : 1;
        for (int s = 0; s < pp; ++s) {
          INFO(schedule_name(kind) << " pp " << pp << " micro " << micro << " stage " << s);
          const auto actions = build_schedule(spec, s);
          const auto slots = chunk_slots_needed(spec, s);
          for (std::uint64_t seed = 0; seed < 5; ++seed) {
            MessageFlow flow(actions, slots, 2);
            Stage st;
            st.actions = &flow.actions();
            st.rng.seed(seed);
            for (int step = 0; step < 3; ++step) {
              st.recv_order.clear();
              flow.run_step(st);
              REQUIRE(st.live.empty());
              // Posted in list order: the order the peer sends (schedule.cpp proves the lists
              // consistent).
              for (std::size_t i = 1; i < st.recv_order.size(); ++i)
                REQUIRE(st.recv_order[i - 1] < st.recv_order[i]);
              REQUIRE(st.recv_order.size() == flow.receives());
            }
            REQUIRE(flow.pool_size() == st.pool);
          }
          // The prediction assumes every send but the latest has completed when a buffer is
          // needed: a run whose sends complete at once needs no more than predicted.
          MessageFlow flow(actions, slots, 2);
          Stage eager;
          eager.actions = &flow.actions();
          eager.eager = true;
          for (int step = 0; step < 2; ++step) flow.run_step(eager);
          REQUIRE(flow.pool_size() <= predicted_message_buffers(spec, s));
          REQUIRE(flow.pool_size() >= (s == 0 && pp > 1 ? 1 : 0));
        }
      }
}
