#pragma once
// The scratch the kernels keep for themselves, by the constants the kernels use: the planner
// predicts a rank's memory from these instead of copying them (plan/memory.cpp).
#include <cstddef>

namespace meshtrain::kernels {

// cuBLASLt's workspace (kernels/gemm/gemm_lt.cpp), 256-byte aligned inside its allocation.
inline constexpr std::size_t kGemmLtWorkspaceBytes = std::size_t(32) << 20;
// Blocks of the CUDA LayerNorm backward (kernels/layernorm_cuda.cpp): 4 on each of an H100's or
// H200's 132 SMs, each with 2C fp32 partial sums.
inline constexpr int kLayerNormBackwardBlocks = 4 * 132;
// Query rows per block of the host attention (kernels/attention/attention_host.cpp).
inline constexpr int kAttentionHostBlock = 64;

// cuDNN fused attention's backward (kernels/attention/cudnn_sdpa.cpp) takes one of two forms,
// cudnn-frontend's rule: dP kept in cuDNN's workspace (no dQ atomics, deterministic) on Hopper
// and newer while that buffer stays under 256 MiB, or whenever determinism is asked for; else
// dQ accumulated in an fp32 scratch of ours.
// Tq query rows against Tk key rows (the blocks of ring attention; T and T for self-attention).
bool cudnn_attention_dq_accum_form(long B, long NH, long Tq, long Tk, bool deterministic,
                                   int sm_major);
bool cudnn_attention_dq_accum_form(long B, long NH, long T, bool deterministic, int sm_major);
// Bytes of the cuDNN attention backward's device buffer for one call: our scratch (the rowsum
// D = rowsum(dO * O), and the fp32 dQ accumulator in that form; T = the query rows), exactly as
// the kernel sizes it, plus cuDNN's workspace, which only cuDNN's plan knows: estimated as the
// dP buffer of the workspace form (B x NH x T64^2 x 2 bytes, the size cudnn-frontend's rule
// tests), 0 otherwise.
std::size_t cudnn_attention_own_scratch_bytes(long B, long NH, long T, long HS, bool dq_accum);
std::size_t cudnn_attention_buffer_bytes(long B, long NH, long T, long HS, bool deterministic,
                                         int sm_major);
// The caller's part of that buffer for ring attention's blocks (attention_block_cudnn.cpp): the
// largest, the backward of the causal T x T block (T the rank's rows), stages the merged lse
// and cuDNN's 16-bit dQ, dK and dV there before adding them into the fp32 accumulators; the
// forward's O and statistics are smaller.
std::size_t cudnn_attention_block_scratch_bytes(long B, long NH, long NKV, long T, long HS);

// Shapes that size the kernels' scratch for one rank's model.
struct ScratchShape {
  std::size_t rows = 0;        // B x T of a micro-batch (full rows)
  std::size_t seq_len = 0;     // T
  std::size_t channels = 0;    // C
  std::size_t widest_out = 0;  // output columns of the widest linear (the bias-gradient scratch)
  bool embeds = false;         // the rank runs the embedding (its backward sorts keys)
  // Attention through cuDNN (a GPU run with --attn.impl auto|cudnn on a cuDNN build, 16-bit,
  // head size 64 or 128): its backward's buffer, sized by the largest call (one micro-batch,
  // this rank's query heads).
  bool cudnn_attention = false;
  bool deterministic_attention = false;
  std::size_t batch = 0, heads = 0, head_dim = 0;
  // Context parallelism: attention runs as ring attention's blocks, whose outputs pass through
  // the same buffer (cudnn_attention_block_scratch_bytes); kv_heads: this rank's kv heads.
  bool attention_blocks = false;
  std::size_t kv_heads = 0;
};

// Bytes the kernels allocate while a step runs (transient buffers at their peak and persistent
// scratch), for compute elements of `elem_bytes`, on a GPU or with host execution.
std::size_t scratch_bytes(const ScratchShape& s, std::size_t elem_bytes, bool device_is_host);

}  // namespace meshtrain::kernels
