#include "meshtrain/kernels/workspace.hpp"

namespace meshtrain::kernels {

std::size_t scratch_bytes(const ScratchShape& s, std::size_t elem_bytes, bool device_is_host) {
  if (device_is_host) {
    // The host attention's backward keeps two blocks of scores (P and dS), kBlock x T each.
    return 2 * std::size_t(kAttentionHostBlock) * s.seq_len * elem_bytes;
  }
  // cuBLASLt: its workspace and the bias-gradient scratch of the widest linear.
  std::size_t b = kGemmLtWorkspaceBytes + s.widest_out * elem_bytes;
  // The CUDA LayerNorm backward's per-block partial sums.
  b += std::size_t(kLayerNormBackwardBlocks) * 2 * s.channels * 4;
  // The embedding backward (16-bit and fp32 models): sort keys and per-piece fp32 partials.
  if (s.embeds) b += s.rows * 8 + s.rows * s.channels * 4;
  return b;
}

}  // namespace meshtrain::kernels
