// GEMMs with fused epilogues (gemm.hpp): gemm_ex, its Kokkos reference, and gemm_dbias.
//
// CUDA with float/bf16/fp16: one cuBLASLt matmul with the epilogue fused (gemm_lt.cpp), where
// cuBLASLt supports the case. Everything else (host builds, double, cases cuBLASLt refuses):
// gemm() into D, then one Kokkos pass applying the epilogue, or for gemm_dbias gemm() plus a
// column sum. Both paths compute the epilogue in fp32 (double for double) from the same
// formulas (gelu_math.hpp); the fallback rounds the GEMM result to T once more in between.
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "../common.hpp"
#include "../gelu_math.hpp"
#include "gemm_detail.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include "column_sums_cuda.hpp"
#include "gemm_lt.hpp"
#endif

namespace meshtrain::kernels {

namespace {

using detail::acc;
using detail::Index;

// Per kind (Epilogue as int, 4 = gemm_dbias): calls served fused / by the fallback.
std::atomic<std::uint64_t> g_fused[5], g_fallback[5];

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::bias: return "bias";
    case Epilogue::gelu_bias: return "gelu_bias";
    case Epilogue::dgelu: return "dgelu";
    default: return "none";
  }
}

template <class T>
void check_gemm_ex(const char* fn, Trans ta, Trans tb, int M, int N, int K, const T* A, int lda,
                   const T* B, int ldb, float beta, const T* C, int ldc, const T* D, int ldd,
                   const GemmEpilogue<T>& ep) {
  detail::check_gemm(fn, ta, tb, M, N, K, A, lda, B, ldb, D, ldd);
  if (M == 0 || N == 0) return;
  if (beta != 0.0f) {
    MESHTRAIN_CHECK(C != nullptr, fn, ": C is null with beta=", beta);
    MESHTRAIN_CHECK(ldc >= N, fn, ": ldc=", ldc, " < row width N=", N, " of C");
    MESHTRAIN_CHECK(C != D || ldc == ldd, fn, ": C == D needs ldc == ldd (", ldc, " vs ", ldd,
                    ")");
  }
  if (ep.kind == Epilogue::bias)
    MESHTRAIN_CHECK(ep.bias != nullptr, fn, ": epilogue bias without a bias pointer");
  if (ep.kind == Epilogue::gelu_bias || ep.kind == Epilogue::dgelu) {
    MESHTRAIN_CHECK(ep.aux != nullptr, fn, ": epilogue ", epilogue_name(ep.kind),
                    " needs aux (the pre-GELU values)");
    MESHTRAIN_CHECK(ep.ldaux >= N, fn, ": ldaux=", ep.ldaux, " < row width N=", N);
    MESHTRAIN_CHECK(ep.aux != D, fn, ": aux must not be D (", epilogue_name(ep.kind), ")");
  }
  if (ep.kind == Epilogue::dgelu)
    MESHTRAIN_CHECK(beta == 0.0f, fn, ": epilogue dgelu takes beta=0, got ", beta);
  if (ep.dbias != nullptr)
    MESHTRAIN_CHECK(ep.kind == Epilogue::dgelu, fn, ": a fused bias gradient (dbias) needs the "
                    "dgelu epilogue, not ", epilogue_name(ep.kind));
}

// x -> D's value for one element (i, j); stores aux (gelu_bias) or reads it (dgelu) at ia.
// Shared by the reference and the fallback so that they apply the same epilogue.
template <class Acc, class T>
KOKKOS_INLINE_FUNCTION Acc finish(Epilogue kind, Acc x, const T* bias, T* aux, Index j,
                                  Index ia) {
  switch (kind) {
    case Epilogue::bias: return x + acc(bias[j]);
    case Epilogue::gelu_bias:
      if (bias) x += acc(bias[j]);
      aux[ia] = static_cast<T>(x);
      return detail::gelu_value(x);
    case Epilogue::dgelu: return x * detail::gelu_grad(acc(aux[ia]));
    default: return x;
  }
}

