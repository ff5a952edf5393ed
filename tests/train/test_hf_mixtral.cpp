// HuggingFace MixtralForCausalLM interop (io/hf_mixtral.hpp, docs/moe.md "HuggingFace"):
// - a folder written here by hand with known values (the hub's block_sparse_moe names, and the
//   same values in transformers 5's fused form) imports under every layout into the right
//   registry slots: the router and each expert transposed, w1 / w3 into the gate / up halves of
//   w_in, expert j into expert j; an ep rank reads only its own experts (a folder without the
//   other rank's experts still imports on it);
// - an MoE model exported at ep 1 (and under ep 2 / tp 2 / pp 2 layouts) writes the hub's
//   names and shapes, bit for bit the transposed parameters; config.json reads back as the
//   model; importing it under ep 2, tp 2, pp 2 on 2-4 ranks gives bitwise the same parameters
//   and 3 training steps of the same losses as the single-rank model (1e-5);
// - rank 0's host memory during an export is bounded by two tensors (the export's count and
//   the Kokkos allocation tracker), not the model;
// - bad input is one error naming the file and the tensor (a missing expert, one the index
//   names but its shard lacks, a wrong shape) or the option (experts not divisible by ep,
//   num_experts_per_tok 1, what Mixtral cannot express on export).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "harness.hpp"
#include "meshtrain/core/alloc_tracker.hpp"
#include "layout_fixture.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/io/hf_import.hpp"
#include "meshtrain/io/hf_mixtral.hpp"
#include "meshtrain/io/safetensors_sharded.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

constexpr int kE = 4, kI = 12, kC = 32, kLayers = 2, kVocab = 61;

// The Mixtral shape of the tests: layout_tiny_llama's attention (4 heads, 2 kv heads, untied)
// with every block an MoE block of 4 SwiGLU experts 12 wide, top-2.
model::GptConfig tiny_mixtral() {
  model::GptConfig c = mt_test::layout_tiny_llama();
  c.name = "tiny-mixtral";
  c.n_layer = kLayers;
  c.intermediate_size = kI;
  c.moe.experts = kE;
  c.moe.top_k = 2;
  c.moe.layer_freq = 1;
  c.moe.ffn = kI;
  c.moe.aux_loss_coeff = 0.02;
  // The layouts below keep train.micro_batch = 1 and vary grad_accum with dp: the statistics
  // of each rank's micro-batch are the ones every layout shares (test_moe_layouts runs the
  // global scope at a fixed grad_accum).
  c.moe.aux_loss_scope = "local";
  c.norm_eps = 1e-5;
  c.rope = kernels::RopeConfig{};
  c.rope.theta = 1e6;
  return c;
}

const char* kMixtralConfig = R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
  "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 8, "intermediate_size": 12, "vocab_size": 61, "max_position_embeddings": 16,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "tie_word_embeddings": false,
  "hidden_act": "silu", "num_local_experts": EXPERTS, "num_experts_per_tok": TOPK,
  "router_aux_loss_coef": 0.02, "output_router_logits": false, "sliding_window": null,
  "torch_dtype": "float32"})";

// A distinct value per (tensor, element): which tensor lands where is visible in any element.
float known(const std::string& name, std::int64_t i) {
  std::uint32_t h = 2166136261u;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 16777619u;
  return static_cast<float>(h % 997) * 1e-3f + static_cast<float>(i) * 1e-6f;
}

std::string hub_expert(int l, int e, const char* w) {
  return "model.layers." + std::to_string(l) + ".block_sparse_moe.experts." + std::to_string(e) +
         "." + w + ".weight";
}
std::string hub_gate(int l) {
  return "model.layers." + std::to_string(l) + ".block_sparse_moe.gate.weight";
}

struct HfTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

