#pragma once
// A tiny GPT and synthetic layouts for the checkpoint tests: which registry a rank holds under
// (dp, pp, tp) with the default order tp-dp-pp, and a value for every element that depends on
// (group, tensor, global index) only, so any layout can check what it reads.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/io/checkpoint.hpp"
#include "meshtrain/model/registry.hpp"

namespace ckpt_test {

using meshtrain::model::GptConfig;
using meshtrain::model::ParameterRegistry;

inline GptConfig tiny_config() {
  GptConfig c;
  c.name = "ckpt-tiny";
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 50;
  c.vocab_pad = 16;  // 64 rows: divisible by tp = 1, 2, 4
  c.block_size = 16;
  return c;
}

struct Layout {
  int dp = 1, pp = 1, tp = 1;
};

// What rank `rank` of a (dp, pp, tp) layout holds (order tp-dp-pp, tp fastest).
struct RankView {
  int dp_rank = 0, pp_rank = 0, tp_rank = 0;
  Layout layout;
  std::unique_ptr<ParameterRegistry> reg;
  // This rank's data-parallel partition of the flat buffer.
  std::size_t part_lo() const { return reg->size() * dp_rank / layout.dp; }
  std::size_t part_hi() const { return reg->size() * (dp_rank + 1) / layout.dp; }
};

inline RankView rank_view(const GptConfig& cfg, Layout L, int rank) {
  RankView v;
  v.layout = L;
  v.tp_rank = rank % L.tp;
  v.dp_rank = (rank / L.tp) % L.dp;
  v.pp_rank = rank / (L.tp * L.dp);
  const int first = cfg.n_layer * v.pp_rank / L.pp, last = cfg.n_layer * (v.pp_rank + 1) / L.pp;
  v.reg = std::make_unique<ParameterRegistry>(cfg, v.tp_rank, L.tp, v.pp_rank, first, last,
                                              v.pp_rank == 0, v.pp_rank == L.pp - 1);
  return v;
}

// Every (dp, pp, tp) with dp * pp * tp = world that the tiny model allows.
inline std::vector<Layout> layouts_of(int world) {
  std::vector<Layout> out;
  for (int tp = 1; tp <= 4; tp *= 2)
    for (int pp = 1; pp <= 4; ++pp)
      if (world % (tp * pp) == 0) out.push_back({world / (tp * pp), pp, tp});
  return out;
}

// An exactly representable value that depends on (group, tensor, global index) only.
inline float value(const std::string& prefix, const std::string& name, std::int64_t gi) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : prefix + "/" + name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  h ^= static_cast<std::uint64_t>(gi) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<float>(static_cast<int>(h % 20001) - 10000) / 1024.0f;
}

// The flat buffer of a rank: every element of every parameter holds value(prefix, ...).
inline std::vector<float> filled_buffer(const RankView& v, const std::string& prefix) {
  std::vector<float> buf(v.reg->size(), 0.0f);
  for (const auto& p : v.reg->params())
    for (std::size_t i = 0; i < p.numel; ++i)
      buf[p.offset + i] = value(prefix, p.name, p.global_index(static_cast<std::int64_t>(i),
                                                               v.tp_rank, v.layout.tp));
  return buf;
}

// Elements of `pieces` in `buf` (a flat buffer) that differ from the expected values.
inline std::size_t mismatches(const std::vector<meshtrain::io::TensorPiece>& pieces,
                              const std::vector<float>& buf, const std::string& prefix) {
  std::size_t bad = 0;
  for (const auto& pc : pieces)
    for (std::size_t j = 0; j < pc.count; ++j) {
      const auto gi = pc.param->global_index(static_cast<std::int64_t>(pc.local_begin + j),
                                             pc.tp_rank, pc.tp_size);
      if (buf[pc.flat_offset() + j] != value(prefix, pc.param->name, gi)) ++bad;
    }
  return bad;
}

}  // namespace ckpt_test