// The fallback's second pass: D = finish(D + beta C). One team per row, threads over its
// columns: contiguous on a CPU core and coalesced on a GPU, no 64-bit division per element.
template <class T>
void epilogue_pass(const ExecSpace& exec, int M, int N, float beta, const T* C, int ldc, T* D,
                   int ldd, const GemmEpilogue<T>& ep) {
  using Acc = detail::acc_t<T>;
  const Epilogue kind = ep.kind;
  const T* bias = ep.bias;
  T* aux = ep.aux;
  const Index sc = ldc, sd = ldd, sa = ep.ldaux;
  const Acc be = beta;
  const std::string label =
      std::string("meshtrain::epilogue_") + (beta != 0.0f ? "c_" : "") + epilogue_name(kind);
  if constexpr (kDeviceIsHost && std::is_same_v<T, float>) {
    if (kind == Epilogue::gelu_bias || kind == Epilogue::dgelu) {
      // Host fp32 GELU: plain row loops with the vectorisable exp, as gelu.cpp's host loops
      // (the exp dominates; std::exp per element would cost several times more).
      kc::fence(exec, "meshtrain::epilogue: host loop");
      Kokkos::Profiling::pushRegion(label);
      for (Index i = 0; i < M; ++i) {
        float* __restrict d = D + i * sd;
        float* __restrict a = aux + i * sa;
        const float* __restrict c = C ? C + i * sc : nullptr;
        if (kind == Epilogue::gelu_bias) {
          for (int j = 0; j < N; ++j) {
            const float x = d[j] + (be != 0.0f ? be * c[j] : 0.0f) + (bias ? bias[j] : 0.0f);
            a[j] = x;
            d[j] = detail::gelu_value_host(x);
          }
        } else {
          for (int j = 0; j < N; ++j) d[j] = d[j] * detail::gelu_grad_host(a[j]);
        }
      }
      Kokkos::Profiling::popRegion();
      return;
    }
  }
  Kokkos::parallel_for(
      label, detail::Team(exec, M, Kokkos::AUTO), KOKKOS_LAMBDA(const detail::Member& m) {
        const Index i = m.league_rank();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, N), [&](int j) {
          Acc x = acc(D[i * sd + j]);
          if (be != Acc(0)) x += be * acc(C[i * sc + j]);
          D[i * sd + j] = static_cast<T>(finish(kind, x, bias, aux, Index(j), i * sa + j));
        });
      });
}

template <class T>
void gemm_ex_fallback(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K,
                      float alpha, const T* A, int lda, const T* B, int ldb, float beta,
                      const T* C, int ldc, T* D, int ldd, const GemmEpilogue<T>& ep) {
  // With C == D the GEMM accumulates in place; a separate C joins in the epilogue pass instead
  // (copying it into D first would cost the same pass and one more).
  const bool in_place = beta != 0.0f && C == D;
  gemm<T>(exec, ta, tb, M, N, K, alpha, A, lda, B, ldb, in_place ? beta : 0.0f, D, ldd);
  const float beta_c = in_place ? 0.0f : beta;
  if (ep.kind == Epilogue::none && beta_c == 0.0f) return;
  epilogue_pass<T>(exec, M, N, beta_c, C, ldc, D, ldd, ep);
}

