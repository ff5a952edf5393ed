#pragma once
// Shared by the planner's tests: a small model, a token shard, and a layout builder.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "harness.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/plan/layout.hpp"

namespace plan_test {

// 4 blocks, 4 heads, width 64, vocabulary 250 padded to 256 (divisible by tp 1..8).
inline meshtrain::model::GptConfig small_model() {
  meshtrain::model::GptConfig c;
  c.name = "plan-test";
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 250;
  c.vocab_pad = 64;
  c.block_size = 32;
  return c;
}

inline std::string make_shard(const std::string& name) {
  const std::string dir = name + "_" + std::to_string(mt_test::world_rank());
  std::filesystem::create_directories(dir);
  std::vector<std::uint16_t> t;
  std::uint32_t s = 7;
  for (int i = 0; i < 20000; ++i) {
    s = s * 1664525u + 1013904223u;
    t.push_back(static_cast<std::uint16_t>((s >> 16) % 250));
  }
  meshtrain::io::write_shard(dir + "/data_000000.bin", t);
  return dir + "/data_*.bin";
}

using K = meshtrain::parallel::ScheduleKind;

struct L {
  int dp, pp, tp, zero, mb, n_micro;
  K schedule = K::one_f_one_b;
  int v = 1;
  bool sp = false, recompute = false, offload = false;
  std::size_t bucket = 25u << 20;
  bool mlp_act = false;  // train.recompute_mlp_act
  bool fp8 = false;      // train.precision=fp8 (tensorwise)
  int fp8_first_last_bf16 = 0;
  int cp = 1;            // mesh.cp (ring); world = dp x pp x tp x cp
  meshtrain::plan::Layout layout() const {
    meshtrain::plan::Layout l;
    l.dp = dp;
    l.pp = pp;
    l.tp = tp;
    l.zero_stage = zero;
    l.micro_batch = mb;
    l.n_micro = n_micro;
    l.schedule = schedule;
    l.virtual_chunks = v;
    l.sequence_parallel = sp;
    l.recompute = recompute;
    l.offload = offload;
    l.bucket_bytes = bucket;
    l.recompute_mlp_act = mlp_act;
    l.fp8 = fp8;
    l.cp = cp;
    l.fp8_first_last_bf16 = fp8_first_last_bf16;
    return l;
  }
};

}  // namespace plan_test
