// The profiler ranges (core/profile.hpp, issue 37) seen through a recording sink, as NVTX would
// see them on a CUDA build: steps, forward and backward per block inside the pipeline's actions,
// the head, the optimizer, each collective's issue with its group and bytes, pipeline sends and
// receives, checkpoint phases, and the profiler's capture window around the steps of
// profile.steps. No sink installed: no range is opened and no name is built.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "harness.hpp"
#include "layout_fixture.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/profile.hpp"
#include "meshtrain/io/dataset.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;

namespace {

// A tree of the ranges one rank opened, with the capture calls as leaves "[capture start]".
struct Node {
  std::string name;
  std::vector<Node> children;
};

class Recorder final : public prof::RangeSink {
 public:
  Recorder() { stack_.push_back(&root_); }
  void push(const std::string& name) override {
    stack_.back()->children.push_back(Node{name, {}});
    stack_.push_back(&stack_.back()->children.back());
  }
  void pop() override {
    REQUIRE(stack_.size() > 1);
    stack_.pop_back();
  }
  void mark(const std::string& what) { stack_.back()->children.push_back(Node{what, {}}); }
  const Node& root() const { return root_; }
  std::size_t depth() const { return stack_.size(); }

 private:
  Node root_;
  std::vector<Node*> stack_;
};

Recorder* g_recorder = nullptr;
void capture_start() { g_recorder->mark("[capture start]"); }
void capture_stop() { g_recorder->mark("[capture stop]"); }

// Depth-first: does `n` or a descendant have a name starting with `prefix`?
const Node* find(const Node& n, const std::string& prefix) {
  for (const Node& c : n.children) {
    if (c.name.rfind(prefix, 0) == 0) return &c;
    if (const Node* x = find(c, prefix)) return x;
  }
  return nullptr;
}
std::vector<std::string> top_names(const Node& n) {
  std::vector<std::string> v;
  for (const Node& c : n.children) v.push_back(c.name);
  return v;
}

train::TrainConfig config(const std::string& dir) {
  train::TrainConfig tc;
  tc.micro_batch = 2;
  tc.grad_accum = 2;
  tc.seq_len = 16;
  tc.steps = 3;
  tc.eval_every = 0;
  tc.log_every = 0;
  tc.adamw.warmup_steps = 1;
  tc.adamw.decay_steps = 3;
  tc.ckpt.dir = dir;
  tc.ckpt.final = false;
  tc.profile_first = 2;
  tc.profile_last = 2;
  return tc;
}

}  // namespace

TEST_CASE("without a sink no range opens and no name is built", "[profile]") {
  REQUIRE_FALSE(prof::enabled());
  int built = 0;
  {
    const prof::Range r([&] {
      ++built;
      return std::string("never");
    });
  }
  REQUIRE(built == 0);
}