// dbias[n] += sum_k B[k][n] over K rows of row stride ldb.
template <class T>
void add_column_sums(const ExecSpace& exec, int K, int N, const T* B, int ldb, T* dbias) {
  using Acc = detail::acc_t<T>;
  const Index sb = ldb;
  if constexpr (!kDeviceIsHost) {
    // GPU: two-stage column sum (common.hpp), deterministic, enough threads to fill the GPU.
    detail::column_sums<Acc, 1>(
        exec, "meshtrain::dbias_column_sums", Index(K), Index(N), 0,
        KOKKOS_LAMBDA(Index k, Index n, Acc* v) { v[0] += acc(B[k * sb + n]); },
        KOKKOS_LAMBDA(Index n, const Acc* v) {
          dbias[n] = static_cast<T>(acc(dbias[n]) + v[0]);
        });
    return;
  }
  // Host: each column's rows summed in order by one thread per kCols columns, so the inner loop
  // runs over contiguous columns and vectorises instead of striding down one column.
  constexpr int kCols = 16;
  const int blocks = (N + kCols - 1) / kCols;
  Kokkos::parallel_for(
      "meshtrain::dbias_column_sums", detail::Range(exec, 0, blocks),
      KOKKOS_LAMBDA(Index blk) {
        const Index n0 = blk * kCols;
        const int w = N - n0 < kCols ? int(N - n0) : kCols;
        Acc s[kCols] = {};
        if (w == kCols) {  // full block: a fixed-width inner loop
          for (Index k = 0; k < K; ++k)
            for (int u = 0; u < kCols; ++u) s[u] += acc(B[k * sb + n0 + u]);
        } else {
          for (Index k = 0; k < K; ++k)
            for (int u = 0; u < w; ++u) s[u] += acc(B[k * sb + n0 + u]);
        }
        for (int u = 0; u < w; ++u) dbias[n0 + u] = static_cast<T>(acc(dbias[n0 + u]) + s[u]);
      });
}

#if defined(KOKKOS_ENABLE_CUDA)
// Element types that go to cuBLASLt here (fp32 compute for all; double stays on gemm()).
template <class T>
cudaDataType_t lt_data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
#if MESHTRAIN_HAVE_BF16
  if constexpr (std::is_same_v<T, bf16>) return CUDA_R_16BF;
  if constexpr (std::is_same_v<T, fp16>) return CUDA_R_16F;
#endif
  return CUDA_R_64F;  // not reached: callers check kLtType
}
template <class T>
inline constexpr bool kLtType = std::is_same_v<T, float>
#if MESHTRAIN_HAVE_BF16
                                || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>
#endif
    ;

// "meshtrain::gemm NT 16384x2304x768 gelu_bias": perf/bench/bench_train_step sums the regions named
// "meshtrain::gemm*" as GEMM time, and a fused epilogue is part of its GEMM.
std::string region_label(Trans ta, Trans tb, int M, int N, int K, const char* what) {
  return std::string("meshtrain::gemm ") + (ta == Trans::N ? "N" : "T") +
         (tb == Trans::N ? "N" : "T") + " " + std::to_string(M) + "x" + std::to_string(N) + "x" +
         std::to_string(K) + " " + what;
}
#endif

#if defined(KOKKOS_ENABLE_CUDA)
// gemm_dbias on CUDA has two cuBLAS forms, and which is faster depends on the shape: the
// bias-gradient epilogue (BGRADA) fuses the column sums but limits cuBLASLt to the kernels
// that support it (no split-K), which the long-K weight gradients want; the split form runs
// the weight gradient as a plain tuned cuBLASLt GEMM and dbias += ones^T B as a cuBLAS GEMV
// (one more read of B). The first call of a shape times both into scratch outputs and keeps
// the faster (g_dbias_split); both are deterministic.
struct DbiasKey {
  int type, ta, M, N, K, lda, ldb, ldc;
  bool beta;
  auto tie() const { return std::tie(type, ta, M, N, K, lda, ldb, ldc, beta); }
  bool operator<(const DbiasKey& o) const { return tie() < o.tie(); }
};
std::map<DbiasKey, bool> g_dbias_split;
std::mutex g_dbias_mutex;
#endif
std::atomic<int> g_dbias_form{int(DbiasForm::timed)};
#if defined(KOKKOS_ENABLE_CUDA)

// A device vector of at least n ones of type T, kept for the run.
template <class T>
const T* device_ones(const ExecSpace& exec, std::size_t n) {
  static View1<T> ones;
  static bool hooked = false;
  if (!hooked) {
    Kokkos::push_finalize_hook([] {
      ones = View1<T>();
      hooked = false;
    });
    hooked = true;
  }
  if (ones.extent(0) < n) {
    ones =
        View1<T>(Kokkos::view_alloc("meshtrain::gemm_dbias_ones", Kokkos::WithoutInitializing), n);
    Kokkos::deep_copy(exec, ones, T(1.0f));
  }
  return ones.data();
}

