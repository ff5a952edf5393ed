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
  // The planner plans for Hopper (H100/H200: compute capability 9).
  if (s.cudnn_attention) {
    b += cudnn_attention_buffer_bytes(long(s.batch), long(s.heads), long(s.seq_len),
                                      long(s.head_dim), s.deterministic_attention, 9);
    if (s.attention_blocks)
      b += cudnn_attention_block_scratch_bytes(long(s.batch), long(s.heads), long(s.kv_heads),
                                               long(s.seq_len), long(s.head_dim));
  }
  return b;
}

bool cudnn_attention_dq_accum_form(long B, long NH, long Tq, long Tk, bool deterministic,
                                   int sm_major) {
  if (deterministic) return false;
  if (sm_major < 9) return true;
  const long q64 = (Tq + 63) / 64 * 64, k64 = (Tk + 63) / 64 * 64;
  return B * NH * q64 * k64 * 2 > (long(256) << 20);
}

bool cudnn_attention_dq_accum_form(long B, long NH, long T, bool deterministic, int sm_major) {
  return cudnn_attention_dq_accum_form(B, NH, T, T, deterministic, sm_major);
}

std::size_t cudnn_attention_own_scratch_bytes(long B, long NH, long T, long HS, bool dq_accum) {
  const std::size_t rows = std::size_t(B) * NH * T;
  return rows * sizeof(float) * (dq_accum ? 1 + HS : 1);
}

std::size_t cudnn_attention_buffer_bytes(long B, long NH, long T, long HS, bool deterministic,
                                         int sm_major) {
  const bool dq_accum = cudnn_attention_dq_accum_form(B, NH, T, deterministic, sm_major);
  const long t64 = (T + 63) / 64 * 64;
  const std::size_t workspace = dq_accum ? 0 : std::size_t(B) * NH * t64 * t64 * 2;
  // buffer_for's 256-byte rounding and its 512 bytes of alignment slack.
  return (cudnn_attention_own_scratch_bytes(B, NH, T, HS, dq_accum) + 255) / 256 * 256 +
         workspace + 512;
}

std::size_t cudnn_attention_block_scratch_bytes(long B, long NH, long NKV, long T, long HS) {
  const auto round256 = [](std::size_t n) { return (n + 255) / 256 * 256; };
  const std::size_t rows = std::size_t(B) * T;
  return round256(rows * NH * sizeof(float)) + round256(rows * NH * HS * 2) +
         2 * round256(rows * NKV * HS * 2);
}

}  // namespace meshtrain::kernels
