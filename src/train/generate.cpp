#include "meshtrain/train/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/rng.hpp"

namespace meshtrain::train {

int sample_index(const float* logits, int n, float temperature, int top_k, double u) {
  if (temperature <= 0) return static_cast<int>(std::max_element(logits, logits + n) - logits);
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  int k = (top_k > 0 && top_k < n) ? top_k : n;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return logits[a] > logits[b]; });
  const double mx = logits[idx[0]];
  std::vector<double> p(k);
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += p[i] = std::exp((logits[idx[i]] - mx) / temperature);
  double acc = 0, target = u * sum;
  for (int i = 0; i < k; ++i) {
    acc += p[i];
    if (acc >= target) return idx[i];
  }
  return idx[k - 1];
}

template <class T>
std::vector<std::int32_t> generate(model::GptT<T>& m, std::vector<std::int32_t> tokens,
                                   const SampleConfig& cfg) {
  MESHTRAIN_CHECK(!tokens.empty(), "generate needs a non-empty prompt");
  const int Tlen = m.seq_len(), B = m.micro_batch(), Vp = m.config().padded_vocab();
  const int V = m.config().vocab_size;
  auto input = alloc<std::int32_t>("generate.input", static_cast<std::size_t>(B) * Tlen);
  auto h_input = Kokkos::create_mirror_view(input);
  HostView1<T> row("meshtrain::generate.row", Vp);
  std::vector<float> row_f(Vp);
  const std::uint64_t stream = rng::name_stream("generate");
  for (int i = 0; i < cfg.max_new_tokens; ++i) {
    const int n = std::min<int>(static_cast<int>(tokens.size()), Tlen);
    Kokkos::deep_copy(h_input, 0);
    std::copy(tokens.end() - n, tokens.end(), h_input.data());
    Kokkos::deep_copy(input, h_input);
    auto logits = m.forward_logits(input);
    Kokkos::deep_copy(row, slice(logits, static_cast<std::size_t>(n - 1) * Vp, Vp));
    const double u = rng::uniform(cfg.seed, stream, tokens.size());
    for (int c = 0; c < Vp; ++c) row_f[c] = static_cast<float>(row(c));
    tokens.push_back(sample_index(row_f.data(), V, cfg.temperature, cfg.top_k, u));
  }
  return tokens;
}

template std::vector<std::int32_t> generate<float>(model::GptT<float>&, std::vector<std::int32_t>,
                                                   const SampleConfig&);
#if MESHTRAIN_HAVE_BF16
template std::vector<std::int32_t> generate<bf16>(model::GptT<bf16>&, std::vector<std::int32_t>,
                                                  const SampleConfig&);
template std::vector<std::int32_t> generate<fp16>(model::GptT<fp16>&, std::vector<std::int32_t>,
                                                  const SampleConfig&);
#endif

}  // namespace meshtrain::train
