// GEMM dispatch (kokkos-kernels' TPL pattern): check extents once, then hand the call to the
// vendor BLAS that can read the memory: CBLAS on host spaces, cuBLAS on CUDA. The plain Kokkos
// kernel below is the oracle for both and the fallback for element types BLAS does not take.
#include "meshtrain/kernels/gemm/gemm.hpp"

#include <algorithm>
#include <type_traits>

#include "../cblas.hpp"
#include "../common.hpp"
#include "gemm_detail.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#endif

namespace meshtrain::kernels {

namespace detail {

void check_gemm(const char* fn, Trans ta, Trans tb, int M, int N, int K, const void* A, int lda,
                const void* B, int ldb, const void* C, int ldc) {
  MESHTRAIN_CHECK(M >= 0 && N >= 0 && K >= 0, fn, ": negative dimension (M=", M, ", N=", N,
                  ", K=", K, ")");
  // Row widths of A, B, C as stored (row-major); BLAS wants ld >= max(1, width).
  const int a_width = ta == Trans::N ? K : M;
  const int b_width = tb == Trans::N ? N : K;
  MESHTRAIN_CHECK(lda >= std::max(1, a_width), fn, ": lda=", lda, " < row width ", a_width,
                  " of A (M=", M, ", K=", K, ", ta=", ta == Trans::N ? "N" : "T", ")");
  MESHTRAIN_CHECK(ldb >= std::max(1, b_width), fn, ": ldb=", ldb, " < row width ", b_width,
                  " of B (K=", K, ", N=", N, ", tb=", tb == Trans::N ? "N" : "T", ")");
  MESHTRAIN_CHECK(ldc >= std::max(1, N), fn, ": ldc=", ldc, " < row width N=", N, " of C");
  if (M > 0 && N > 0) {
    MESHTRAIN_CHECK(C != nullptr, fn, ": C is null for M=", M, ", N=", N);
    if (K > 0)
      MESHTRAIN_CHECK(A != nullptr && B != nullptr, fn, ": A or B is null for M=", M, ", N=", N,
                      ", K=", K);
  }
}

}  // namespace detail

namespace {

template <class T>
inline constexpr bool kBlasType = std::is_same_v<T, float> || std::is_same_v<T, double>;

CBLAS_TRANSPOSE cblas_op(Trans t) { return t == Trans::N ? CblasNoTrans : CblasTrans; }

#if defined(KOKKOS_ENABLE_CUDA)
// One handle per (device, stream), created on first use and destroyed at Kokkos::finalize.
// cublasCreate is expensive and a handle is bound to one stream, hence the cache.
cublasHandle_t cublas_handle(cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, cublasHandle_t> handles;
  static bool hook_installed = false;
  int device = 0;
  MESHTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, stream);
  auto it = handles.find(key);
  if (it != handles.end()) return it->second;
  cublasHandle_t h = nullptr;
  MESHTRAIN_CUBLAS_CHECK(cublasCreate(&h));
  MESHTRAIN_CUBLAS_CHECK(cublasSetStream(h, stream));
  handles.emplace(key, h);
  if (!hook_installed) {
    hook_installed = true;
    Kokkos::push_finalize_hook([] {
      std::lock_guard<std::mutex> lk(mutex);
      for (auto& kv : handles) cublasDestroy(kv.second);
      handles.clear();
    });
  }
  return h;
}

cublasOperation_t cublas_op(Trans t) { return t == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T; }
#endif

}  // namespace

