// The FP8 GEMM (kernels/gemm/gemm_fp8.hpp): the dispatch to cuBLASLt's FP8 matmul on CUDA builds
// (gemm_lt_fp8.cpp), and the emulation: decode, fp32 GEMM, scale epilogue.
#include "meshtrain/kernels/gemm/gemm_fp8.hpp"

#include <atomic>
#include <type_traits>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#endif

#include "../common.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include "gemm_lt_fp8.hpp"
#endif

namespace meshtrain::kernels {

namespace {

using detail::Index;
using detail::Range;

// The stored matrix of an FP8 operand: [rows, cols] as its data holds it.
struct Stored {
  int rows, cols;
};
Stored stored(const Fp8Tensor& t) {
  return t.transposed ? Stored{t.cols, t.rows} : Stored{t.rows, t.cols};
}

// The contract's checks, before either path: shapes as stored against op(A), op(B), rowwise
// scales only where they follow op(A)'s rows and op(B)'s columns, and the extents of codes and
// scales (the cuBLASLt path reads them through raw pointers).
void check_fp8_gemm(const char* fn, Trans ta, Trans tb, int M, int N, int K, const Fp8Tensor& A,
                    const Fp8Tensor& B, int ldc, int ldd) {
  const Stored sa = stored(A), sb = stored(B);
  const int want_ar = ta == Trans::N ? M : K, want_ac = ta == Trans::N ? K : M;
  const int want_br = tb == Trans::N ? K : N, want_bc = tb == Trans::N ? N : K;
  MESHTRAIN_CHECK(sa.rows == want_ar && sa.cols == want_ac, fn, ": A is stored [", sa.rows, ", ",
                  sa.cols, "], op(A) must be [M=", M, ", K=", K, "] with ta=",
                  ta == Trans::N ? "N" : "T");
  MESHTRAIN_CHECK(sb.rows == want_br && sb.cols == want_bc, fn, ": B is stored [", sb.rows, ", ",
                  sb.cols, "], op(B) must be [K=", K, ", N=", N, "] with tb=",
                  tb == Trans::N ? "N" : "T");
  MESHTRAIN_CHECK(A.scaling == Fp8Scaling::tensorwise || (ta == Trans::N && !A.transposed), fn,
                  ": rowwise A scales rows of op(A); A must be stored [M, K] "
                  "(ta=N, not transposed)");
  MESHTRAIN_CHECK(B.scaling == Fp8Scaling::tensorwise || (tb == Trans::T && !B.transposed), fn,
                  ": rowwise B scales columns of op(B); B must be stored [N, K] "
                  "(tb=T, not transposed)");
  MESHTRAIN_CHECK(ldc >= N, fn, ": ldc=", ldc, " < N=", N);
  MESHTRAIN_CHECK(ldd >= N, fn, ": ldd=", ldd, " < N=", N);
  const auto extents = [fn](const Fp8Tensor& t, const char* what) {
    detail::check_extent(t.data, std::size_t(t.rows) * std::size_t(t.cols), fn, what);
    detail::check_extent(t.scale_inv, t.scale_count(), fn, what);
  };
  extents(A, "A");
  extents(B, "B");
}

// gemm_fp8 calls that cuBLASLt ran (gemm_fp8_cublaslt_calls).
std::atomic<int> cublaslt_calls{0};

#if defined(KOKKOS_ENABLE_CUDA)
cudaDataType_t lt_fp8_type(Fp8Format f) {
  return f == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// The call as cuBLASLt's FP8 matmul, where it serves it: the TN form, whose stored operands are
// both K-contiguous. That is ta = N (A stored [M, K]) and tb = T (B stored [N, K]), whatever the
// `transposed` flag says of how the stored matrix was cast (linear_fp8's weight is a transposed
// cast of [IC, OC], stored [OC, IC]: K-contiguous for tb = T). The other forms would need a
// transposed copy of an operand first; they run the emulation. Both operands rowwise or both
// tensorwise: cuBLASLt's outer-vector mode is for A and B together.
template <class T>
bool try_cublaslt(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
                  const Fp8Tensor& A, const Fp8Tensor& B, float beta, const T* C, int ldc, T* D,
                  int ldd, bool vary_m, const char** why) {
  if constexpr (!std::is_same_v<ExecSpace, Kokkos::Cuda>) {
    return false;
  } else {
    if (ta != Trans::N || tb != Trans::T) {
      *why = "not the TN form (both operands K-contiguous)";
      return false;
    }
    if (A.scaling != B.scaling) {
      *why = "one operand rowwise, the other tensorwise";
      return false;
    }
    constexpr bool f32 = std::is_same_v<T, float>;
#if MESHTRAIN_HAVE_BF16
    constexpr bool b16 = std::is_same_v<T, bf16>;
#else
    constexpr bool b16 = false;
#endif
    static_assert(f32 || b16, "gemm_fp8 is instantiated for float and bf16 outputs");
    const cudaDataType_t out = f32 ? CUDA_R_32F : CUDA_R_16BF;
    detail::LtFp8Call call{lt_fp8_type(A.format), lt_fp8_type(B.format), out,
                           A.scaling == Fp8Scaling::rowwise, M, N, K, alpha,
                           A.data.data(), K, A.scale_inv.data(),
                           B.data.data(), K, B.scale_inv.data(),
                           beta, C, ldc, D, ldd, vary_m};
    return detail::lt_matmul_fp8(exec, call, why);
  }
}

// An emulated FP8 GEMM on a GPU costs several times its bf16 GEMM (decode, fp32 GEMM, scale
// pass, three allocations): said on stderr once per shape and reason, so that a slow fp8 step
// names its cause in the log instead of only in a kernel timeline.
void say_emulated(Trans ta, Trans tb, int M, int N, int K, const Fp8Tensor& A,
                  const Fp8Tensor& B, const char* why) {
  static std::mutex mu;
  static std::set<std::string> said;
  char line[320];
  std::snprintf(line, sizeof line,
                "meshtrain: FP8 GEMM %c%c M=%d N=%d K=%d (A %s, B %s, %s) runs the emulation "
                "on the GPU: %s\n",
                ta == Trans::N ? 'N' : 'T', tb == Trans::N ? 'N' : 'T', M, N, K,
                fp8_format_name(A.format), fp8_format_name(B.format),
                fp8_scaling_name(A.scaling), why != nullptr ? why : "no reason given");
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert(line).second) std::fputs(line, stderr);
}
#endif

View1<float> decode_codes(const ExecSpace& exec, const Fp8Tensor& t, const char* what) {
  const std::size_t n = std::size_t(t.rows) * std::size_t(t.cols);  // extents: check_fp8_gemm
  View1<float> out = alloc<float>(std::string("gemm_fp8_") + what, n);
  auto q = t.data;
  const Fp8Format f = t.format;
  Kokkos::parallel_for(
      "meshtrain::gemm_fp8_decode", Range(exec, 0, Index(n)),
      KOKKOS_LAMBDA(Index i) { out(i) = fp8_decode(q(i), f); });
  return out;
}

}  // namespace

template <class T>
void gemm_fp8_emulated(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K,
                       float alpha, const Fp8Tensor& A, const Fp8Tensor& B, float beta,
                       const T* C, int ldc, T* D, int ldd) {
  check_fp8_gemm("gemm_fp8_emulated", ta, tb, M, N, K, A, B, ldc, ldd);
  if (M == 0 || N == 0) return;
  const Stored sa = stored(A), sb = stored(B);

  const View1<float> a = decode_codes(exec, A, "A"), b = decode_codes(exec, B, "B");
  View1<float> acc = alloc<float>("gemm_fp8_acc", std::size_t(M) * std::size_t(N));
  gemm<float>(exec, ta, tb, M, N, K, 1.0f, a.data(), sa.cols, b.data(), sb.cols, 0.0f,
              acc.data(), N);

  const auto sinv_a = A.scale_inv, sinv_b = B.scale_inv;
  const bool row_a = A.scaling == Fp8Scaling::rowwise, col_b = B.scaling == Fp8Scaling::rowwise;
  const Index NN = N, LDC = ldc, LDD = ldd;
  Kokkos::parallel_for(
      "meshtrain::gemm_fp8_scale", Range(exec, 0, Index(M) * NN), KOKKOS_LAMBDA(Index i) {
        const Index m = i / NN, n = i % NN;
        const float s = alpha * sinv_a(row_a ? m : 0) * sinv_b(col_b ? n : 0);
        float v = s * acc(i);
        if (beta != 0.0f) v += beta * static_cast<float>(C[m * LDC + n]);
        D[m * LDD + n] = static_cast<T>(v);
      });
}

namespace {

// gemm_fp8 and gemm_fp8_varying: cuBLASLt where it serves (a plan per shape, or per size bucket
// of M with vary_m), else the emulation.
template <class T>
void gemm_fp8_dispatch(const char* fn, const ExecSpace& exec, Trans ta, Trans tb, int M, int N,
                       int K, float alpha, const Fp8Tensor& A, const Fp8Tensor& B, float beta,
                       const T* C, int ldc, T* D, int ldd, [[maybe_unused]] bool vary_m) {
  check_fp8_gemm(fn, ta, tb, M, N, K, A, B, ldc, ldd);
  if (M == 0 || N == 0) return;
#if defined(KOKKOS_ENABLE_CUDA)
  const char* why = nullptr;
  if (try_cublaslt<T>(exec, ta, tb, M, N, K, alpha, A, B, beta, C, ldc, D, ldd, vary_m, &why)) {
    cublaslt_calls.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) say_emulated(ta, tb, M, N, K, A, B, why);
#endif
  gemm_fp8_emulated<T>(exec, ta, tb, M, N, K, alpha, A, B, beta, C, ldc, D, ldd);
}

}  // namespace

template <class T>
void gemm_fp8(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
              const Fp8Tensor& A, const Fp8Tensor& B, float beta, const T* C, int ldc, T* D,
              int ldd) {
  gemm_fp8_dispatch<T>("gemm_fp8", exec, ta, tb, M, N, K, alpha, A, B, beta, C, ldc, D, ldd,
                       false);
}

template <class T>
void gemm_fp8_varying(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
                      const Fp8Tensor& A, const Fp8Tensor& B, float beta, const T* C, int ldc,
                      T* D, int ldd) {
  gemm_fp8_dispatch<T>("gemm_fp8_varying", exec, ta, tb, M, N, K, alpha, A, B, beta, C, ldc, D,
                       ldd, true);
}

template <class T>
void gemm_fp8(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
              const Fp8Tensor& A, const Fp8Tensor& B, float beta, T* C, int ldc) {
  gemm_fp8<T>(exec, ta, tb, M, N, K, alpha, A, B, beta, C, ldc, C, ldc);
}

template <class T>
void gemm_fp8_emulated(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K,
                       float alpha, const Fp8Tensor& A, const Fp8Tensor& B, float beta, T* C,
                       int ldc) {
  gemm_fp8_emulated<T>(exec, ta, tb, M, N, K, alpha, A, B, beta, C, ldc, C, ldc);
}

int gemm_fp8_cublaslt_calls() { return cublaslt_calls.load(std::memory_order_relaxed); }

#define MESHTRAIN_INSTANTIATE_GEMM_FP8(T)                                                        \
  template void gemm_fp8<T>(const ExecSpace&, Trans, Trans, int, int, int, float,                \
                            const Fp8Tensor&, const Fp8Tensor&, float, T*, int);                 \
  template void gemm_fp8<T>(const ExecSpace&, Trans, Trans, int, int, int, float,                \
                            const Fp8Tensor&, const Fp8Tensor&, float, const T*, int, T*, int);  \
  template void gemm_fp8_varying<T>(const ExecSpace&, Trans, Trans, int, int, int, float,        \
                                    const Fp8Tensor&, const Fp8Tensor&, float, const T*, int, T*, \
                                    int);                                                        \
  template void gemm_fp8_emulated<T>(const ExecSpace&, Trans, Trans, int, int, int, float,       \
                                     const Fp8Tensor&, const Fp8Tensor&, float, T*, int);        \
  template void gemm_fp8_emulated<T>(const ExecSpace&, Trans, Trans, int, int, int, float,       \
                                     const Fp8Tensor&, const Fp8Tensor&, float, const T*, int,   \
                                     T*, int);
MESHTRAIN_INSTANTIATE_GEMM_FP8(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GEMM_FP8(bf16)
#endif
#undef MESHTRAIN_INSTANTIATE_GEMM_FP8

}  // namespace meshtrain::kernels
