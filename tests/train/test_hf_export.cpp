// Streaming HuggingFace export (Engine::export_hf, io/hf_export.hpp): under every layout of
// 1-4 ranks (tp 2 and 4 with the kv heads split and replicated, pp 2, ZeRO-1 and ZeRO-3) the
// folder a Llama (untied with grouped-query attention, and tied) or GPT-2 model exports holds,
// bit for bit, the parameters of the same model gathered on one rank (HF's names, shapes
// without the vocabulary padding, no lm_head when tied), its config.json reads back as the
// model, and the folder imports under another layout to the same parameters again. The host
// memory rank 0 allocates during the export is bounded by one tensor, not the model: the
// export's own count and the Kokkos allocation tracker both say so.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "harness.hpp"
#include "layout_fixture.hpp"
#include "meshtrain/core/alloc_tracker.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/io/hf_export.hpp"
#include "meshtrain/io/safetensors_sharded.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

parallel::ParallelConfig layout(int dp, int pp, int tp, int zero) {
  parallel::ParallelConfig pc;
  pc.shape = mesh::Shape{dp, pp, tp};
  pc.dp.zero_stage = zero;
  return pc;
}

std::vector<parallel::ParallelConfig> layouts() {
  const int W = mt_test::world_size();
  if (W == 2) return {layout(1, 1, 2, 0), layout(1, 2, 1, 1), layout(2, 1, 1, 3)};
  if (W == 4)
    return {layout(1, 1, 4, 0), layout(1, 2, 2, 1), layout(2, 1, 2, 3), layout(2, 2, 1, 3)};
  return {layout(W, 1, 1, 0), layout(W, 1, 1, 3)};
}

std::string describe(const parallel::ParallelConfig& pc) {
  return "dp " + std::to_string(pc.shape.dp) + " pp " + std::to_string(pc.shape.pp) + " tp " +
         std::to_string(pc.shape.tp) + " ZeRO-" + std::to_string(pc.dp.zero_stage);
}

parallel::EngineOptions options(const parallel::ParallelConfig& pc) {
  train::TrainConfig tc;
  tc.micro_batch = 2;
  tc.seq_len = 16;
  return train::engine_options(tc, pc);
}

using Tensors = std::map<std::string, std::vector<float>>;

// The whole model's parameters by name (world rank 0; empty elsewhere), padding rows included.
template <class T>
Tensors gathered(parallel::Engine<T>& e) {
  Tensors out;
  e.with_whole_model([&](const auto& whole) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, whole.params());
    // Element by element: a 16-bit model's values convert to float explicitly.
    for (const auto& p : whole.registry().params()) {
      auto& v = out[p.name];
      v.resize(p.numel);
      for (std::size_t i = 0; i < p.numel; ++i) v[i] = static_cast<float>(h(p.offset + i));
    }
  });
  return out;
}

// The reference: the model initialised from `seed` on a data-parallel layout, gathered.
Tensors reference(const model::GptConfig& cfg, std::uint64_t seed) {
  parallel::Engine<float> e(mt_test::world(), cfg, options(layout(mt_test::world_size(), 1, 1, 0)));
  e.init_parameters(seed);
  return gathered(e);
}

std::uint16_t bf16_bits(float f) {  // round to nearest even (no NaNs here)
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<std::uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}
float bf16_round(float f) {
  const std::uint32_t b = std::uint32_t(bf16_bits(f)) << 16;
  float out;
  std::memcpy(&out, &b, 4);
  return out;
}

// Rank 0: the folder holds exactly `want`'s tensors (HF rows: the real vocabulary), bit for bit
// (after bf16 rounding for a BF16 folder). Returns the number of differing elements.
std::size_t compare_folder(const std::string& dir, const model::GptConfig& cfg, const Tensors& want,
                           bool bf16) {
  io::ShardedSafetensorsReader r(dir);
  const model::ParameterRegistry whole(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  REQUIRE(r.names().size() == whole.params().size());
  std::size_t bad = 0;
  for (const auto& p : whole.params()) {
    INFO(p.name);
    REQUIRE(r.has(p.name));
    const auto& shape = r.info(p.name).shape;
    std::vector<std::int64_t> hf = p.global_shape;
    if (p.name == whole.embedding_name() || p.name == whole.head_weight_name())
      hf[0] = cfg.vocab_size;
    REQUIRE(shape == hf);
    REQUIRE(r.info(p.name).dtype == (bf16 ? "BF16" : "F32"));
    const std::vector<float> v = r.read_rows_f32(p.name, 0, shape[0]);
    const std::vector<float>& w = want.at(p.name);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const float x = bf16 ? bf16_round(w[i]) : w[i];
      if (std::memcmp(&v[i], &x, 4) != 0) ++bad;
    }
  }
  return bad;
}