// The weight-gradient GEMM D = alpha op(A) B + beta C (B not transposed, D laid out as C) with
// the given epilogue: both gemm_dbias forms issue it.
template <class T>
detail::LtCall weight_grad_call(Trans ta, int M, int N, int K, float alpha, const T* A, int lda,
                                const T* B, int ldb, float beta, const T* C, int ldc, T* D,
                                detail::LtEpilogue epilogue, const T* bias) {
  return detail::LtCall{.type = lt_data_type<T>(), .ta = ta, .tb = Trans::N, .M = M, .N = N,
                        .K = K, .alpha = alpha, .A = A, .lda = lda, .B = B, .ldb = ldb,
                        .beta = beta, .C = C, .ldc = ldc, .D = D, .ldd = ldc,
                        .epilogue = epilogue, .bias = bias, .aux = nullptr, .ldaux = 0};
}

// D = alpha op(A) B + beta C with the bias gradient of B fused (BGRADA into the scratch, then
// added to dbias).
template <class T>
bool dbias_fused(const ExecSpace& exec, Trans ta, int M, int N, int K, float alpha, const T* A,
                 int lda, const T* B, int ldb, float beta, const T* C, int ldc, T* D, T* dbias) {
  T* part = static_cast<T*>(detail::lt_bias_scratch(std::size_t(N) * sizeof(T)));
  const detail::LtCall call =
      weight_grad_call<T>(ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, D,
                          detail::LtEpilogue::bgrad, part);
  if (!detail::lt_matmul(exec, call)) return false;
  using Acc = detail::acc_t<T>;
  Kokkos::parallel_for(
      "meshtrain::dbias_add", detail::Range(exec, 0, N),
      KOKKOS_LAMBDA(Index n) { dbias[n] = static_cast<T>(acc(dbias[n]) + acc(part[n])); });
  return true;
}

// The same as a plain cuBLASLt GEMM and dbias += the column sums of B (column_sums_cuda.cpp, or
// dbias[1, N] += ones[1, K] B[K, N] through cublasGemmEx).
template <class T>
bool dbias_split(const ExecSpace& exec, Trans ta, int M, int N, int K, float alpha, const T* A,
                 int lda, const T* B, int ldb, float beta, const T* C, int ldc, T* D, T* dbias) {
  const detail::LtCall call = weight_grad_call<T>(ta, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                                  ldc, D, detail::LtEpilogue::none, nullptr);
  if (!detail::lt_matmul(exec, call)) return false;
  // Our column-sum kernel where its 16-byte loads fit, else cuBLAS's GEMV.
  if (!detail::column_sums_add_cuda<T>(exec, K, N, B, ldb, dbias))
    gemm<T>(exec, Trans::N, Trans::N, 1, N, K, 1.0f, device_ones<T>(exec, std::size_t(K)), K, B,
            ldb, 1.0f, dbias, N);
  return true;
}

// Whether the split form is faster than the fused one: both run 4 times on the caller's scratch
// (the first a warm-up), timed with events on exec's stream; a form that cannot run (returns
// false) loses. One synchronisation per run, on the first call of a shape only.
template <class Fused, class Split>
bool split_is_faster(const ExecSpace& exec, const Fused& fused, const Split& split) {
  cudaEvent_t ev[2];
  for (auto& e : ev) MESHTRAIN_CUDA_CHECK(cudaEventCreate(&e));
  float ms[2] = {0, 0};
  bool ok[2] = {true, true};
  for (int form = 0; form < 2; ++form)
    for (int rep = 0; rep < 4 && ok[form]; ++rep) {
      MESHTRAIN_CUDA_CHECK(cudaEventRecord(ev[0], exec.cuda_stream()));
      ok[form] = form == 0 ? fused() : split();
      MESHTRAIN_CUDA_CHECK(cudaEventRecord(ev[1], exec.cuda_stream()));
      MESHTRAIN_CUDA_CHECK(cudaEventSynchronize(ev[1]));
      float t = 0;
      MESHTRAIN_CUDA_CHECK(cudaEventElapsedTime(&t, ev[0], ev[1]));
      if (rep > 0) ms[form] += t;
    }
  for (auto& e : ev) cudaEventDestroy(e);
  if (!ok[0]) return ok[1];
  return ok[1] && ms[1] < ms[0];
}