// The hub-form tensors of tiny_mixtral() with known values: attention, norms, embedding, head
// under the registry's (= HF's) names, and the MoE tensors under block_sparse_moe.
std::vector<HfTensor> hub_tensors(const std::vector<std::string>& leave_out = {}) {
  const model::GptConfig cfg = tiny_mixtral();
  const model::ParameterRegistry whole(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  std::vector<HfTensor> out;
  auto add = [&](const std::string& n, std::vector<std::int64_t> shape) {
    for (const auto& skip : leave_out)
      if (skip == n) return;
    std::int64_t numel = 1;
    for (auto d : shape) numel *= d;
    HfTensor t{n, shape, std::vector<float>(static_cast<std::size_t>(numel))};
    for (std::int64_t i = 0; i < numel; ++i) t.values[static_cast<std::size_t>(i)] = known(n, i);
    out.push_back(std::move(t));
  };
  for (const auto& p : whole.params()) {
    if (p.name.find("mlp.") != std::string::npos) continue;  // the MoE tensors below
    std::vector<std::int64_t> s = p.global_shape;
    if (p.name == whole.embedding_name() || p.name == whole.head_weight_name()) s[0] = kVocab;
    add(p.name, s);
  }
  for (int l = 0; l < kLayers; ++l) {
    add(hub_gate(l), {kE, kC});
    for (int e = 0; e < kE; ++e) {
      add(hub_expert(l, e, "w1"), {kI, kC});
      add(hub_expert(l, e, "w3"), {kI, kC});
      add(hub_expert(l, e, "w2"), {kC, kI});
    }
  }
  return out;
}

// The same values in transformers 5's fused form: mlp.gate.weight, gate_up_proj [E, 2I, C]
// (expert e's w1 rows, then its w3 rows), down_proj [E, C, I].
std::vector<HfTensor> fused_tensors() {
  std::vector<HfTensor> hub = hub_tensors(), out;
  std::map<std::string, const HfTensor*> by;
  for (const auto& t : hub) by[t.name] = &t;
  for (const auto& t : hub)
    if (t.name.find("block_sparse_moe") == std::string::npos) out.push_back(t);
  for (int l = 0; l < kLayers; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".mlp.";
    out.push_back({b + "gate.weight", {kE, kC}, by[hub_gate(l)]->values});
    HfTensor gu{b + "experts.gate_up_proj", {kE, 2 * kI, kC}, {}};
    HfTensor down{b + "experts.down_proj", {kE, kC, kI}, {}};
    for (int e = 0; e < kE; ++e) {
      for (const char* w : {"w1", "w3"}) {
        const auto& v = by[hub_expert(l, e, w)]->values;
        gu.values.insert(gu.values.end(), v.begin(), v.end());
      }
      const auto& v = by[hub_expert(l, e, "w2")]->values;
      down.values.insert(down.values.end(), v.begin(), v.end());
    }
    out.push_back(std::move(gu));
    out.push_back(std::move(down));
  }
  return out;
}

// Rank 0 writes the tensors (shards of at most 4 KiB: an index) and config.json.
void write_folder(const std::string& dir, const std::vector<HfTensor>& tensors, int experts = kE,
                  int top_k = 2) {
  // Catch runs a test case once per section with no collective in between: no rank may still
  // read the previous section's folder when rank 0 replaces it.
  MPI_Barrier(mt_test::world());
  if (mt_test::world_rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::vector<io::ShardedSafetensorsWriter::Tensor> decl;
    for (const auto& t : tensors) decl.push_back({t.name, "F32", t.shape});
    io::ShardedSafetensorsWriter w(dir, decl, 4096);
    for (const auto& t : tensors) w.append(t.name, t.values.data(), t.values.size());
    w.finish();
    std::string text = kMixtralConfig;
    text.replace(text.find("EXPERTS"), 7, std::to_string(experts));
    text.replace(text.find("TOPK"), 4, std::to_string(top_k));
    std::ofstream(dir + "/config.json") << text;
  }
  MPI_Barrier(mt_test::world());
}

// What registry parameter `p` of tiny_mixtral() must hold after importing hub_tensors():
// written out element by element from the Mixtral layout, independently of io/hf_mixtral.cpp.
std::vector<float> expected(const model::ParameterRegistry& reg, const model::ParamInfo& p) {
  std::vector<float> v(p.numel, 0.0f);
  const std::string& n = p.name;
  const std::size_t blk = n.find(".mlp.");
  if (blk == std::string::npos) {  // the same name and layout; vocabulary padding rows zero
    std::int64_t real = p.global_numel();
    if (n == reg.embedding_name() || n == reg.head_weight_name()) real = kVocab * kC;
    for (std::int64_t i = 0; i < real; ++i) v[static_cast<std::size_t>(i)] = known(n, i);
    return v;
  }
  const int l = p.layer;
  if (n.find("mlp.router.weight") != std::string::npos) {  // [C, E] = gate^T
    for (int c = 0; c < kC; ++c)
      for (int e = 0; e < kE; ++e) v[std::size_t(c) * kE + e] = known(hub_gate(l), e * kC + c);
    return v;
  }
  const std::string rest = n.substr(n.find("mlp.experts.") + 12);
  const int e = std::stoi(rest.substr(0, rest.find('.')));
  if (rest.find("w_in") != std::string::npos) {  // [C, 2I]: [w1^T | w3^T] per row
    for (int c = 0; c < kC; ++c)
      for (int j = 0; j < kI; ++j) {
        v[std::size_t(c) * 2 * kI + j] = known(hub_expert(l, e, "w1"), j * kC + c);
        v[std::size_t(c) * 2 * kI + kI + j] = known(hub_expert(l, e, "w3"), j * kC + c);
      }
    return v;
  }
  for (int i = 0; i < kI; ++i)  // w_out [I, C] = w2^T
    for (int c = 0; c < kC; ++c) v[std::size_t(i) * kC + c] = known(hub_expert(l, e, "w2"), c * kI + i);
  return v;
}

struct Layout {
  int dp, ep, pp, tp, zero;
  std::string name() const {
    return cat("dp ", dp, " ep ", ep, " pp ", pp, " tp ", tp, " ZeRO-", zero);
  }
};

std::vector<Layout> layouts() {
  const int W = mt_test::world_size();
  if (W == 2) return {{2, 2, 1, 1, 0}, {2, 2, 1, 1, 1}, {1, 1, 1, 2, 0}, {1, 1, 2, 1, 0}};
  if (W == 4) return {{2, 2, 1, 2, 0}, {2, 2, 2, 1, 1}, {4, 4, 1, 1, 3}, {4, 2, 1, 1, 0}};
  return {{1, 1, 1, 1, 0}};
}

constexpr int kSeq = 16, kGlobal = 4, kSteps = 3;

train::TrainConfig train_config(int dp) {
  train::TrainConfig tc;
  tc.micro_batch = 1;
  tc.grad_accum = kGlobal / dp;
  tc.seq_len = kSeq;
  tc.steps = kSteps;
  tc.seed = 3;
  tc.eval_every = 0;
  tc.log_every = 0;
  tc.adamw.lr = 1e-3f;
  tc.adamw.warmup_steps = 1;
  tc.adamw.decay_steps = kSteps;
  return tc;
}

parallel::EngineOptions options(const Layout& l) {
  parallel::ParallelConfig pc;
  pc.shape = mesh::Shape{l.dp, l.pp, l.tp};
  pc.shape.ep = l.ep;
  pc.dp.zero_stage = l.zero;
  return train::engine_options(train_config(l.dp), pc);
}

using Tensors = std::map<std::string, std::vector<float>>;

Tensors gathered(parallel::Engine<float>& e) {
  Tensors out;
  e.with_whole_model([&](const auto& whole) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, whole.params());
    for (const auto& p : whole.registry().params())
      out[p.name].assign(h.data() + p.offset, h.data() + p.offset + p.numel);
  });
  return out;
}

