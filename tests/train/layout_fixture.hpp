#pragma once
// Shared by the layout tests (test_layouts, test_resume): a tiny model whose heads and padded
// vocabulary every tp of 1, 2, 4 divides, and a learnable but noisy token shard per rank.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "harness.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/model/config.hpp"

namespace mt_test {

inline meshtrain::model::GptConfig layout_tiny() {
  meshtrain::model::GptConfig c;
  c.name = "tiny";
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 61;
  c.vocab_pad = 16;  // 64 rows: divisible by tp 1, 2, 4
  c.block_size = 16;
  return c;
}

// The Llama block of the same size: 4 query heads, 2 key-value heads (split at tp 2, replicated
// at tp 4 and 8), SwiGLU width 48, untied head.
inline meshtrain::model::GptConfig layout_tiny_llama() {
  meshtrain::model::GptConfig c = meshtrain::model::preset("llama-tiny");
  c.name = "tiny-llama";
  c.n_layer = 4;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.intermediate_size = 48;
  c.vocab_size = 61;
  c.vocab_pad = 16;
  c.block_size = 16;
  c.tied_head = false;
  return c;
}

// Writes <prefix>_<rank>/data_000000.bin (a noisy periodic text) and returns its glob.
inline std::string layout_shard(const std::string& prefix) {
  const std::string dir = prefix + "_" + std::to_string(world_rank());
  std::filesystem::create_directories(dir);
  std::vector<std::uint16_t> t;
  std::uint32_t s = 99;
  for (int i = 0; i < 8000; ++i) {
    s = s * 1664525u + 1013904223u;
    t.push_back(static_cast<std::uint16_t>(((i % 13) * 7 + ((s >> 20) % 3)) % 61));
  }
  meshtrain::io::write_shard(dir + "/data_000000.bin", t);
  return dir + "/data_*.bin";
}

}  // namespace mt_test
