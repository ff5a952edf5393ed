#pragma once
// Private to src/kernels/: the CUDA flash-attention kernels that attention_forward/backward run
// on a Kokkos::Cuda execution space (attention_cuda.cpp and attention_cuda_{f32,bf16}.cpp).
// Same contract as meshtrain/kernels/attention/attention.hpp; the Kokkos flash kernels stay the portable
// path and the test oracle.
#include <type_traits>

#include "meshtrain/core/view.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

namespace meshtrain::kernels::detail {

#if defined(KOKKOS_ENABLE_CUDA)

// Element types with CUDA kernels: float (fp32 FMA, no tensor cores, so results stay within
// ~1e-6 of the portable kernels) and bf16 (mma.sync tensor cores, fp32 accumulation).
template <class T>
inline constexpr bool kCudaAttentionType =
    std::is_same_v<ExecSpace, Kokkos::Cuda> &&
    (std::is_same_v<T, float>
#if KOKKOS_VERSION >= 40000
     || std::is_same_v<T, Kokkos::Experimental::bhalf_t>
#endif
    );

// Both return false, launching nothing, when the shape or the buffers do not suit the kernels
// (HS not in {32, 64, 128}; a q/k/v/out/dout/dqkv pointer not 16-byte aligned): the caller then
// runs the portable kernels. Shapes and extents are the caller's to check.
template <class T>
bool attention_forward_cuda(const ExecSpace& exec, View1<T> out, View1<float> lse,
                            View1<const T> qkv, int B, int Tlen, int NH, int HS, int NKV);
template <class T>
bool attention_backward_cuda(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                             View1<const T> qkv, View1<const T> out, View1<const float> lse,
                             int B, int Tlen, int NH, int HS, int NKV);

namespace cuda {
// Raw launchers, one per element type (bf16 as CUDA's __nv_bfloat16, the same bits as
// Kokkos' bhalf_t). The backward expects D_i = dO_i . O_i already in dqkv's q slots
// (attention_cuda_device.hpp, d_slot). NKV (>= 1) divides NH: grouped-query attention, the
// dK/dV kernels run one CTA per key block of a kv head and loop over its query heads.
void forward_f32(cudaStream_t st, const float* qkv, float* out, float* lse, int B, int T, int NH,
                 int HS, int NKV);
void backward_f32(cudaStream_t st, const float* qkv, const float* dout, const float* lse,
                  float* dqkv, int B, int T, int NH, int HS, int NKV);
void forward_bf16(cudaStream_t st, const void* qkv, void* out, float* lse, int B, int T, int NH,
                  int HS, int NKV);
void backward_bf16(cudaStream_t st, const void* qkv, const void* dout, const float* lse,
                   void* dqkv, int B, int T, int NH, int HS, int NKV);

// Tile shapes of the bf16 kernels at HS = 64 (bench_attention --variants explores them; 0 keeps
// the default): forward warps (16 query rows each), dK/dV warps (16 keys each) and query tile,
// dQ warps and key tile. Supported: fwd_warps 4 | 8; dkdv_warps 4 | 8 with dkdv_bq 32 | 64;
// dq_warps 4 | 8 with dq_bn 32 | 64 (and 4 x 16). Defaults: fwd 4, dkdv 4 x 64, dq 4 x 32 (measured fastest).
// Process-wide; not for use while kernels run elsewhere.
struct Bf16Tiles {
  int fwd_warps = 0, dkdv_warps = 0, dkdv_bq = 0, dq_warps = 0, dq_bn = 0;
  int fwd_bn = 0;  // keys per forward K/V tile: 32 | 64 | 128 (128 also with 8 warps)
};
void set_bf16_tiles(const Bf16Tiles& tiles);
}  // namespace cuda

#endif  // KOKKOS_ENABLE_CUDA

}  // namespace meshtrain::kernels::detail