template <class T>
void gemm_reference(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
                    const T* A, int lda, const T* B, int ldb, float beta, T* C, int ldc) {
  using detail::acc;
  using detail::Index;
  using Acc = detail::acc_t<T>;
  detail::check_gemm("gemm_reference", ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  if (M == 0 || N == 0) return;
  const bool a_n = ta == Trans::N, b_n = tb == Trans::N;
  const Index sa = lda, sb = ldb, sc = ldc;
  const Acc al = alpha, be = beta;
  // One thread per C element, K-loop inside: the simplest correct form, for an oracle.
  Kokkos::parallel_for(
      "meshtrain::gemm_reference", detail::Range(exec, 0, Index(M) * N),
      KOKKOS_LAMBDA(Index idx) {
        const Index i = idx / N, j = idx % N;
        Acc s = 0;
        for (Index k = 0; k < K; ++k) {
          const Acc a = acc(a_n ? A[i * sa + k] : A[k * sa + i]);
          const Acc b = acc(b_n ? B[k * sb + j] : B[j * sb + k]);
          s += a * b;
        }
        // BLAS semantics: with beta == 0, C is not read (it may hold garbage or NaN).
        Acc c = al * s;
        if (be != Acc(0)) c += be * acc(C[i * sc + j]);
        C[i * sc + j] = static_cast<T>(c);
      });
}

template <class T>
void gemm(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha, const T* A,
          int lda, const T* B, int ldb, float beta, T* C, int ldc) {
  detail::check_gemm("gemm", ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  if (M == 0 || N == 0) return;
  if constexpr (kDeviceIsHost && kBlasType<T>) {
    // BLAS runs on this host thread, outside the instance's queue: wait for the producers.
    kc::fence(exec, "meshtrain::gemm: before cblas");
    // BLAS is no Kokkos kernel: a region makes it visible to Kokkos Tools (and to
    // perf/bench/bench_train_step's time shares). Without a tool loaded this is a null-pointer
    // check.
    Kokkos::Profiling::pushRegion("meshtrain::gemm");
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, cblas_op(ta), cblas_op(tb), M, N, K, alpha, A, lda, B, ldb, beta,
                  C, ldc);
    else
      cblas_dgemm(CblasRowMajor, cblas_op(ta), cblas_op(tb), M, N, K, alpha, A, lda, B, ldb, beta,
                  C, ldc);
    Kokkos::Profiling::popRegion();
    return;
  }
#if defined(KOKKOS_ENABLE_CUDA)
  // Labelled by shape for the profilers: "meshtrain::gemm NT 16384x2304x768".
  const detail::ToolRegion region([&] {
    return std::string("meshtrain::gemm ") + (ta == Trans::N ? "N" : "T") +
           (tb == Trans::N ? "N" : "T") + " " + std::to_string(M) + "x" + std::to_string(N) + "x" +
           std::to_string(K);
  });
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda> && kBlasType<T>) {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a row-major matrix
    // read column-major is its transpose: swap the operands (and M, N), keep the op flags.
    cublasHandle_t h = cublas_handle(exec.cuda_stream());
    if constexpr (std::is_same_v<T, float>) {
      MESHTRAIN_CUBLAS_CHECK(cublasSgemm(h, cublas_op(tb), cublas_op(ta), N, M, K, &alpha, B, ldb,
                                         A, lda, &beta, C, ldc));
    } else {
      const double al = alpha, be = beta;
      MESHTRAIN_CUBLAS_CHECK(
          cublasDgemm(h, cublas_op(tb), cublas_op(ta), N, M, K, &al, B, ldb, A, lda, &be, C, ldc));
    }
    return;
  }
#if MESHTRAIN_HAVE_BF16
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda> &&
                (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>)) {
    // 16-bit operands on the tensor cores, fp32 accumulation and scaling, 16-bit result.
    const cudaDataType_t type = std::is_same_v<T, bf16> ? CUDA_R_16BF : CUDA_R_16F;
    cublasHandle_t h = cublas_handle(exec.cuda_stream());
    MESHTRAIN_CUBLAS_CHECK(cublasGemmEx(h, cublas_op(tb), cublas_op(ta), N, M, K, &alpha, B, type,
                                        ldb, A, type, lda, &beta, C, type, ldc,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
#endif
#endif
  gemm_reference<T>(exec, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#define MESHTRAIN_INSTANTIATE_GEMM(T)                                                          \
  template void gemm<T>(const ExecSpace&, Trans, Trans, int, int, int, float, const T*, int,   \
                        const T*, int, float, T*, int);                                        \
  template void gemm_reference<T>(const ExecSpace&, Trans, Trans, int, int, int, float,        \
                                  const T*, int, const T*, int, float, T*, int);
MESHTRAIN_INSTANTIATE_GEMM(float)
MESHTRAIN_INSTANTIATE_GEMM(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GEMM(bf16)
MESHTRAIN_INSTANTIATE_GEMM(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GEMM

}  // namespace meshtrain::kernels
