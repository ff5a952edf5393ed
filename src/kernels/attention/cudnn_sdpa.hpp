#pragma once
// Private to src/kernels/: cuDNN's fused flash attention between Tq query rows and Tk key rows
// (scaled dot product attention, SDPA), forward and backward, as cuDNN backend operation graphs
// (cudnn_sdpa.cpp). Its two callers map their buffers onto it: causal self-attention over the
// packed qkv buffer (attention_cudnn.cpp) and the blocks of ring attention
// (attention_block_cudnn.cpp).
//
// Every operand is addressed in place through strides, cuDNN dims [b, h, s, d]: element d of row
// s of head h of batch b lies at b * batch + h * HS + s * row + d from the operand's pointer
// (Rows). Q, O, dO and dQ have NH heads and Tq rows; K, V, dK and dV NKV heads and Tk rows
// (grouped-query attention: query head h reads kv head h / (NH / NKV)). The softmax statistics
// are fp32 (b, h, s) at b * stats_batch + h * stats_head + s: the natural log-sum-exp of the
// scaled scores, our lse.
#include <Kokkos_Macros.hpp>  // KOKKOS_ENABLE_CUDA

#if defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN)
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <type_traits>
#include <vector>

#include "cudnn_backend.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels::detail::cudnn {

struct Rows {
  int64_t batch = 0, row = 0;
};

struct SdpaShape {
  int B = 0, Tq = 0, Tk = 0, NH = 0, NKV = 0, HS = 0;
  bool causal = false;  // key j is seen by query i iff j <= i (Tq == Tk); else no mask
  Rows q, k, v, o, dout, dq, dk, dv;
  int64_t stats_batch = 0, stats_head = 0;
  // Everything a plan bakes in (the plan cache's key): sizes, the mask and every stride.
  std::vector<int64_t> key() const;
};

struct ForwardPtrs {
  const void *q, *k, *v;
  void* o;
  float* stats;
};
struct BackwardPtrs {
  const void *q, *k, *v, *o, *dout;
  const float* stats;
  void *dq, *dk, *dv;
};

template <class T>
inline constexpr bool kIoType = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;
template <class T>
constexpr cudnnDataType_t io_type() {
  if constexpr (std::is_same_v<T, bf16>) return CUDNN_DATA_BFLOAT16;
  else return CUDNN_DATA_HALF;
}

// Whether a call is cuDNN's: not --attn.impl meshtrain, the library loaded (under --attn.impl
// cudnn a library that does not load is an error), HS in {64, 128}, every pointer 16-byte
// aligned and every stride a multiple of 8 elements (16 bytes of a 16-bit type). False means:
// launch nothing, our kernels run the call.
bool eligible(int HS, std::initializer_list<const void*> ptrs,
              std::initializer_list<int64_t> strides = {});

struct State;
struct CachedPlan;

// One call: holds the process's cuDNN state (handle, plan cache, the device buffer shared by all
// plans) locked while it lives, the handle on exec's stream. Every use of the buffer is on the
// caller's stream, which orders them; the kernels that read a call's outputs from its scratch
// are launched while it lives.
class Sdpa {
 public:
  explicit Sdpa(const ExecSpace& exec);
  ~Sdpa();
  Sdpa(const Sdpa&) = delete;
  Sdpa& operator=(const Sdpa&) = delete;

  // The plan of `shape` in one direction, found or built. False when cuDNN has no engine for it:
  // under --attn.impl automatic after one warning per shape (the caller then runs our kernels),
  // under cudnn an Error is thrown instead.
  bool plan(bool backward, cudnnDataType_t io, const SdpaShape& shape);
  // `bytes` of device scratch for the caller, 256-byte aligned, until the next call. After plan().
  unsigned char* scratch(std::size_t bytes);
  void forward(const ForwardPtrs& p);
  // dQ, dK, dV (written, not added) from dO, O and the statistics of the output O.
  void backward(const BackwardPtrs& p);

 private:
  State& s_;
  std::lock_guard<std::mutex> lock_;
  cudaStream_t stream_;
  CachedPlan* plan_ = nullptr;
  SdpaShape shape_;
  unsigned char *own_ = nullptr, *workspace_ = nullptr;
};

}  // namespace meshtrain::kernels::detail::cudnn

#endif
