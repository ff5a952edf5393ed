// Streaming HuggingFace import (io/hf_import.hpp through Engine::import_hf): a LlamaForCausalLM
// folder written from the fp64 fixture's parameters (sharded, with its index) and a GPT-2
// folder written by export_hf are read by every layout, each rank reading only its slices, and
// the gathered model equals the source tensor for tensor; config.json gives the fixture's block;
// a missing shard and a tensor of the wrong shape are errors naming the file and the tensor.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "harness.hpp"
#include "layout_fixture.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/io/safetensors.hpp"
#include "meshtrain/io/safetensors_sharded.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

std::string fixture() {
  const char* env = std::getenv("MESHTRAIN_SOURCE_DIR");
  return std::string(env ? env : MESHTRAIN_SOURCE_DIR) +
         "/tests/fixtures/llama_tiny_v1.safetensors";
}

// LlamaConfig of tests/reference/llama_reference.py's CFG (transformers 4 spelling).
const char* kLlamaConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 8, "intermediate_size": INTERMEDIATE, "vocab_size": 61,
  "max_position_embeddings": 16, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "rope_scaling": null, "tie_word_embeddings": false, "hidden_act": "silu",
  "attention_bias": false, "mlp_bias": false, "torch_dtype": "float32"})";

// Rank 0 writes the fixture's param.* tensors as a HF folder in shards of at most 4 KiB.
void write_llama_folder(const std::string& dir, int intermediate) {
  if (mt_test::world_rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    io::SafetensorsReader f(fixture());
    std::vector<io::ShardedSafetensorsWriter::Tensor> tensors;
    for (const auto& [n, info] : f.tensors())  // name order: the writer's shard order
      if (n.rfind("param.", 0) == 0) tensors.push_back({n.substr(6), "F32", info.shape});
    io::ShardedSafetensorsWriter w(dir, tensors, 4096);
    for (const auto& t : tensors) {
      const auto v = f.read_f32("param." + t.name);
      w.append(t.name, v.data(), v.size());
    }
    w.finish();
    std::string text = kLlamaConfig;
    text.replace(text.find("INTERMEDIATE"), 12, std::to_string(intermediate));
    std::ofstream(dir + "/config.json") << text;
  }
  MPI_Barrier(mt_test::world());
}

parallel::ParallelConfig layout(int dp, int pp, int tp, int zero) {
  parallel::ParallelConfig pc;
  pc.shape = mesh::Shape{dp, pp, tp};
  pc.dp.zero_stage = zero;
  return pc;
}

parallel::ParallelConfig dp_only() { return layout(mt_test::world_size(), 1, 1, 0); }

std::vector<parallel::ParallelConfig> layouts() {
  const int W = mt_test::world_size();
  if (W == 2) return {layout(1, 1, 2, 0), layout(1, 2, 1, 3), layout(2, 1, 1, 3)};
  if (W == 4) return {layout(1, 1, 4, 0), layout(1, 2, 2, 1), layout(2, 1, 2, 3)};
  return {layout(W, 1, 1, 0)};
}

train::TrainConfig train_config() {
  train::TrainConfig tc;
  tc.micro_batch = 2;
  tc.seq_len = 16;
  return tc;
}

// The gathered model's parameters (rank 0) against `expect(name)` (the HF tensor).
template <class F>
void check_import(const model::GptConfig& cfg, const std::string& dir, F expect) {
  for (const auto& pc : layouts()) {
    INFO(cfg.name << " imported under dp " << pc.shape.dp << " pp " << pc.shape.pp << " tp "
                  << pc.shape.tp << " ZeRO-" << pc.dp.zero_stage);
    const auto tc = train_config();
    parallel::Engine<float> e(mt_test::world(), cfg, train::engine_options(tc, pc));
    e.import_hf(dir);
    double worst = -1;
    e.with_whole_model([&](const auto& whole) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, whole.params());
      worst = 0;
      for (const auto& p : whole.registry().params()) {
        const std::vector<float> v = expect(p.name);
        for (std::size_t i = 0; i < p.numel; ++i) {
          const float want = i < v.size() ? v[i] : 0.0f;  // vocabulary padding rows are zero
          worst = std::max(worst, double(std::fabs(h(p.offset + i) - want)));
        }
      }
    });
    if (mt_test::world_rank() == 0) REQUIRE(worst == 0.0);
  }
}

}  // namespace

TEST_CASE("a sharded LlamaForCausalLM folder imports under every layout", "[io][hf][llama][mpi]") {
  const std::string dir = "test_hf_import_llama";
  write_llama_folder(dir, 48);
  if (mt_test::world_rank() == 0) REQUIRE(fs::exists(dir + "/model.safetensors.index.json"));
  const model::GptConfig cfg = io::read_hf_config(dir, 64);
  model::GptConfig want = model::preset("llama-tiny");
  want.n_layer = 2, want.n_head = 4, want.n_kv_head = 2, want.n_embd = 32, want.head_dim = 8;
  want.intermediate_size = 48, want.vocab_size = 61, want.vocab_pad = 64, want.block_size = 16;
  want.tied_head = false, want.norm_eps = 1e-5, want.rope = kernels::RopeConfig{};
  REQUIRE(cfg.key() == want.key());
  io::SafetensorsReader f(fixture());
  check_import(cfg, dir, [&](const std::string& n) { return f.read_f32("param." + n); });
}

TEST_CASE("a GPT-2 folder written by export_hf imports under every layout", "[io][hf][mpi]") {
  const std::string dir = "test_hf_import_gpt2";
  const model::GptConfig cfg = mt_test::layout_tiny();
  if (mt_test::world_rank() == 0) {
    model::Gpt m(cfg, 1, 16);
    m.init_parameters(3);
    io::export_hf(m, dir, "byte");
  }
  MPI_Barrier(mt_test::world());
  const model::GptConfig read = io::read_hf_config(dir, cfg.vocab_pad);
  io::SafetensorsReader f(dir + "/model.safetensors");
  check_import(read, dir, [&](const std::string& n) { return f.read_f32(n); });
}

TEST_CASE("HF import errors name the file and the tensor", "[io][hf][llama][mpi]") {
  const std::string dir = "test_hf_import_bad";
  // config.json says SwiGLU 40 wide, the weights are 48: the first MLP tensor is named.
  write_llama_folder(dir, 40);
  const model::GptConfig cfg = io::read_hf_config(dir, 64);
  const auto tc = train_config();
  {
    parallel::Engine<float> e(mt_test::world(), cfg, train::engine_options(tc, dp_only()));
    REQUIRE_THROWS_WITH(e.import_hf(dir),
                        mt_test::contains("model.layers.0.mlp.gate_proj.weight") &&
                            mt_test::contains(".safetensors"));
  }
  // A shard the index names but that is gone.
  write_llama_folder(dir, 48);
  if (mt_test::world_rank() == 0)
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().filename().string().rfind("model-00002-of-", 0) == 0) fs::remove(entry);
  MPI_Barrier(mt_test::world());
  parallel::Engine<float> e(mt_test::world(), io::read_hf_config(dir, 64),
                            train::engine_options(tc, dp_only()));
  REQUIRE_THROWS_WITH(e.import_hf(dir), mt_test::contains("model-00002-of-"));
}