TEST_CASE("ranges of a pipeline run: steps, blocks, messages, optimizer, checkpoints",
          "[profile][mpi]") {
  const int world = mt_test::world_size();
  if (world != 2) return;  // pp 2 on two ranks
  const std::string data = mt_test::layout_shard("test_profile_ranges");
  const std::string dir = "test_profile_ranges_ckpt";
  io::TokenDataset ds(data, 16);
  train::TrainConfig tc = config(dir);
  parallel::ParallelConfig pc;
  pc.shape.pp = 2;
  pc.shape.dp = 1;
  parallel::Engine<float> e(MPI_COMM_WORLD, mt_test::layout_tiny(), train::engine_options(tc, pc));
  e.init_parameters(5);
  train::Trainer t(e, tc, ds, nullptr);

  Recorder rec;
  g_recorder = &rec;
  prof::set_sink(&rec);
  prof::set_capture(capture_start, capture_stop);
  t.run();
  t.save_checkpoint(3);
  t.restore("latest");
  prof::set_sink(nullptr);
  prof::set_capture(nullptr, nullptr);
  REQUIRE(rec.depth() == 1);  // every range closed

  const Node& root = rec.root();
  const std::vector<std::string> top = top_names(root);
  const auto at = [&](const std::string& n) {
    return std::find(top.begin(), top.end(), n) - top.begin();
  };
  // Steps in order, the capture window around step 2 exactly.
  REQUIRE(at("step 1") < at("[capture start]"));
  REQUIRE(at("[capture start]") + 1 == at("step 2"));
  REQUIRE(at("step 2") + 1 == at("[capture stop]"));
  REQUIRE(at("[capture stop]") < at("step 3"));
  const Node& step1 = root.children[static_cast<std::size_t>(at("step 1"))];
  const int stage = e.context().mesh().coord().pp;
  // Forward and backward per block inside the pipeline's compute actions.
  const Node* fwd = find(step1, "pipeline forward(micro 0, chunk 0");
  REQUIRE(fwd);
  const Node* bwd = find(step1, "pipeline backward(micro 1, chunk 0");
  REQUIRE(bwd);
  const std::string first_block = stage == 0 ? "0" : "2";  // 4 blocks, 2 per stage
  REQUIRE(find(*fwd, "forward block " + first_block));
  REQUIRE(find(*bwd, "backward block " + first_block));
  if (stage == 1) REQUIRE(find(*fwd, "head and loss"));
  // Pipeline messages: the send's range holds the point-to-point issue with group and bytes, a
  // receive is posted in a range of its own and waited for in another.
  const std::string act_bytes = prof::bytes_label(2 * 16 * 32 * sizeof(float));
  if (stage == 0) {
    const Node* send = find(step1, "pipeline send_act(micro 0, chunk 0, peer 1)");
    REQUIRE(send);
    REQUIRE(find(*send, "send pp " + act_bytes));
    const Node* post = find(step1, "pipeline recv_grad(micro 0, chunk 0, peer 1)");
    REQUIRE(post);
    REQUIRE(find(*post, "recv pp " + act_bytes));
  } else {
    const Node* wait = find(step1, "pipeline wait recv_act(micro 0, chunk 0, peer 0)");
    REQUIRE(wait);
    REQUIRE(find(*wait, "wait recv pp"));
    REQUIRE(find(step1, "pipeline send_grad(micro 0, chunk 0, peer 0)"));
  }
  // The tied embedding's gradient over the first and last stage, and the optimizer.
  REQUIRE(find(step1, "all_reduce embedding "));
  REQUIRE(find(step1, "optimizer"));
  // Checkpoint phases.
  const Node* save = find(root, "checkpoint save");
  REQUIRE(save);
  REQUIRE(top_names(*save) == std::vector<std::string>{"checkpoint: state to host",
                                                       "checkpoint: write",
                                                       "checkpoint: commit"});
  REQUIRE(find(root, "checkpoint load"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (mt_test::world_rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("the data-parallel gradient all-reduce as a range with its group and bytes",
          "[profile][mpi]") {
  const int world = mt_test::world_size();
  if (world != 2) return;
  const std::string data = mt_test::layout_shard("test_profile_ranges_dp");
  io::TokenDataset ds(data, 16);
  train::TrainConfig tc = config("");
  tc.profile_first = tc.profile_last = -1;
  parallel::ParallelConfig pc;
  pc.shape.dp = 2;
  parallel::Engine<float> e(MPI_COMM_WORLD, mt_test::layout_tiny(), train::engine_options(tc, pc));
  e.init_parameters(5);
  train::Trainer t(e, tc, ds, nullptr);
  Recorder rec;
  prof::set_sink(&rec);
  t.step(0, true);
  prof::set_sink(nullptr);
  REQUIRE(rec.depth() == 1);
  const Node* ar = find(rec.root(), "all_reduce dp ");
  REQUIRE(ar);
  // One bucket holds every gradient of the tiny model: its bytes are the flat buffer's.
  const std::size_t bytes = e.model().registry().size() * sizeof(float);
  REQUIRE(ar->name == "all_reduce dp " + prof::bytes_label(bytes));
  REQUIRE(find(rec.root(), "wait all_reduce dp"));
  REQUIRE(find(rec.root(), "all_reduce world.host"));  // the loss and the stop flag
}
