// The step's data (parallel::StepBatches): each micro-batch produced once per pass and uploaded
// only where it is read, its contents, context parallelism's rows; and the forward-only
// schedule that evaluation runs (a simulation of all ranks, no MPI).
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "harness.hpp"
#include "meshtrain/parallel/schedule.hpp"
#include "meshtrain/parallel/step_batch.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

namespace {

constexpr int kB = 2, kT = 4;

// Sequence g is g*100 + t as tokens and g*100 + t + 1 as targets; counts its calls.
struct Source {
  int calls = 0;
  BatchSource fn() {
    return [this](int first, int count, std::int32_t* in, std::int32_t* tg) {
      ++calls;
      for (int k = 0; k < count; ++k)
        for (int t = 0; t < kT; ++t) {
          in[k * kT + t] = (first + k) * 100 + t;
          tg[k * kT + t] = (first + k) * 100 + t + 1;
        }
    };
  }
};

std::vector<std::int32_t> host(View1<const std::int32_t> v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return std::vector<std::int32_t>(h.data(), h.data() + h.extent(0));
}

std::vector<std::int32_t> expected(int first, int offset, const std::vector<int>& rows) {
  std::vector<std::int32_t> out;
  for (int k = 0; k < kB; ++k)
    for (int t : rows) out.push_back((first + k) * 100 + t + offset);
  return out;
}

}  // namespace

TEST_CASE("a micro-batch is produced once and uploaded where it is read", "[step_batch]") {
  const std::vector<int> all{0, 1, 2, 3};
  StepBatches::Shape s;
  s.micro_batch = kB;
  s.seq_len = kT;
  // the first stage of an interleaved pipeline: asked at its embedding chunk's forwards
  s.tokens = true;
  s.token_slots = 2;
  {
    StepBatches b(s, ExecSpace{});
    Source src;
    const BatchSource fn = src.fn();
    b.begin(fn, [](int m) { return 10 * m; });
    for (int m = 0; m < 4; ++m) {
      const StepBatch sb = b.get(m);
      REQUIRE(sb.targets.span() == 0);
      REQUIRE(host(sb.tokens) == expected(10 * m, 0, all));
    }
    b.end();
    REQUIRE(src.calls == 4);
    REQUIRE(b.uploads() == 4);
  }
  // one rank with the whole model: the chunk that embeds and the head's ask for the same one
  s.targets = true;
  {
    StepBatches b(s, ExecSpace{});
    Source src;
    const BatchSource fn = src.fn();
    for (int pass = 0; pass < 2; ++pass) {  // a second pass produces again
      b.begin(fn, [](int m) { return 2 * m; });
      for (int m = 0; m < 3; ++m) {
        const StepBatch first = b.get(m), again = b.get(m);
        REQUIRE(first.tokens.data() == again.tokens.data());
        REQUIRE(host(again.tokens) == expected(2 * m, 0, all));
        REQUIRE(host(again.targets) == expected(2 * m, 1, all));
      }
      b.end();
    }
    REQUIRE(src.calls == 6);
    REQUIRE(b.uploads() == 12);
  }
  // a middle stage reads nothing
  s.tokens = s.targets = false;
  {
    StepBatches b(s, ExecSpace{});
    Source src;
    const BatchSource fn = src.fn();
    b.begin(fn, [](int m) { return m; });
    const StepBatch sb = b.get(0);
    b.end();
    REQUIRE(sb.tokens.span() + sb.targets.span() == 0);
    REQUIRE(src.calls == 0);
  }
}

TEST_CASE("under context parallelism a stage uploads its rows of each sequence",
          "[step_batch]") {
  StepBatches::Shape s;
  s.micro_batch = kB;
  s.seq_len = kT;
  s.positions = {0, 3};  // cp 2, rank 0: chunks 0 and 3 of 4
  s.targets = true;      // the last stage
  StepBatches b(s, ExecSpace{});
  Source src;
  const BatchSource fn = src.fn();
  b.begin(fn, [](int m) { return m * kB; });
  const StepBatch sb = b.get(1);
  b.end();
  REQUIRE(sb.tokens.span() == 0);
  REQUIRE(host(sb.targets) == expected(kB, 1, s.positions));
}

TEST_CASE("the forward-only schedule runs every micro-batch through the virtual stages in order",
          "[step_batch][schedule]") {
  for (int pp : {1, 2, 3, 4})
    for (int v : {1, 2, 3})
      for (int m : {1, 2, 5}) {
        const ScheduleSpec s{ScheduleKind::forward_only, pp, m, v};
        INFO(schedule_name(s.kind) << " pp=" << pp << " m=" << m << " v=" << v);
        std::vector<std::vector<Action>> lists;
        for (int r = 0; r < pp; ++r) lists.push_back(build_schedule(s, r));
        // each rank: every (micro, chunk) forward once, micro-batches in order, no backward
        for (int r = 0; r < pp; ++r) {
          std::vector<std::pair<int, int>> fwd;
          for (const Action& a : lists[static_cast<std::size_t>(r)]) {
            REQUIRE(a.op != Op::backward);
            REQUIRE(a.op != Op::recv_grad);
            REQUIRE(a.op != Op::send_grad);
            if (a.op == Op::forward) fwd.emplace_back(a.micro, a.chunk);
          }
          std::vector<std::pair<int, int>> want;
          for (int i = 0; i < m; ++i)
            for (int c = 0; c < v; ++c) want.emplace_back(i, c);
          REQUIRE(fwd == want);
        }
        // every rank completes (sends buffered, a receive waits for its send), and each pair
        // receives in the order its peer sends
        using Key = std::tuple<int, int, int, int>;  // src, dst, micro, boundary
        std::map<std::pair<int, int>, std::vector<Key>> sends, recvs;
        std::set<Key> sent;
        std::vector<std::size_t> pc(static_cast<std::size_t>(pp), 0);
        for (bool progress = true; progress;) {
          progress = false;
          for (int r = 0; r < pp; ++r) {
            auto& l = lists[static_cast<std::size_t>(r)];
            auto& i = pc[static_cast<std::size_t>(r)];
            for (; i < l.size(); ++i, progress = true) {
              const Action& a = l[i];
              if (a.op == Op::forward) continue;
              const MessageKey k = message_key(s, r, a);
              if (a.op == Op::send_act) {
                const Key key{r, a.peer, k.micro, k.boundary};
                sent.insert(key);
                sends[{r, a.peer}].push_back(key);
              } else {
                const Key key{a.peer, r, k.micro, k.boundary};
                if (!sent.count(key)) break;
                recvs[{a.peer, r}].push_back(key);
              }
            }
          }
        }
        for (int r = 0; r < pp; ++r)
          REQUIRE(pc[static_cast<std::size_t>(r)] == lists[static_cast<std::size_t>(r)].size());
        REQUIRE(sends == recvs);
      }
}