std::size_t compare(const Tensors& got, const Tensors& want, const model::GptConfig& cfg) {
  std::size_t bad = 0;
  const model::ParameterRegistry whole(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  for (const auto& p : whole.params()) {
    const auto& g = got.at(p.name);
    const auto& w = want.at(p.name);
    std::size_t n = static_cast<std::size_t>(p.global_numel());
    if (p.name == whole.embedding_name() || p.name == whole.head_weight_name())
      n = static_cast<std::size_t>(cfg.vocab_size) * static_cast<std::size_t>(p.global_shape[1]);
    for (std::size_t i = 0; i < n; ++i)
      if (std::memcmp(&g[i], &w[i], 4) != 0) ++bad;
  }
  return bad;
}

// Exports under every layout, checks each folder, imports each under the next layout.
void round_trip(const model::GptConfig& cfg, const std::string& name) {
  const Tensors want = reference(cfg, 11);
  const auto ls = layouts();
  io::HfExportOptions opt;
  opt.max_shard_bytes = 8192;  // several shards and their index
  for (std::size_t i = 0; i < ls.size(); ++i) {
    INFO(name << " exported under " << describe(ls[i]));
    const std::string dir = "test_hf_export_" + name + "_" + std::to_string(i);
    {
      parallel::Engine<float> e(mt_test::world(), cfg, options(ls[i]));
      e.init_parameters(11);
      e.export_hf(dir, opt);
    }
    if (mt_test::world_rank() == 0) {
      REQUIRE(fs::exists(dir + "/model.safetensors.index.json"));
      REQUIRE(fs::exists(dir + "/generation_config.json"));
      CHECK(compare_folder(dir, cfg, want, false) == 0);
      io::ShardedSafetensorsReader r(dir);
      CHECK(r.has("lm_head.weight") == (!cfg.is_gpt2() && !cfg.tied_head));
    }
    const model::GptConfig back = io::read_hf_config(dir, cfg.vocab_pad);
    CHECK(back.key() == cfg.key());
    const auto& next = ls[(i + 1) % ls.size()];
    INFO("imported under " << describe(next));
    parallel::Engine<float> e(mt_test::world(), back, options(next));
    e.import_hf(dir);
    const Tensors got = gathered(e);
    if (mt_test::world_rank() == 0) CHECK(compare(got, want, cfg) == 0);
  }
}

model::GptConfig tied_llama() {
  model::GptConfig c = mt_test::layout_tiny_llama();
  c.tied_head = true;
  return c;
}

}  // namespace

TEST_CASE("a Llama with grouped-query attention and an untied head exports under every layout",
          "[io][hf][llama][mpi]") {
  round_trip(mt_test::layout_tiny_llama(), "llama");
}

TEST_CASE("a tied Llama exports under every layout", "[io][hf][llama][mpi]") {
  round_trip(tied_llama(), "llama_tied");
}

TEST_CASE("GPT-2 exports under every layout", "[io][hf][mpi]") {
  round_trip(mt_test::layout_tiny(), "gpt2");
}

