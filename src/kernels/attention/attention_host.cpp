// Causal attention in host memory: FlashAttention's blocking (Dao et al. 2022), with CBLAS for
// the products. Same contract and formulas as attention.cpp; only lse is saved.
//
// Why a host path: the portable kernels of attention.cpp do one scalar dot product of length HS
// per (query, key) pair, a serial reduction that a CPU core cannot vectorise; on cpu-bench they
// took a third of the training step (perf/archive/journal.md). Here a block of kBlock query rows of
// one head is one GEMM against the keys it can see (0 .. end of the block), so the products run at
// BLAS speed and most of the masked upper triangle is never computed. The score buffer is
// kBlock x T (never T x T). Heads run one after another on the calling thread, like gemm's
// CBLAS calls; every dk/dv row is accumulated over query blocks in a fixed order, so the
// results are the same bits on every run.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "attention_host.hpp"
#include "meshtrain/kernels/workspace.hpp"
#include "../cblas.hpp"
#include "../common.hpp"

namespace meshtrain::kernels::detail {

namespace {

// Query rows per block: big enough for BLAS to be efficient, small enough that the causal mask
// skips most of the upper triangle (T = 128: 75% of the full score matrix is computed).
constexpr int kBlock = kAttentionHostBlock;  // kernels/workspace.hpp

// Row-major C[M,N] = alpha op(A) op(B) + beta C.
void blas(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void blas(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Pointers to one head's q, k, v (row stride ld = C + 2*Ckv; k and v are those of the kv head
// the query head reads) and its out rows (row stride C).
template <class P>
struct Head {
  P q, k, v;
};

}  // namespace

template <class T>
void attention_forward_host(const ExecSpace& exec, View1<T> out, View1<float> lse,
                            View1<const T> qkv, int B, int Tlen, int NH, int HS, int NKV) {
  using Acc = acc_t<T>;
  kc::fence(exec, "meshtrain::attention_forward: before host BLAS");
  Kokkos::Profiling::pushRegion("meshtrain::attention_forward");
  const int C = NH * HS, Ckv = NKV * HS, C3 = C + 2 * Ckv, G = NH / NKV;
  const T scale = T(1) / std::sqrt(T(HS));
  View1<T> sbuf = alloc<T>("attention_forward_scores", std::size_t(kBlock) * Tlen);
  T* S = sbuf.data();
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const T* row0 = qkv.data() + std::size_t(b) * Tlen * C3;
      const Head<const T*> hd{row0 + h * HS, row0 + C + (h / G) * HS,
                              row0 + C + Ckv + (h / G) * HS};
      for (int i0 = 0; i0 < Tlen; i0 += kBlock) {
        const int nq = std::min(kBlock, Tlen - i0), e = i0 + nq;  // keys 0 .. e-1 are visible
        // S = scale Q K^T, [nq, e]
        blas(false, true, nq, e, HS, scale, hd.q + std::size_t(i0) * C3, C3, hd.k, C3, T(0), S, e);
        for (int r = 0; r < nq; ++r) {
          const int i = i0 + r;
          T* row = S + std::size_t(r) * e;
          Acc mx = row[0];
          for (int j = 1; j <= i; ++j) mx = std::max<Acc>(mx, row[j]);
          Acc sum = 0;
          for (int j = 0; j <= i; ++j) {
            const Acc p = std::exp(Acc(row[j]) - mx);
            row[j] = static_cast<T>(p);
            sum += p;
          }
          const Acc inv = Acc(1) / sum;
          for (int j = 0; j <= i; ++j) row[j] = static_cast<T>(Acc(row[j]) * inv);
          for (int j = i + 1; j < e; ++j) row[j] = T(0);
          lse.data()[(std::size_t(b) * NH + h) * Tlen + i] = static_cast<float>(mx + std::log(sum));
        }
        // O = P V, [nq, HS]
        blas(false, false, nq, HS, e, T(1), S, e, hd.v, C3, T(0),
             out.data() + (std::size_t(b) * Tlen + i0) * C + h * HS, C);
      }
    }
  Kokkos::Profiling::popRegion();
}

// With s_ij = scale q_i.k_j, P_ij = exp(s_ij - lse_i), dP = dO V^T, D_i = dO_i.O_i,
// dS = P (dP - D):  dq = scale dS K,  dk = scale dS^T Q,  dv = P^T dO. A kv head's dk and dv
// sum over its G query heads, which come one after another in h (a fixed order).
template <class T>
void attention_backward_host(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                             View1<const T> qkv, View1<const T> out, View1<const float> lse,
                             int B, int Tlen, int NH, int HS, int NKV) {
  using Acc = acc_t<T>;
  kc::fence(exec, "meshtrain::attention_backward: before host BLAS");
  Kokkos::Profiling::pushRegion("meshtrain::attention_backward");
  const int C = NH * HS, Ckv = NKV * HS, C3 = C + 2 * Ckv, G = NH / NKV;
  const T scale = T(1) / std::sqrt(T(HS));
  View1<T> buf = alloc<T>("attention_backward_scores", 2 * std::size_t(kBlock) * Tlen);
  T* P = buf.data();
  T* dS = P + std::size_t(kBlock) * Tlen;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const std::size_t row0 = std::size_t(b) * Tlen * C3;
      const std::size_t qo = row0 + std::size_t(h) * HS, ko = row0 + C + std::size_t(h / G) * HS,
                        vo = ko + Ckv;
      const Head<const T*> hd{qkv.data() + qo, qkv.data() + ko, qkv.data() + vo};
      const Head<T*> dh{dqkv.data() + qo, dqkv.data() + ko, dqkv.data() + vo};
      const T* dO = dout.data() + std::size_t(b) * Tlen * C + h * HS;
      const T* O = out.data() + std::size_t(b) * Tlen * C + h * HS;
      const float* L = lse.data() + (std::size_t(b) * NH + h) * Tlen;
      // dk and dv are sums over query blocks and the group's query heads: start from zero at
      // the group's first head.
      if (h % G == 0)
        for (int j = 0; j < Tlen; ++j)
        for (int d = 0; d < HS; ++d) dh.k[std::size_t(j) * C3 + d] = dh.v[std::size_t(j) * C3 + d] = T(0);
      for (int i0 = 0; i0 < Tlen; i0 += kBlock) {
        const int nq = std::min(kBlock, Tlen - i0), e = i0 + nq;
        const T* Q = hd.q + std::size_t(i0) * C3;
        const T* dOb = dO + std::size_t(i0) * C;
        blas(false, true, nq, e, HS, scale, Q, C3, hd.k, C3, T(0), P, e);     // S
        blas(false, true, nq, e, HS, T(1), dOb, C, hd.v, C3, T(0), dS, e);   // dP
        for (int r = 0; r < nq; ++r) {
          const int i = i0 + r;
          T* prow = P + std::size_t(r) * e;
          T* drow = dS + std::size_t(r) * e;
          Acc Di = 0;
          for (int d = 0; d < HS; ++d)
            Di += Acc(dOb[std::size_t(r) * C + d]) * Acc(O[std::size_t(i) * C + d]);
          const Acc li = L[i];
          for (int j = 0; j <= i; ++j) {
            const Acc p = std::exp(Acc(prow[j]) - li);
            prow[j] = static_cast<T>(p);
            drow[j] = static_cast<T>(p * (Acc(drow[j]) - Di));
          }
          for (int j = i + 1; j < e; ++j) prow[j] = drow[j] = T(0);
        }
        blas(true, false, e, HS, nq, T(1), P, e, dOb, C, T(1), dh.v, C3);               // dv +=
        blas(false, false, nq, HS, e, scale, dS, e, hd.k, C3, T(0),
             dh.q + std::size_t(i0) * C3, C3);                                            // dq
        blas(true, false, e, HS, nq, scale, dS, e, Q, C3, T(1), dh.k, C3);               // dk +=
      }
    }
  Kokkos::Profiling::popRegion();
}

#define MESHTRAIN_INSTANTIATE_ATTENTION_HOST(T)                                                 \
  template void attention_forward_host<T>(const ExecSpace&, View1<T>, View1<float>,             \
                                          View1<const T>, int, int, int, int, int);            \
  template void attention_backward_host<T>(const ExecSpace&, View1<T>, View1<const T>,          \
                                           View1<const T>, View1<const T>, View1<const float>, \
                                           int, int, int, int, int);
MESHTRAIN_INSTANTIATE_ATTENTION_HOST(float)
MESHTRAIN_INSTANTIATE_ATTENTION_HOST(double)
#undef MESHTRAIN_INSTANTIATE_ATTENTION_HOST

}  // namespace meshtrain::kernels::detail
