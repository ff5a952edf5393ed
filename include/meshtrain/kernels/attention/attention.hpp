#pragma once
// Causal multi-head self-attention, scaled dot product with softmax, in the fused, memory-lean
// formulation of FlashAttention (Dao et al. 2022): an online softmax over key blocks, so the
// T x T score matrix is never stored; only the per-row log-sum-exp is saved, and the backward
// pass recomputes the probabilities from it.
//
// Grouped-query attention (Ainslie et al. 2023): NKV key/value heads, each shared by
// NH / NKV consecutive query heads (query head h reads kv head h / (NH / NKV)); NKV = NH is
// plain multi-head attention (GPT-2), NKV = 1 multi-query attention. NKV = 0 means NH.
//
// qkv: [B, T, (NH + 2*NKV)*HS] rows laid out as [q | k | v]: q is NH*HS wide, k and v NKV*HS
//      each, head h at columns [h*HS, (h+1)*HS) of its part (HF GPT-2's c_attn output, or a
//      Llama q/k/v projection packed in one GEMM; with tensor parallelism NH and NKV are the
//      local head counts).
// out: [B, T, NH*HS], head h at columns [h*HS, (h+1)*HS).
// lse: [B, NH, T] fp32, log(sum_j exp(s_ij)) of the scaled scores s = q.k / sqrt(HS).
// The backward's dK and dV of a kv head are sums over the query heads that share it.
#include <string>

#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

// Which implementation attention_forward/backward run on a CUDA device (--attn.impl):
// automatic: cuDNN's fused flash attention where the library loaded and supports the call
//   (bf16/fp16, HS in {64, 128}), else ours; cudnn: the same, but a missing or unusable
//   libcudnn is an error (check_attention_backend); meshtrain: always ours. Host builds and
//   host memory always run ours.
enum class AttentionImpl { automatic, cudnn, meshtrain };
struct AttentionOptions {
  AttentionImpl impl = AttentionImpl::automatic;
  // cuDNN's deterministic backward (--attn.deterministic): the same bits on every run, at some
  // cost in speed. Our kernels are deterministic in either mode (no atomics).
  bool deterministic = false;
};
// Process-wide, set once before training (parallel::Engine does it from EngineOptions).
void set_attention_options(const AttentionOptions& options);
const AttentionOptions& attention_options();
// "auto" | "cudnn" | "meshtrain"; anything else throws a ConfigError naming `option`.
AttentionImpl parse_attention_impl(const std::string& text, const std::string& option);
const char* to_string(AttentionImpl impl);
// Loads libcudnn.so.9 on first use (CUDA builds with MESHTRAIN_ENABLE_CUDNN). "" when cuDNN
// attention can run; otherwise why not (no CUDA, built without cuDNN, library not found, too
// old), for the log and for --attn.impl cudnn's error.
std::string cudnn_attention_unavailable_reason();

template <class T>
void attention_forward(const ExecSpace& exec, View1<T> out, View1<float> lse, View1<const T> qkv,
                       int B, int Tlen, int NH, int HS, int NKV = 0);

// dqkv = gradient wrt qkv (overwrites), from dout, the forward inputs/outputs and lse.
template <class T>
void attention_backward(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                        View1<const T> qkv, View1<const T> out, View1<const float> lse, int B,
                        int Tlen, int NH, int HS, int NKV = 0);

// attention_forward/backward dispatch like gemm: on host memory to a blocked CBLAS version of
// the same algorithm (src/kernels/attention/attention_host.cpp); on a CUDA device, for float and
// bf16 with HS in {32, 64, 128}, to tiled FlashAttention-2 kernels
// (src/kernels/attention/attention_cuda*.cpp: fp32 FMAs for float, tensor cores for bf16);
// elsewhere to these portable Kokkos kernels, which any backend can also call directly (the
// tests' oracle for the other two paths).
template <class T>
void attention_forward_flash(const ExecSpace& exec, View1<T> out, View1<float> lse,
                             View1<const T> qkv, int B, int Tlen, int NH, int HS, int NKV = 0);
template <class T>
void attention_backward_flash(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                              View1<const T> qkv, View1<const T> out, View1<const float> lse,
                              int B, int Tlen, int NH, int HS, int NKV = 0);

// The plain formulation (materialises the T x T probabilities): test oracle only.
template <class T>
void attention_forward_reference(const ExecSpace& exec, View1<T> out, View1<const T> qkv, int B,
                                 int Tlen, int NH, int HS, int NKV = 0);

}  // namespace meshtrain::kernels
