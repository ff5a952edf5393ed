#pragma once
// Rotary position embedding (RoPE; Su et al. 2021) in HuggingFace's rotate_half convention,
// the layout HF's Llama q/k weights use: within a head of size HS, element i pairs with
// i + HS/2 (i < HS/2) and the pair is rotated by the angle pos * inv_freq[i]:
//   y_i        = x_i cos - x_{i+HS/2} sin
//   y_{i+HS/2} = x_{i+HS/2} cos + x_i sin
// It is applied in place to the q and k parts of a packed qkv buffer [B*T, (NH + 2*NKV)*HS]
// (columns: NH query heads, NKV key heads, NKV value heads; v is not touched), position t of
// row b*T + t. Under tensor parallelism NH and NKV are a rank's local head counts.
#include <vector>

#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

// rope_theta and Llama 3's frequency scaling (HF config rope_scaling with rope_type "llama3":
// factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
struct RopeConfig {
  double theta = 10000.0;
  bool llama3_scaling = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
  bool operator==(const RopeConfig&) const = default;
};

// The HS/2 inverse frequencies as HF computes them (_compute_default_rope_parameters, then
// _compute_llama3_parameters when scaling is on), fp32 operation by operation: HF's model
// keeps them, and the angles pos * inv_freq, in fp32 whatever the model's dtype, and so do we.
// ConfigError for an odd or non-positive head size or bad scaling parameters.
std::vector<float> rope_inv_freq(int head_size, const RopeConfig& c);

// cos and sin of the angle float(t) * inv_freq[i] (an fp32 product, as HF's), [T][HS/2] each,
// fp32 in device memory. Built once per (T, HS, config) and reused by every layer and step.
struct RopeTable {
  int T = 0, head_size = 0;
  RopeConfig config;
  View1<float> cos, sin;
  bool matches(int t, int hs, const RopeConfig& c) const {
    return T == t && head_size == hs && config == c;
  }
};
RopeTable rope_table(const ExecSpace& exec, int T, int head_size, const RopeConfig& c);
// Row t rotates by position positions[t] (context parallelism: a rank's rows are chunks of the
// sequence, not its first T positions); T = positions.size().
RopeTable rope_table(const ExecSpace& exec, const std::vector<int>& positions, int head_size,
                     const RopeConfig& c);

// In place on qkv [B*T, (NH + 2*NKV)*HS], HS = table.head_size, T <= table.T.
template <class T>
void rotary_forward(const ExecSpace& exec, View1<T> qkv, const RopeTable& table, int B, int Tseq,
                    int NH, int NKV);
// The inverse (transposed) rotation, in place on the gradient dqkv of the rotated buffer: the
// q and k parts become the gradients of the unrotated q and k; the v part is not touched.
template <class T>
void rotary_backward(const ExecSpace& exec, View1<T> dqkv, const RopeTable& table, int B,
                     int Tseq, int NH, int NKV);

}  // namespace meshtrain::kernels
