// The emulated FP8 GEMM (kernels/gemm_fp8.hpp): decode, fp32 GEMM, scale epilogue.
#include "meshtrain/kernels/gemm/gemm_fp8.hpp"

#include "../common.hpp"

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

View1<float> decode_codes(const ExecSpace& exec, const Fp8Tensor& t, const char* what) {
  const std::size_t n = std::size_t(t.rows) * std::size_t(t.cols);
  detail::check_extent(t.data, n, "gemm_fp8_emulated", what);
  detail::check_extent(t.scale_inv, t.scale_count(), "gemm_fp8_emulated", what);
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
                       float alpha, const Fp8Tensor& A, const Fp8Tensor& B, float beta, T* C,
                       int ldc) {
  const Stored sa = stored(A), sb = stored(B);
  const int want_ar = ta == Trans::N ? M : K, want_ac = ta == Trans::N ? K : M;
  const int want_br = tb == Trans::N ? K : N, want_bc = tb == Trans::N ? N : K;
  MESHTRAIN_CHECK(sa.rows == want_ar && sa.cols == want_ac, "gemm_fp8_emulated: A is stored [",
                  sa.rows, ", ", sa.cols, "], op(A) must be [M=", M, ", K=", K, "] with ta=",
                  ta == Trans::N ? "N" : "T");
  MESHTRAIN_CHECK(sb.rows == want_br && sb.cols == want_bc, "gemm_fp8_emulated: B is stored [",
                  sb.rows, ", ", sb.cols, "], op(B) must be [K=", K, ", N=", N, "] with tb=",
                  tb == Trans::N ? "N" : "T");
  MESHTRAIN_CHECK(A.scaling == Fp8Scaling::tensorwise || (ta == Trans::N && !A.transposed),
                  "gemm_fp8_emulated: rowwise A scales rows of op(A); A must be stored [M, K] "
                  "(ta=N, not transposed)");
  MESHTRAIN_CHECK(B.scaling == Fp8Scaling::tensorwise || (tb == Trans::T && !B.transposed),
                  "gemm_fp8_emulated: rowwise B scales columns of op(B); B must be stored [N, K] "
                  "(tb=T, not transposed)");
  MESHTRAIN_CHECK(ldc >= N, "gemm_fp8_emulated: ldc=", ldc, " < N=", N);
  if (M == 0 || N == 0) return;

  const View1<float> a = decode_codes(exec, A, "A"), b = decode_codes(exec, B, "B");
  View1<float> acc = alloc<float>("gemm_fp8_acc", std::size_t(M) * std::size_t(N));
  gemm<float>(exec, ta, tb, M, N, K, 1.0f, a.data(), sa.cols, b.data(), sb.cols, 0.0f,
              acc.data(), N);

  const auto sinv_a = A.scale_inv, sinv_b = B.scale_inv;
  const bool row_a = A.scaling == Fp8Scaling::rowwise, col_b = B.scaling == Fp8Scaling::rowwise;
  const Index NN = N, LDC = ldc;
  Kokkos::parallel_for(
      "meshtrain::gemm_fp8_scale", Range(exec, 0, Index(M) * NN), KOKKOS_LAMBDA(Index i) {
        const Index m = i / NN, n = i % NN;
        const float s = alpha * sinv_a(row_a ? m : 0) * sinv_b(col_b ? n : 0);
        float v = s * acc(i);
        if (beta != 0.0f) v += beta * static_cast<float>(C[m * LDC + n]);
        C[m * LDC + n] = static_cast<T>(v);
      });
}

template <class T>
void gemm_fp8(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
              const Fp8Tensor& A, const Fp8Tensor& B, float beta, T* C, int ldc) {
  gemm_fp8_emulated<T>(exec, ta, tb, M, N, K, alpha, A, B, beta, C, ldc);
}

template void gemm_fp8<float>(const ExecSpace&, Trans, Trans, int, int, int, float,
                              const Fp8Tensor&, const Fp8Tensor&, float, float*, int);
#if MESHTRAIN_HAVE_BF16
template void gemm_fp8<bf16>(const ExecSpace&, Trans, Trans, int, int, int, float,
                             const Fp8Tensor&, const Fp8Tensor&, float, bf16*, int);
#endif
template void gemm_fp8_emulated<float>(const ExecSpace&, Trans, Trans, int, int, int, float,
                                       const Fp8Tensor&, const Fp8Tensor&, float, float*, int);
#if MESHTRAIN_HAVE_BF16
template void gemm_fp8_emulated<bf16>(const ExecSpace&, Trans, Trans, int, int, int, float,
                                      const Fp8Tensor&, const Fp8Tensor&, float, bf16*, int);
#endif

}  // namespace meshtrain::kernels
