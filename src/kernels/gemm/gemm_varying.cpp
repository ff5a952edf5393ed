// gemm_varying (gemm_varying.hpp): kernels::gemm with the algorithm chosen per
// size bucket on CUDA, so that shapes that change every step do not pay
// cuBLAS's per-shape choice each call.
#include "meshtrain/kernels/gemm/gemm_varying.hpp"

#include <atomic>
#include <string>
#include <type_traits>

#include "../common.hpp"  // first: Kokkos defines KOKKOS_ENABLE_CUDA
#include "gemm_detail.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include "gemm_lt.hpp"
#endif

namespace meshtrain::kernels {

namespace {
std::atomic<std::uint64_t> g_bucketed{0}, g_plain{0};
}  // namespace

int gemm_size_bucket(int v) {
  if (v <= 64) return 64;
  int p = 64;
  while (p <= v / 2) p *= 2;  // the largest power of two <= v
  for (int quarter = 0; quarter < 4; ++quarter)
    if (p + p / 4 * quarter >= v) return p + p / 4 * quarter;
  return 2 * p;
}

GemmVaryingCounts gemm_varying_counts() { return {g_bucketed.load(), g_plain.load()}; }

template <class T>
void gemm_varying(const ExecSpace& exec, VaryingDim varying, Trans ta, Trans tb, int M, int N,
                  int K, float alpha, const T* A, int lda, const T* B, int ldb, float beta, T* C,
                  int ldc) {
  detail::check_gemm("gemm_varying", ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  if (M == 0 || N == 0) return;
#if defined(KOKKOS_ENABLE_CUDA)
  constexpr bool lt_type = std::is_same_v<T, float>
#if MESHTRAIN_HAVE_BF16
                           || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>
#endif
      ;
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda> && lt_type) {
    if (K > 0) {
      // Labelled by the fixed dimensions, the varying one by its letter, so that a profile sums
      // each kind of expert GEMM over its sizes: "meshtrain::gemm_varying NN Mx3072x768".
      const detail::ToolRegion region([&] {
        const bool vm = varying == VaryingDim::M;
        return std::string("meshtrain::gemm_varying ") + (ta == Trans::N ? "N" : "T") +
               (tb == Trans::N ? "N" : "T") + " " + (vm ? "M" : std::to_string(M)) + "x" +
               std::to_string(N) + "x" + (vm ? std::to_string(K) : "K");
      });
      cudaDataType_t type = CUDA_R_32F;
#if MESHTRAIN_HAVE_BF16
      if constexpr (std::is_same_v<T, bf16>) type = CUDA_R_16BF;
      if constexpr (std::is_same_v<T, fp16>) type = CUDA_R_16F;
#endif
      const detail::LtCall call{
          .type = type, .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = alpha, .A = A,
          .lda = lda, .B = B, .ldb = ldb, .beta = beta, .C = C, .ldc = ldc, .D = C, .ldd = ldc,
          .epilogue = detail::LtEpilogue::none, .bias = nullptr, .aux = nullptr, .ldaux = 0};
      if (detail::lt_matmul_bucketed(exec, call, varying == VaryingDim::M)) {
        ++g_bucketed;
        return;
      }
    }
  }
#endif
  (void)varying;
  ++g_plain;
  gemm<T>(exec, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#define MESHTRAIN_INSTANTIATE_GEMM_VARYING(T)                                                     \
  template void gemm_varying<T>(const ExecSpace&, VaryingDim, Trans, Trans, int, int, int, float, \
                                const T*, int, const T*, int, float, T*, int);
MESHTRAIN_INSTANTIATE_GEMM_VARYING(float)
MESHTRAIN_INSTANTIATE_GEMM_VARYING(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GEMM_VARYING(bf16)
MESHTRAIN_INSTANTIATE_GEMM_VARYING(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GEMM_VARYING

}  // namespace meshtrain::kernels
