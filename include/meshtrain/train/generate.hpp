#pragma once
// Sampling text from a model: temperature and top-k over the real vocabulary, drawn from the
// counter-based RNG keyed by (seed, position), so a sample is reproducible.
#include <cstdint>
#include <vector>

#include "meshtrain/model/gpt.hpp"

namespace meshtrain::train {

struct SampleConfig {
  int max_new_tokens = 200;
  float temperature = 0.8f;  // <= 0: greedy
  int top_k = 40;            // <= 0: the whole vocabulary
  std::uint64_t seed = 42;
};

// Continues `prompt` (non-empty) by up to max_new_tokens tokens, returns prompt + continuation.
// The context is the last seq_len tokens; the model's first sequence row carries it.
template <class T>
std::vector<std::int32_t> generate(model::GptT<T>& m, std::vector<std::int32_t> prompt,
                                   const SampleConfig& cfg);

// Index drawn from logits (host, length n) with temperature / top-k, using uniform u in (0, 1].
int sample_index(const float* logits, int n, float temperature, int top_k, double u);

}  // namespace meshtrain::train