std::size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], 4) != 0;
  return bad;
}

// Imported under each layout: rank 0's gathered model equals `want` bit for bit.
void check_slots(const std::string& dir) {
  const model::GptConfig cfg = io::read_hf_config(dir, 16);
  const model::ParameterRegistry whole(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  for (const auto& l : layouts()) {
    INFO(dir << " imported under " << l.name());
    parallel::Engine<float> e(mt_test::world(), cfg, options(l));
    e.import_hf(dir);
    const Tensors got = gathered(e);
    if (mt_test::world_rank() != 0) continue;
    std::size_t bad = 0;
    std::string first;
    for (const auto& p : whole.params()) {
      const std::size_t d = differing(got.at(p.name), expected(whole, p));
      if (d && first.empty()) first = p.name;
      bad += d;
    }
    INFO("first differing tensor " << first);
    CHECK(bad == 0);
  }
}

std::vector<float> losses(parallel::Engine<float>& e, const Layout& l, const std::string& data) {
  io::TokenDataset ds(data, kSeq);
  train::Trainer tr(e, train_config(l.dp), ds, nullptr);
  std::vector<float> out;
  for (int s = 0; s < kSteps; ++s) out.push_back(tr.step(s, true).loss);
  return out;
}

}  // namespace

TEST_CASE("a hand-built Mixtral folder lands in the right registry slots", "[io][hf][moe][mpi]") {
  const std::string hub = "test_hf_mixtral_hub", fused = "test_hf_mixtral_fused";
  write_folder(hub, hub_tensors());
  write_folder(fused, fused_tensors());
  const model::GptConfig cfg = io::read_hf_config(hub, 16);
  model::GptConfig want = tiny_mixtral();
  want.name = cfg.name;
  // config.json says nothing of meshtrain's statistics scope: an import takes the default.
  CHECK(cfg.moe.aux_loss_scope == "global");
  want.moe.aux_loss_scope = cfg.moe.aux_loss_scope;
  REQUIRE(cfg.key() == want.key());
  REQUIRE(io::hf_architecture(cfg) == "MixtralForCausalLM");
  check_slots(hub);
  check_slots(fused);
}

