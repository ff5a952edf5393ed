#pragma once
// Loads tests/fixtures/gpt2_tiny_v1.safetensors (made by tests/reference/gpt2_reference.py in
// float64) into a model and compares tensors with stated tolerances.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness.hpp"
#include "meshtrain/io/safetensors.hpp"
#include "meshtrain/model/gpt.hpp"

namespace mt_test {

// The source tree is compiled in; MESHTRAIN_SOURCE_DIR in the environment overrides it (tests
// run from a bundle on another machine).
inline std::string fixture_path() {
  const char* env = std::getenv("MESHTRAIN_SOURCE_DIR");
  return std::string(env ? env : MESHTRAIN_SOURCE_DIR) + "/tests/fixtures/gpt2_tiny_v1.safetensors";
}

inline std::string llama_fixture_path() {
  const char* env = std::getenv("MESHTRAIN_SOURCE_DIR");
  return std::string(env ? env : MESHTRAIN_SOURCE_DIR) + "/tests/fixtures/llama_tiny_v1.safetensors";
}

// tests/reference/llama_reference.py's CFG: 2 layers, hidden 32, 4 query heads, 2 key-value
// heads of 8, SwiGLU 48, vocab 61 padded to 64, untied head, rope_theta 1e4, RMSNorm eps 1e-5.
inline meshtrain::model::GptConfig llama_fixture_config() {
  meshtrain::model::GptConfig c = meshtrain::model::preset("llama-tiny");
  c.name = "llama-fixture";
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.head_dim = 8;
  c.intermediate_size = 48;
  c.vocab_size = 61;
  c.vocab_pad = 64;
  c.block_size = 16;
  c.tied_head = false;
  c.rope = meshtrain::kernels::RopeConfig{};
  c.rope.theta = 1e4;
  c.norm_eps = 1e-5;
  return c;
}

inline meshtrain::model::GptConfig fixture_config() {
  meshtrain::model::GptConfig c;
  c.name = "fixture";
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 61;
  c.vocab_pad = 64;
  c.block_size = 16;
  return c;
}

// Copy `prefix + name` tensors into the model's parameters; wte's padding rows stay zero, and
// with missing_ok so do parameters the file does not have.
inline void load_params(const meshtrain::io::SafetensorsReader& f, meshtrain::model::Gpt& m,
                        const std::string& prefix, bool missing_ok = false) {
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.params());
  Kokkos::deep_copy(host, 0.0f);
  for (const auto& p : m.registry().params()) {
    if (missing_ok && !f.has(prefix + p.name)) continue;
    auto v = f.read_f32(prefix + p.name);
    REQUIRE(v.size() <= p.numel);
    std::copy(v.begin(), v.end(), host.data() + p.offset);
  }
  Kokkos::deep_copy(m.params(), host);
}

// max |a - b| over the first n elements of a (host) and b.
inline double max_abs_diff(const float* a, const std::vector<float>& b) {
  double d = 0;
  for (std::size_t i = 0; i < b.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}
inline double max_abs(const std::vector<float>& b) {
  double d = 0;
  for (float x : b) d = std::max(d, std::fabs(double(x)));
  return d;
}

}  // namespace mt_test