// Rank 0 writes a folder of normal random tensors for `cfg` (HF shapes); returns them (padded
// to the registry's shapes with zero rows) on every rank.
Tensors random_folder(const model::GptConfig& cfg, const std::string& dir) {
  const model::ParameterRegistry whole(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  Tensors t;
  std::uint32_t s = 12345;
  for (const auto& p : whole.params()) {
    std::vector<float> v(p.numel, 0.0f);
    std::size_t real = p.numel;
    if (p.name == whole.embedding_name() || p.name == whole.head_weight_name())
      real = static_cast<std::size_t>(cfg.vocab_size) * static_cast<std::size_t>(p.global_shape[1]);
    for (std::size_t i = 0; i < real; ++i) {
      s = s * 1664525u + 1013904223u;
      v[i] = (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 0.2f;
    }
    t[p.name] = std::move(v);
  }
  if (mt_test::world_rank() == 0) {
    fs::remove_all(dir);
    io::HfExportOptions opt;
    opt.max_shard_bytes = 8192;
    io::HfFolderWriter w(cfg, dir, opt);
    for (const auto& p : w.registry().params()) w.append(p, t.at(p.name).data());
    w.finish();
  }
  MPI_Barrier(mt_test::world());
  return t;
}

std::string config_text(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST_CASE("Qwen2 and Mistral folders import and export unchanged under every layout",
          "[io][hf][llama][mpi]") {
  model::GptConfig qwen2 = mt_test::layout_tiny_llama();
  qwen2.qkv_bias = true;
  model::GptConfig mistral = mt_test::layout_tiny_llama();
  mistral.hf_model_type = "mistral";
  mistral.sliding_window = 16;  // = the sequence length: the full causal context
  for (const auto& [cfg, type] : {std::pair{qwen2, std::string("qwen2")},
                                  std::pair{mistral, std::string("mistral")}}) {
    const std::string src = "test_hf_export_src_" + type;
    const Tensors want = random_folder(cfg, src);
    const model::GptConfig read = io::read_hf_config(src, cfg.vocab_pad);
    CHECK(read.key() == cfg.key());
    CHECK(read.hf_model_type == type);
    const auto ls = layouts();
    for (std::size_t i = 0; i < ls.size(); ++i) {
      INFO(type << " imported and exported under " << describe(ls[i]));
      const std::string dir = "test_hf_export_" + type + "_" + std::to_string(i);
      {
        parallel::Engine<float> e(mt_test::world(), read, options(ls[i]));
        e.import_hf(src);
        e.export_hf(dir, {});
      }
      if (mt_test::world_rank() == 0) {
        CHECK(compare_folder(dir, cfg, want, false) == 0);
        const std::string text = config_text(dir);
        CHECK(text.find("\"model_type\": \"" + type + "\"") != std::string::npos);
        io::ShardedSafetensorsReader r(dir);
        CHECK(r.has("model.layers.0.self_attn.k_proj.bias") == (type == "qwen2"));
      }
    }
  }
}

TEST_CASE("a BF16 export rounds each parameter to nearest even", "[io][hf][llama][mpi]") {
  const model::GptConfig cfg = mt_test::layout_tiny_llama();
  const int W = mt_test::world_size();
  const auto pc = W == 1 ? layout(1, 1, 1, 3) : layout(W / 2, 1, 2, 3);
  const Tensors want = reference(cfg, 5);
  parallel::Engine<float> e(mt_test::world(), cfg, options(pc));
  e.init_parameters(5);
  io::HfExportOptions opt;
  opt.dtype = "BF16";
  e.export_hf("test_hf_export_bf16", opt);
  if (mt_test::world_rank() == 0) {
    CHECK(compare_folder("test_hf_export_bf16", cfg, want, true) == 0);
    // One shard at the default size: model.safetensors without an index.
    CHECK(fs::exists("test_hf_export_bf16/model.safetensors"));
    CHECK(!fs::exists("test_hf_export_bf16/model.safetensors.index.json"));
    std::ifstream in("test_hf_export_bf16/config.json");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const Json j = json::parse(text, "config.json");
    CHECK(j.at("torch_dtype") == "bfloat16");
    CHECK(j.at("architectures")[0] == "LlamaForCausalLM");
    CHECK(j.at("num_key_value_heads") == 2);
    CHECK(j.at("head_dim") == 8);
    CHECK(j.at("tie_word_embeddings") == false);
  }
}

#if MESHTRAIN_HAVE_BF16
// 16-bit runs stage their pieces through a conversion on the device.
TEST_CASE("a bf16 run exports the parameters it computes with", "[io][hf][llama][mpi]") {
  const model::GptConfig cfg = mt_test::layout_tiny_llama();
  const int W = mt_test::world_size();
  const auto pc = W == 1 ? layout(1, 1, 1, 0) : layout(W / 2, 1, 2, 3);
  parallel::Engine<meshtrain::bf16> e(mt_test::world(), cfg, options(pc));
  e.init_parameters(5);
  const Tensors want = gathered(e);  // the bf16 parameters as floats
  e.export_hf("test_hf_export_bf16_run", {});
  if (mt_test::world_rank() == 0) CHECK(compare_folder("test_hf_export_bf16_run", cfg, want, false) == 0);
}
#endif

TEST_CASE("rank 0 holds one tensor of the exported model at a time", "[io][hf][llama][mpi]") {
  const model::GptConfig cfg = mt_test::layout_tiny_llama();
  const model::ParameterRegistry whole(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  std::size_t largest = 0;
  for (const auto& p : whole.params()) largest = std::max(largest, p.numel * sizeof(float));
  const std::size_t model_bytes = whole.size() * sizeof(float);
  // The bound means something only when the model is many tensors large.
  REQUIRE(model_bytes > 8 * largest);
  const int W = mt_test::world_size();
  for (const auto& pc : {layout(W, 1, 1, 0), layouts().back()}) {
    INFO(describe(pc));
    parallel::Engine<float> e(mt_test::world(), cfg, options(pc));
    e.init_parameters(2);
    AllocTracker tracker;
    const std::size_t before = tracker.live();
    const io::HfExportStats s = e.export_hf("test_hf_export_bound", {});
    const std::size_t grew = tracker.peak() - before;
    if (mt_test::world_rank() == 0) {
      CHECK(s.tensors == whole.params().size());
      // The export's own count: no host buffer larger than the largest tensor, at most a
      // tensor and the staging of one piece alive together.
      CHECK(s.largest_buffer_bytes <= largest);
      CHECK(s.peak_buffer_bytes <= 2 * largest);
      // Every Kokkos allocation of the export (host and device) on rank 0, measured.
      CHECK(grew <= 2 * largest);
      CHECK(grew < model_bytes / 4);
    }
  }
}

TEST_CASE("an export into a folder that cannot be written fails on every rank",
          "[io][hf][mpi]") {
  const model::GptConfig cfg = mt_test::layout_tiny_llama();
  if (mt_test::world_rank() == 0) {
    std::ofstream("test_hf_export_file") << "a file where the folder should be";
  }
  MPI_Barrier(mt_test::world());
  parallel::Engine<float> e(mt_test::world(), cfg,
                            options(layout(mt_test::world_size(), 1, 1, 0)));
  e.init_parameters(1);
  REQUIRE_THROWS_WITH(e.export_hf("test_hf_export_file/model", {}),
                      mt_test::contains("test_hf_export_file/model"));
}