// Times both forms on this call's operands, writing only scratch (D and dbias), 3 runs each
// after a warm-up. One synchronisation, on the first call of a shape.
template <class T>
bool dbias_split_is_faster(const ExecSpace& exec, Trans ta, int M, int N, int K, float alpha,
                           const T* A, int lda, const T* B, int ldb, float beta, const T* C,
                           int ldc) {
  const std::size_t d_elems = std::size_t(M) * ldc;
  void* raw = nullptr;
  MESHTRAIN_CUDA_CHECK(cudaMalloc(&raw, (d_elems + std::size_t(N) + 128) * sizeof(T)));
  T* d = static_cast<T*>(raw);
  T* db = d + (d_elems + 127) / 128 * 128;
  MESHTRAIN_CUDA_CHECK(
      cudaMemsetAsync(raw, 0, (d_elems + std::size_t(N) + 128) * sizeof(T), exec.cuda_stream()));
  const T* cin = beta != 0.0f ? C : d;
  const bool split = split_is_faster(
      exec,
      [&] { return dbias_fused<T>(exec, ta, M, N, K, alpha, A, lda, B, ldb, beta, cin, ldc, d, db); },
      [&] { return dbias_split<T>(exec, ta, M, N, K, alpha, A, lda, B, ldb, beta, cin, ldc, d, db); });
  MESHTRAIN_CUDA_CHECK(cudaFree(raw));
  return split;
}

// gemm_ex's dgelu with the bias gradient of its result (ep.dbias): DGELU_BGRAD into the bias
// scratch, then added into dbias; or the dgelu GEMM and our column sums of D. As for gemm_dbias,
// the first call of a shape times both (writing only scratch) and keeps the faster.
template <class T>
bool dgelu_dbias_fused(const ExecSpace& exec, detail::LtCall call, T* dbias) {
  T* part = static_cast<T*>(detail::lt_bias_scratch(std::size_t(call.N) * sizeof(T)));
  call.epilogue = detail::LtEpilogue::dgelu_bgrad;
  call.bias = part;
  if (!detail::lt_matmul(exec, call)) return false;
  using Acc = detail::acc_t<T>;
  Kokkos::parallel_for(
      "meshtrain::dbias_add", detail::Range(exec, 0, call.N),
      KOKKOS_LAMBDA(Index n) { dbias[n] = static_cast<T>(acc(dbias[n]) + acc(part[n])); });
  return true;
}

template <class T>
bool dgelu_dbias_split(const ExecSpace& exec, detail::LtCall call, T* dbias) {
  call.epilogue = detail::LtEpilogue::dgelu;
  call.bias = nullptr;
  if (!detail::lt_matmul(exec, call)) return false;
  const T* D = static_cast<const T*>(call.D);
  if (!detail::column_sums_add_cuda<T>(exec, call.M, call.N, D, call.ldd, dbias))
    add_column_sums<T>(exec, call.M, call.N, D, call.ldd, dbias);
  return true;
}

std::map<DbiasKey, bool> g_dgelu_dbias_split;

template <class T>
bool dgelu_dbias_split_is_faster(const ExecSpace& exec, detail::LtCall call) {
  const std::size_t d_elems = std::size_t(call.M) * call.ldd;
  void* raw = nullptr;
  MESHTRAIN_CUDA_CHECK(cudaMalloc(&raw, (d_elems + std::size_t(call.N) + 128) * sizeof(T)));
  MESHTRAIN_CUDA_CHECK(cudaMemsetAsync(raw, 0, (d_elems + std::size_t(call.N) + 128) * sizeof(T),
                                       exec.cuda_stream()));
  call.D = raw;  // the caller's D and dbias stay untouched; aux and the operands are only read
  T* db = static_cast<T*>(raw) + (d_elems + 127) / 128 * 128;
  const bool split = split_is_faster(exec, [&] { return dgelu_dbias_fused<T>(exec, call, db); },
                                     [&] { return dgelu_dbias_split<T>(exec, call, db); });
  MESHTRAIN_CUDA_CHECK(cudaFree(raw));
  return split;
}
#endif

}  // namespace

