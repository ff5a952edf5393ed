#pragma once
// The scratch the kernels keep for themselves, by the constants the kernels use: the planner
// predicts a rank's memory from these instead of copying them (plan/memory.cpp).
#include <cstddef>

namespace meshtrain::kernels {

// cuBLASLt's workspace (kernels/gemm_lt.cpp), 256-byte aligned inside its allocation.
inline constexpr std::size_t kGemmLtWorkspaceBytes = std::size_t(32) << 20;
// Blocks of the CUDA LayerNorm backward (kernels/layernorm_cuda.cpp): 4 on each of an H100's or
// H200's 132 SMs, each with 2C fp32 partial sums.
inline constexpr int kLayerNormBackwardBlocks = 4 * 132;
// Query rows per block of the host attention (kernels/attention_host.cpp).
inline constexpr int kAttentionHostBlock = 64;

// Shapes that size the kernels' scratch for one rank's model.
struct ScratchShape {
  std::size_t rows = 0;        // B x T of a micro-batch (full rows)
  std::size_t seq_len = 0;     // T
  std::size_t channels = 0;    // C
  std::size_t widest_out = 0;  // output columns of the widest linear (the bias-gradient scratch)
  bool embeds = false;         // the rank runs the embedding (its backward sorts keys)
};

// Bytes the kernels allocate while a step runs (transient buffers at their peak and persistent
// scratch), for compute elements of `elem_bytes`, on a GPU or with host execution.
std::size_t scratch_bytes(const ScratchShape& s, std::size_t elem_bytes, bool device_is_host);

}  // namespace meshtrain::kernels