TEST_CASE("an ep rank reads only its own experts", "[io][hf][moe][mpi]") {
  // Experts 2 and 3 of block 1 are not in the folder: ep rank 0 of 2 (experts 0, 1) imports it,
  // ep rank 1 fails naming the first missing one.
  const std::string dir = "test_hf_mixtral_half";
  std::vector<std::string> gone;
  for (int e = 2; e < kE; ++e)
    for (const char* w : {"w1", "w3", "w2"}) gone.push_back(hub_expert(1, e, w));
  write_folder(dir, hub_tensors(gone));
  const model::GptConfig cfg = io::read_hf_config(dir, 16);
  for (int r = 0; r < 2; ++r) {
    const model::ParameterRegistry reg(cfg, 0, 1, 0, 0, cfg.n_layer, true, true, r, 2);
    View1<float> buf("buf", reg.size());
    if (r == 0) {
      REQUIRE_NOTHROW(io::import_hf_slices(reg, dir, buf));
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, buf);
      std::size_t bad = 0;
      for (const auto& p : reg.params())
        bad += differing(std::vector<float>(h.data() + p.offset, h.data() + p.offset + p.numel),
                         expected(reg, p));
      CHECK(bad == 0);
    } else {
      REQUIRE_THROWS_AS(io::import_hf_slices(reg, dir, buf), ConfigError);
      REQUIRE_THROWS_WITH(io::import_hf_slices(reg, dir, buf),
                          mt_test::contains(dir) && mt_test::contains(hub_expert(1, 2, "w1")));
    }
  }
}

