// model::forward_hooks / backward_hooks state the order in which GptT calls its layer hooks; the
// planner replays the data-parallel policy over them instead of running the model. Here the real
// model's calls are recorded for a single rank and for pipeline stages holding several chunks
// (with and without the embedding and the head) and must equal the stated order exactly.
#include <vector>

#include "harness.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/model/hook_order.hpp"

using namespace meshtrain;
using namespace meshtrain::model;

namespace {

GptConfig tiny() {
  GptConfig c;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 16;
  c.vocab_size = 40;
  c.vocab_pad = 16;
  c.block_size = 8;
  return c;
}

struct Recorder : LayerHooks {
  std::vector<HookCall> calls;
  void before_forward(int u) override { calls.push_back({HookEvent::before_forward, u}); }
  void before_backward(int u) override { calls.push_back({HookEvent::before_backward, u}); }
  void after_backward(int u) override { calls.push_back({HookEvent::after_backward, u}); }
};

const char* name(HookEvent e) {
  return e == HookEvent::before_forward ? "before_forward"
         : e == HookEvent::before_backward ? "before_backward" : "after_backward";
}

void require_equal(const std::vector<HookCall>& got, const std::vector<HookCall>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("call " << i << ": got " << name(got[i].event) << "(" << got[i].unit << "), stated "
                 << name(want[i].event) << "(" << want[i].unit << ")");
    REQUIRE(got[i] == want[i]);
  }
}

// Forward and backward of every chunk of `layout`, each checked against the stated order.
void check(const ModelLayout& layout) {
  const auto cfg = tiny();
  const int B = 2, T = 8;
  Gpt m(cfg, B, T, layout);
  m.init_parameters(1);
  Recorder rec;
  m.set_hooks(&rec);
  const std::vector<LayerRange> chunks =
      layout.chunks.empty() ? std::vector<LayerRange>{{0, cfg.n_layer}} : layout.chunks;
  View1<std::int32_t> tokens = zeros<std::int32_t>("tokens", B * T);
  View1<std::int32_t> targets = zeros<std::int32_t>("targets", B * T);
  View1<float> act = zeros<float>("act", m.activation_elems());
  Kokkos::deep_copy(act, 0.01f);
  for (int c = 0; c < m.n_chunks(); ++c) {
    INFO("chunk " << c << " forward");
    rec.calls.clear();
    m.forward(c, 0, tokens, act, targets, 1.0f);
    require_equal(rec.calls, forward_hooks(m.registry(), chunks, c));
  }
  for (int c = m.n_chunks() - 1; c >= 0; --c) {
    INFO("chunk " << c << " backward");
    rec.calls.clear();
    m.backward(c, 0, act);
    require_equal(rec.calls, backward_hooks(m.registry(), chunks, c));
  }
  m.set_hooks(nullptr);
}

}  // namespace

TEST_CASE("hook order: the single-rank model", "[model][hooks]") {
  check(ModelLayout{});
  ModelLayout r;
  r.recompute = true;  // recomputing a block in backward calls no forward hook
  check(r);
}

TEST_CASE("hook order: pipeline stages with several chunks", "[model][hooks]") {
  ModelLayout first;  // the first stage of an interleaved pipeline: embedding, no head
  first.chunks = {LayerRange{0, 1}, LayerRange{2, 3}};
  first.has_embedding = true;
  first.has_head = false;
  check(first);
  ModelLayout last;  // the last stage: the head and its tied wte copy, no embedding
  last.chunks = {LayerRange{1, 2}, LayerRange{3, 4}};
  last.has_embedding = false;
  last.has_head = true;
  check(last);
  ModelLayout middle;
  middle.chunks = {LayerRange{1, 3}};
  middle.has_embedding = false;
  middle.has_head = false;
  check(middle);
}