void set_gemm_dbias_form(DbiasForm form) { g_dbias_form = int(form); }

GemmExCounts gemm_ex_counts() {
  GemmExCounts c;
  for (int i = 0; i < 5; ++i) {
    c.fused[i] = g_fused[i].load();
    c.fallback[i] = g_fallback[i].load();
  }
  return c;
}

template <class T>
void gemm_ex_reference(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K,
                       float alpha, const T* A, int lda, const T* B, int ldb, float beta,
                       const T* C, int ldc, T* D, int ldd, const GemmEpilogue<T>& ep) {
  using Acc = detail::acc_t<T>;
  check_gemm_ex("gemm_ex_reference", ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, D, ldd, ep);
  if (M == 0 || N == 0) return;
  const bool a_n = ta == Trans::N, b_n = tb == Trans::N;
  const Index sa = lda, sb = ldb, sc = ldc, sd = ldd, sx = ep.ldaux;
  const Acc al = alpha, be = beta;
  const Epilogue kind = ep.kind;
  const T* bias = ep.bias;
  T* aux = ep.aux;
  // One thread per element, K-loop inside, epilogue in registers: the simplest correct form.
  Kokkos::parallel_for(
      "meshtrain::gemm_ex_reference", detail::Range(exec, 0, Index(M) * N),
      KOKKOS_LAMBDA(Index idx) {
        const Index i = idx / N, j = idx % N;
        Acc s = 0;
        for (Index k = 0; k < K; ++k)
          s += acc(a_n ? A[i * sa + k] : A[k * sa + i]) * acc(b_n ? B[k * sb + j] : B[j * sb + k]);
        Acc x = al * s;
        if (be != Acc(0)) x += be * acc(C[i * sc + j]);
        D[i * sd + j] = static_cast<T>(finish(kind, x, bias, aux, j, i * sx + j));
      });
  if (ep.dbias) add_column_sums<T>(exec, M, N, D, ldd, ep.dbias);
}

template <class T>
void gemm_ex(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
             const T* A, int lda, const T* B, int ldb, float beta, const T* C, int ldc, T* D,
             int ldd, const GemmEpilogue<T>& ep) {
  check_gemm_ex("gemm_ex", ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, D, ldd, ep);
  if (M == 0 || N == 0) return;
  const int kind = static_cast<int>(ep.kind);
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda> && kLtType<T>) {
    detail::LtEpilogue e = detail::LtEpilogue::none;
    switch (ep.kind) {
      case Epilogue::bias: e = detail::LtEpilogue::bias; break;
      case Epilogue::gelu_bias:
        e = ep.bias ? detail::LtEpilogue::gelu_aux_bias : detail::LtEpilogue::gelu_aux;
        break;
      case Epilogue::dgelu: e = detail::LtEpilogue::dgelu; break;
      default: break;
    }
    const detail::ToolRegion region(
        [&] { return region_label(ta, tb, M, N, K, ep.dbias ? "dgelu dbias" : epilogue_name(ep.kind)); });
    const detail::LtCall call{.type = lt_data_type<T>(), .ta = ta, .tb = tb, .M = M, .N = N,
                              .K = K, .alpha = alpha, .A = A, .lda = lda, .B = B, .ldb = ldb,
                              .beta = beta, .C = C, .ldc = ldc, .D = D, .ldd = ldd,
                              .epilogue = e, .bias = ep.bias, .aux = ep.aux,
                              .ldaux = ep.ldaux};
    if (ep.dbias != nullptr) {
      const DbiasKey key{int(lt_data_type<T>()), int(ta), M, N, K, lda, ldb, ldd, false};
      bool split = false, known = false;
      {
        std::lock_guard<std::mutex> lock(g_dbias_mutex);
        auto it = g_dgelu_dbias_split.find(key);
        if (it != g_dgelu_dbias_split.end()) known = true, split = it->second;
      }
      if (!known) {
        split = dgelu_dbias_split_is_faster<T>(exec, call);
        std::lock_guard<std::mutex> lock(g_dbias_mutex);
        g_dgelu_dbias_split[key] = split;
      }
      if (split ? dgelu_dbias_split<T>(exec, call, ep.dbias)
                : dgelu_dbias_fused<T>(exec, call, ep.dbias)) {
        ++g_fused[kind];
        return;
      }
    } else if (detail::lt_matmul(exec, call)) {
      ++g_fused[kind];
      return;
    }
  }