TEST_CASE("an exported Mixtral imports under ep, tp and pp layouts to the same model and losses",
          "[io][hf][moe][mpi]") {
  model::GptConfig cfg = tiny_mixtral();
  const std::string data = mt_test::layout_shard("test_hf_mixtral_data");
  // The reference: exported at ep 1 on one rank... every rank writes its own folder from the
  // same init (MPI_COMM_SELF), then reads it back on one rank: parameters, config, losses.
  const std::string dir = "test_hf_mixtral_export_" + std::to_string(mt_test::world_rank());
  const Layout single{1, 1, 1, 1, 0};
  Tensors ref_params;
  std::vector<float> ref_loss;
  {
    parallel::Engine<float> e(MPI_COMM_SELF, cfg, options(single));
    e.init_parameters(17);
    ref_params = gathered(e);
    io::HfExportOptions opt;
    opt.max_shard_bytes = 8192;
    e.export_hf(dir, opt);
  }
  // The folder: the hub's names and shapes, each MoE tensor the transpose of its slot.
  {
    io::ShardedSafetensorsReader r(dir);
    const model::ParameterRegistry whole(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
    std::size_t tensors = 0, bad = 0;
    for (const auto& p : whole.params())
      for (const io::HfPart& h : io::hf_parts(whole, p)) {
        INFO(h.name);
        REQUIRE(r.has(h.name));
        REQUIRE(r.info(h.name).shape == h.shape);
        const std::vector<float> v = r.read_rows_f32(h.name, 0, h.shape[0]);
        const std::vector<float>& w = ref_params.at(p.name);
        const std::int64_t R = p.global_shape[0], C = p.global_shape.size() == 2 ? p.global_shape[1] : 1;
        for (std::size_t i = 0; i < v.size(); ++i) {
          const float x = h.transpose ? w[(i % R) * C + h.col0 + i / R] : w[i];
          bad += std::memcmp(&v[i], &x, 4) != 0;
        }
        ++tensors;
      }
    CHECK(bad == 0);
    CHECK(r.names().size() == tensors);
    CHECK(r.has(hub_expert(1, kE - 1, "w2")));
    CHECK(r.has(hub_gate(0)));
  }
  const model::GptConfig back = io::read_hf_config(dir, cfg.vocab_pad);
  model::GptConfig same = cfg;
  same.name = back.name;
  CHECK(back.moe.aux_loss_scope == "global");  // not in config.json: the default
  same.moe.aux_loss_scope = back.moe.aux_loss_scope;
  REQUIRE(back.key() == same.key());
  const Json j = json::parse(
      [&] {
        std::ifstream in(dir + "/config.json");
        return std::string(std::istreambuf_iterator<char>(in), {});
      }(),
      dir);
  CHECK(j["architectures"][0] == "MixtralForCausalLM");
  CHECK(j["num_local_experts"] == kE);
  CHECK(j["num_experts_per_tok"] == 2);
  CHECK(j["intermediate_size"] == kI);
  CHECK(j["output_router_logits"] == false);
  CHECK(j["sliding_window"].is_null());
  // Training from the folder: the router in fp64 (a training option, not in the folder), so
  // that top-k choices are a function of the router input, not of its GEMM's rounding; and the
  // statistics scope these layouts share (another training option, see tiny_mixtral).
  model::GptConfig run = back;
  run.moe.router_fp64 = true;
  run.moe.aux_loss_scope = cfg.moe.aux_loss_scope;
  {
    parallel::Engine<float> e(MPI_COMM_SELF, run, options(single));
    e.import_hf(dir);
    REQUIRE(gathered(e) == ref_params);
    ref_loss = losses(e, single, data);
  }
  MPI_Barrier(mt_test::world());
  const std::string shared = "test_hf_mixtral_export_0";
  for (const auto& l : layouts()) {
    INFO("imported under " << l.name());
    parallel::Engine<float> e(mt_test::world(), run, options(l));
    e.import_hf(shared);
    const Tensors got = gathered(e);
    if (mt_test::world_rank() == 0) CHECK(got == ref_params);
    const std::vector<float> loss = losses(e, l, data);
    double worst = 0;
    for (int s = 0; s < kSteps; ++s)
      worst = std::max(worst, std::fabs(double(loss[s]) - ref_loss[s]) / std::fabs(ref_loss[s]));
    INFO("worst relative loss " << worst);
    REQUIRE(mt_test::all_ranks(worst <= 1e-5));
  }
  // Exported again from a distributed layout: the same bytes as the single-rank folder.
  for (const auto& l : layouts()) {
    INFO("exported under " << l.name());
    const std::string again = "test_hf_mixtral_again";
    {
      parallel::Engine<float> e(mt_test::world(), cfg, options(l));
      e.import_hf(shared);
      io::HfExportOptions opt;
      opt.max_shard_bytes = 8192;
      e.export_hf(again, opt);
    }
    if (mt_test::world_rank() == 0) {
      io::ShardedSafetensorsReader a(again), b(shared);
      REQUIRE(a.names() == b.names());
      std::size_t bad = 0;
      for (const auto& n : a.names())
        bad += differing(a.read_rows_f32(n, 0, a.info(n).shape[0]),
                         b.read_rows_f32(n, 0, b.info(n).shape[0]));
      CHECK(bad == 0);
    }
    MPI_Barrier(mt_test::world());
  }
}

TEST_CASE("bad Mixtral folders name the file and the tensor or the option", "[io][hf][moe][mpi]") {
  const Layout one{mt_test::world_size(), 1, 1, 1, 0};
  const std::string dir = "test_hf_mixtral_bad";
  SECTION("an expert missing from the folder") {
    write_folder(dir, hub_tensors({hub_expert(1, 3, "w3")}));
    parallel::Engine<float> e(mt_test::world(), io::read_hf_config(dir, 16), options(one));
    REQUIRE_THROWS_WITH(e.import_hf(dir), mt_test::contains(dir) &&
                                              mt_test::contains(hub_expert(1, 3, "w3")) &&
                                              mt_test::contains("gate_up_proj"));
  }
  SECTION("an expert the index names in a shard that does not hold it") {
    write_folder(dir, hub_tensors());
    if (mt_test::world_rank() == 0) {
      const std::string idx = dir + "/model.safetensors.index.json";
      std::ifstream in(idx);
      Json j = json::parse(std::string(std::istreambuf_iterator<char>(in), {}), idx);
      in.close();
      const std::string other = j["weight_map"][hub_gate(0)].get<std::string>();
      REQUIRE(other != j["weight_map"][hub_expert(0, 1, "w2")].get<std::string>());
      j["weight_map"][hub_expert(0, 1, "w2")] = other;
      std::ofstream(idx) << json::dump(j, {2, 0});
    }
    MPI_Barrier(mt_test::world());
    REQUIRE_THROWS_WITH(
        [&] {
          parallel::Engine<float> e(mt_test::world(), io::read_hf_config(dir, 16), options(one));
          e.import_hf(dir);
        }(),
        mt_test::contains(hub_expert(0, 1, "w2")) && mt_test::contains(".safetensors"));
  }
  SECTION("an expert of the wrong shape") {
    std::vector<HfTensor> t = hub_tensors();
    for (auto& x : t)
      if (x.name == hub_expert(0, 2, "w2")) x.shape = {kI, kC};  // transposed: [I, C], not [C, I]
    write_folder(dir, t);
    parallel::Engine<float> e(mt_test::world(), io::read_hf_config(dir, 16), options(one));
    REQUIRE_THROWS_WITH(e.import_hf(dir), mt_test::contains(hub_expert(0, 2, "w2")) &&
                                              mt_test::contains(".safetensors") &&
                                              mt_test::contains("[32, 12]"));
  }
  SECTION("num_local_experts not divisible by mesh.ep") {
    if (mt_test::world_size() >= 2) {
      write_folder(dir, hub_tensors(), 3);
      const Layout ep2{mt_test::world_size(), 2, 1, 1, 0};
      REQUIRE_THROWS_WITH(
          parallel::Engine<float>(mt_test::world(), io::read_hf_config(dir, 16), options(ep2)),
          mt_test::contains("moe.experts=3 is not divisible by mesh.ep=2"));
    }
  }
  SECTION("num_experts_per_tok 1") {
    write_folder(dir, hub_tensors(), kE, 1);
    REQUIRE_THROWS_WITH(io::read_hf_config(dir, 16),
                        mt_test::contains(dir + "/config.json") &&
                            mt_test::contains("num_experts_per_tok=1"));
  }
  SECTION("what Mixtral cannot express is refused on export, naming the option") {
    auto refused = [&](auto change, const char* option) {
      model::GptConfig c = tiny_mixtral();
      change(c);
      INFO(option);
      REQUIRE_THROWS_AS(io::HfFolderWriter(c, dir + "_out", {}), ConfigError);
      REQUIRE_THROWS_WITH(io::HfFolderWriter(c, dir + "_out", {}),
                          mt_test::contains(option) && mt_test::contains(dir + "_out"));
    };
    refused([](model::GptConfig& c) { c.moe.capacity_factor = 1.25; }, "moe.capacity_factor");
    refused([](model::GptConfig& c) { c.moe.shared_ffn = 8; }, "moe.shared_expert_size");
    refused([](model::GptConfig& c) { c.moe.layer_freq = 2; }, "moe.layer_freq");
    refused([](model::GptConfig& c) { c.moe.router_score = "sigmoid"; }, "moe.router_score");
    refused([](model::GptConfig& c) { c.moe.top_k = 1; }, "moe.top_k");
    refused([](model::GptConfig& c) { c.qkv_bias = true; }, "model.qkv_bias");
    refused(
        [](model::GptConfig& c) {
          model::GptConfig g = mt_test::layout_tiny();
          g.moe = c.moe;
          c = g;
        },
        "model.family=gpt2");
  }
}

TEST_CASE("rank 0 holds one tensor of an exported Mixtral at a time", "[io][hf][moe][mpi]") {
  // The tensor being assembled plus one staged piece or one transposed MoE part (never both:
  // the staging is given back before the writer transposes).
  model::GptConfig cfg = tiny_mixtral();
  cfg.n_layer = 4;
  const model::ParameterRegistry whole(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  std::size_t largest = 0;
  for (const auto& p : whole.params()) largest = std::max(largest, p.numel * sizeof(float));
  const std::size_t model_bytes = whole.size() * sizeof(float);
  REQUIRE(model_bytes > 8 * largest);
  for (const auto& l : layouts()) {
    INFO(l.name());
    parallel::Engine<float> e(mt_test::world(), cfg, options(l));
    e.init_parameters(2);
    AllocTracker tracker;
    const std::size_t before = tracker.live();
    const io::HfExportStats s = e.export_hf("test_hf_mixtral_bound", {});
    const std::size_t grew = tracker.peak() - before;
    if (mt_test::world_rank() == 0) {
      CHECK(s.tensors == whole.params().size());
      CHECK(s.largest_buffer_bytes <= largest);
      CHECK(s.peak_buffer_bytes <= 2 * largest);
      CHECK(grew <= 2 * largest);
      CHECK(grew < model_bytes / 4);
    }
  }
}