#endif
  ++g_fallback[kind];
  gemm_ex_fallback<T>(exec, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, D, ldd, ep);
  if (ep.dbias) add_column_sums<T>(exec, M, N, D, ldd, ep.dbias);
}

template <class T>
void gemm_dbias(const ExecSpace& exec, Trans ta, int M, int N, int K, float alpha, const T* A,
                int lda, const T* B, int ldb, float beta, T* C, int ldc, T* dbias) {
  detail::check_gemm("gemm_dbias", ta, Trans::N, M, N, K, A, lda, B, ldb, C, ldc);
  if (N == 0) return;
  MESHTRAIN_CHECK(dbias != nullptr, "gemm_dbias: dbias is null for N=", N);
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda> && kLtType<T>) {
    const DbiasKey key{int(lt_data_type<T>()), int(ta), M, N, K, lda, ldb, ldc, beta != 0.0f};
    bool split = g_dbias_form.load() == int(DbiasForm::split);
    bool known = g_dbias_form.load() != int(DbiasForm::timed);
    if (!known) {
      std::lock_guard<std::mutex> lock(g_dbias_mutex);
      auto it = g_dbias_split.find(key);
      if (it != g_dbias_split.end()) {
        known = true;
        split = it->second;
      }
    }
    if (!known) {
      split = dbias_split_is_faster<T>(exec, ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      std::lock_guard<std::mutex> lock(g_dbias_mutex);
      g_dbias_split[key] = split;
    }
    const detail::ToolRegion region([&] {
      return region_label(ta, Trans::N, M, N, K, split ? "dbias (gemm + column sums)" : "dbias");
    });
    if (split ? dbias_split<T>(exec, ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, C, dbias)
              : dbias_fused<T>(exec, ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, C, dbias)) {
      ++g_fused[4];
      return;
    }
  }
#endif
  ++g_fallback[4];
  if (M > 0) gemm<T>(exec, ta, Trans::N, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  add_column_sums<T>(exec, K, N, B, ldb, dbias);
}

template <class T>
void column_sums_add(const ExecSpace& exec, int K, int N, const T* B, int ldb, T* dbias) {
  if (K > 0 && N > 0) add_column_sums<T>(exec, K, N, B, ldb, dbias);
}

#define MESHTRAIN_INSTANTIATE_GEMM_EX(T)                                                        \
  template void column_sums_add<T>(const ExecSpace&, int, int, const T*, int, T*);              \
  template void gemm_ex<T>(const ExecSpace&, Trans, Trans, int, int, int, float, const T*, int, \
                           const T*, int, float, const T*, int, T*, int,                       \
                           const GemmEpilogue<T>&);                                             \
  template void gemm_ex_reference<T>(const ExecSpace&, Trans, Trans, int, int, int, float,      \
                                     const T*, int, const T*, int, float, const T*, int, T*,    \
                                     int, const GemmEpilogue<T>&);                              \
  template void gemm_dbias<T>(const ExecSpace&, Trans, int, int, int, float, const T*, int,     \
                              const T*, int, float, T*, int, T*);
MESHTRAIN_INSTANTIATE_GEMM_EX(float)
MESHTRAIN_INSTANTIATE_GEMM_EX(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GEMM_EX(bf16)
MESHTRAIN_INSTANTIATE_GEMM_EX(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GEMM_EX

}  // namespace meshtrain::kernels
