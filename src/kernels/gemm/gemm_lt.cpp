// cuBLASLt path of gemm_ex / gemm_dbias (CUDA builds; empty otherwise).
//
// Row-major -> column-major. cuBLASLt is column-major, and a row-major matrix read column-major
// is its transpose: row-major D = op(A) op(B) is column-major D^T = op(B)^T op(A)^T. cuBLASLt
// therefore gets our B as its "A" (with op tb), our A as its "B" (with op ta), and m = N, n = M,
// k = K; its D has N rows (our columns) and M columns (our rows), ld = our row strides. So:
//  * the bias vector, whose length cuBLASLt requires to be D's rows, is our [N] bias added to
//    every row of our D: the broadcast we want (CUBLASLT_EPILOGUE_BIAS, GELU_AUX_BIAS);
//  * the GELU aux matrix has D's shape, N x M column-major with ld = our ldaux; cuBLASLt
//    requires that ld to be a multiple of 8 and >= N (cublasLt.h, EPILOGUE_AUX_LD);
//  * gemm_dbias's dbias[n] = sum_k B[k][n] is a reduction over k of cuBLASLt's "A" (our B,
//    N x K after its op): CUBLASLT_EPILOGUE_BGRADA, a vector of D's rows = N. BGRADA works only
//    for a non-transposed "A" (as BGRADB only for a transposed "B"; NVIDIA's cuBLASMp tests skip
//    the other cases), i.e. our tb == N, which gemm_dbias fixes: the weight gradient inp^T dout
//    is (ta, tb) = (T, N), cuBLASLt (transa, transb) = (N, T), apex's and Paddle's layout.
//
// Plans. Creating descriptors and asking the heuristic costs tens of microseconds of host time,
// more than a small GEMM, so each call shape gets one plan, made on first use and reused: the
// key holds everything the heuristic's answer depends on, including the alignment of every
// pointer (the heuristic reads the bias and aux pointers' values, and we tell it A..D's
// alignment). Only the bias/aux pointers are set per call (a host-side store). A new plan times
// up to 8 of the heuristic's candidates on its first call's operands and keeps the fastest
// (`fastest`): once per shape, in the first step.
#include "../common.hpp"  // first: Kokkos defines KOKKOS_ENABLE_CUDA

#if defined(KOKKOS_ENABLE_CUDA)
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "gemm_lt.hpp"
#include "meshtrain/kernels/gemm/gemm_varying.hpp"
#include "meshtrain/kernels/workspace.hpp"

namespace meshtrain::kernels::detail {

namespace {

// 32 MiB as PyTorch and TransformerEngine give Hopper: split-K and stream-K kernels need it.
constexpr std::size_t kWorkspaceBytes = kGemmLtWorkspaceBytes;  // kernels/workspace.hpp

// log2 of the largest power of two dividing the address, capped at 256 bytes (cuBLASLt's
// default assumption; null counts as aligned).
std::uint32_t align_log2(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t l = 8;
  while (l > 0 && a % (std::uintptr_t(1) << l) != 0) --l;
  return l;
}

struct PlanKey {
  int type, ta, tb, M, N, K, lda, ldb, ldc, ldd, epilogue, beta_nonzero, ldaux;
  std::uint32_t align;  // 4 bits per pointer: A, B, C, D, bias, aux
  auto tie() const {
    return std::tie(type, ta, tb, M, N, K, lda, ldb, ldc, ldd, epilogue, beta_nonzero, ldaux,
                    align);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

// ok false: cuBLASLt has no algorithm, the caller falls back (also cached). gemm_lt.hpp.
using Plan = LtPlan;
void destroy(Plan& p) { lt_destroy_plan(p); }

// One cuBLASLt handle, workspace and plan cache per process (one GPU per rank), made on first
// use and released by a Kokkos finalize hook. All GEMMs of a run go to one execution-space
// instance, whose stream orders the uses of the shared workspace and bias scratch.
struct LtState {
  std::mutex mutex;
  bool hooked = false;
  cublasLtHandle_t handle = nullptr;
  Kokkos::View<unsigned char*, MemSpace> workspace, bias_scratch;
  void* workspace_aligned = nullptr;  // cuBLASLt wants its workspace 256-byte aligned
  std::map<PlanKey, Plan> plans;
  std::map<PlanKey, Plan> bucket_plans;  // lt_matmul_bucketed's: op and algo only, no layouts
  std::map<std::vector<std::int64_t>, Plan> keyed_plans;  // other callers' (LtLocked)
};

constexpr std::size_t kAlign = 256;
void* align_up(unsigned char* p) {
  const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
  return reinterpret_cast<void*>((a + kAlign - 1) & ~std::uintptr_t(kAlign - 1));
}

LtState& state() {
  static LtState s;
  return s;
}

// Caller holds s.mutex.
void ensure_started(LtState& s) {
  if (s.handle) return;
  MESHTRAIN_CUBLAS_CHECK(cublasLtCreate(&s.handle));
  // A Kokkos View's data sits behind its allocation header, 128 bytes into a cudaMalloc block:
  // cublasLtMatmul answers CUBLAS_STATUS_INVALID_VALUE for a workspace that is not 256-byte
  // aligned (seen on the H200), so allocate 256 more and start at the next boundary.
  s.workspace = Kokkos::View<unsigned char*, MemSpace>(
      Kokkos::view_alloc("meshtrain::cublaslt_workspace", Kokkos::WithoutInitializing),
      kWorkspaceBytes + kAlign);
  s.workspace_aligned = align_up(s.workspace.data());
  if (!s.hooked) {
    s.hooked = true;
    Kokkos::push_finalize_hook([] {
      LtState& st = state();
      std::lock_guard<std::mutex> lock(st.mutex);
      for (auto& kv : st.plans) destroy(kv.second);
      st.plans.clear();
      for (auto& kv : st.bucket_plans) destroy(kv.second);
      st.bucket_plans.clear();
      for (auto& kv : st.keyed_plans) destroy(kv.second);
      st.keyed_plans.clear();
      st.workspace = {};
      st.workspace_aligned = nullptr;
      st.bias_scratch = {};
      if (st.handle) cublasLtDestroy(st.handle);
      st.handle = nullptr;
      st.hooked = false;
    });
  }
}

cublasOperation_t lt_op(Trans t) { return t == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

cublasLtEpilogue_t lt_epilogue(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case LtEpilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case LtEpilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case LtEpilogue::bgrad: return CUBLASLT_EPILOGUE_BGRADA;  // see the top of the file
    // D = x * gelu'(aux) and the bias gradient of D (its column sums in our row-major view:
    // a vector of cuBLASLt D's rows = our N), TransformerEngine's fc1 input-gradient epilogue.
    case LtEpilogue::dgelu_bgrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

bool uses_bias(LtEpilogue e) {
  return e == LtEpilogue::bias || e == LtEpilogue::gelu_aux_bias || e == LtEpilogue::bgrad ||
         e == LtEpilogue::dgelu_bgrad;
}
bool uses_aux(LtEpilogue e) {
  return e == LtEpilogue::gelu_aux || e == LtEpilogue::gelu_aux_bias || e == LtEpilogue::dgelu ||
         e == LtEpilogue::dgelu_bgrad;
}

// Cases we do not hand to cuBLASLt, from its documentation and others' experience.
bool lt_allowed(const LtCall& c) {
  // PyTorch keeps matrices with a dimension of 1 off cuBLASLt: the heuristic has answered
  // CUBLAS_STATUS_INVALID_VALUE for them. The fallback is as fast for such thin products.
  if (c.M < 2 || c.N < 2 || c.K < 2) return false;
  if (uses_aux(c.epilogue) && (c.ldaux % 8 != 0 || c.ldaux < c.N)) return false;
  // cuBLASLt's GELU epilogues use a tanh that is not exact to fp32 (~1e-3 relative, as PyTorch
  // notes too). fp32 mode is the one that must match the PyTorch fixtures tightly, and it is not
  // the fast path anyway: float GELU runs as GEMM + our exact epilogue kernel.
  if (uses_aux(c.epilogue) && c.type == CUDA_R_32F) return false;
  // As for bgrad: whether alpha scales the fused bias gradient is not documented.
  if (c.epilogue == LtEpilogue::dgelu_bgrad && (c.alpha != 1.0f || c.beta != 0.0f)) return false;
  if (c.epilogue == LtEpilogue::bgrad) {
    // BGRADA needs a non-transposed cuBLASLt "A" (our B); and whether the fused bias gradient
    // is scaled by alpha is not documented, while ours is not: keep alpha == 1 (the linear
    // layer's case) on cuBLASLt.
    if (c.tb != Trans::N || c.alpha != 1.0f) return false;
  }
  return true;
}

template <class V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}
template <class V>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
              const V& v) {
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
}

std::size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// The heuristic's first answer is a guess from a model of the GPU; the candidates after it are
// sometimes faster for our shapes (split-K for the long-K weight gradients). Each plan is made
// once, so time up to kCandidates of them on this call's own operands and keep the fastest.
// The outputs the timing runs write (D, and aux for a GELU forward) go to scratch: C, A, B and
// the bias are only read, so the caller's data is untouched (C == D becomes C != D, which only
// reads C). One synchronisation per plan, in the first step that uses the shape.
constexpr int kCandidates = 8;

}  // namespace

// MESHTRAIN_GEMM_CANDIDATES (1..8, for perf experiments; read once): how many of them to ask
// for and time; 1 takes the heuristic's first answer untimed, as PyTorch does.
int lt_candidates_wanted() {
  static const int n = [] {
    const char* e = std::getenv("MESHTRAIN_GEMM_CANDIDATES");
    const int v = e && *e ? std::atoi(e) : kCandidates;
    return v < 1 ? 1 : v > kCandidates ? kCandidates : v;
  }();
  return n;
}

int lt_fastest(cudaStream_t stream, int found, const std::function<bool(int)>& run) {
  if (found <= 1) return 0;
  cudaEvent_t ev[2];
  for (auto& e : ev) MESHTRAIN_CUDA_CHECK(cudaEventCreate(&e));
  int best = 0;
  float best_ms = std::numeric_limits<float>::max();
  for (int i = 0; i < found; ++i) {
    float ms = 0;
    bool ok = true;
    for (int rep = 0; rep < 3 && ok; ++rep) {  // rep 0 warms up
      MESHTRAIN_CUDA_CHECK(cudaEventRecord(ev[0], stream));
      ok = run(i);
      MESHTRAIN_CUDA_CHECK(cudaEventRecord(ev[1], stream));
      MESHTRAIN_CUDA_CHECK(cudaEventSynchronize(ev[1]));
      float t = 0;
      MESHTRAIN_CUDA_CHECK(cudaEventElapsedTime(&t, ev[0], ev[1]));
      if (rep > 0) ms += t;
    }
    if (ok && ms < best_ms) {
      best = i;
      best_ms = ms;
    }
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return best;
}

namespace {

int fastest(cublasLtHandle_t handle, Plan& p, const LtCall& c, cudaStream_t stream,
            void* workspace, const cublasLtMatmulHeuristicResult_t* results, int found) {
  if (found <= 1) return 0;
  const std::size_t elem = type_bytes(c.type);
  const std::size_t d_bytes = (std::size_t(c.M) * c.ldd * elem + kAlign - 1) / kAlign * kAlign;
  const std::size_t aux_bytes = uses_aux(c.epilogue) ? std::size_t(c.M) * c.ldaux * elem : 0;
  // Plain cudaMalloc, freed below: a transient of the first step, not a buffer of the run.
  void* d = nullptr;
  MESHTRAIN_CUDA_CHECK(cudaMalloc(&d, d_bytes + aux_bytes));
  void* aux = static_cast<unsigned char*>(d) + d_bytes;
  if (c.epilogue == LtEpilogue::gelu_aux || c.epilogue == LtEpilogue::gelu_aux_bias)
    set_desc(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
  const void* cin = c.beta != 0.0f ? c.C : d;
  const int best = lt_fastest(stream, found, [&](int i) {
    return cublasLtMatmul(handle, p.op, &c.alpha, c.B, p.a, c.A, p.b, &c.beta, cin, p.c, d, p.d,
                          &results[i].algo, workspace, kWorkspaceBytes,
                          stream) == CUBLAS_STATUS_SUCCESS;
  });
  MESHTRAIN_CUDA_CHECK(cudaFree(d));
  return best;
}

// The heuristic's preferences for a call: the workspace, and how aligned the operands are, so
// that it only offers algorithms that can run on them (its default assumes 256 bytes;
// activation slices can be less aligned). The caller destroys it.
cublasLtMatmulPreference_t make_preference(const LtCall& c) {
  cublasLtMatmulPreference_t pref = nullptr;
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspaceBytes);
  const auto bytes = [](const void* q) { return std::uint32_t(1) << align_log2(q); };
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, bytes(c.B));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, bytes(c.A));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, bytes(c.C));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, bytes(c.D));
  return pref;
}

// A call's three layouts (cuBLASLt's A = our B, B = our A, C = D) as opaque structs on the
// stack: no allocation (lt_matmul_bucketed's per-call layouts and its bucket plans').
struct StackLayouts {
  cublasLtMatrixLayoutOpaque_t a, b, c;
  explicit StackLayouts(const LtCall& k) {
    const bool bn = k.tb == Trans::N, an = k.ta == Trans::N;
    MESHTRAIN_CUBLAS_CHECK(
        cublasLtMatrixLayoutInit(&a, k.type, bn ? k.N : k.K, bn ? k.K : k.N, k.ldb));
    MESHTRAIN_CUBLAS_CHECK(
        cublasLtMatrixLayoutInit(&b, k.type, an ? k.K : k.M, an ? k.M : k.K, k.lda));
    MESHTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&c, k.type, k.N, k.M, k.ldc));
  }
};

Plan make_plan(cublasLtHandle_t handle, const LtCall& c, cudaStream_t stream, void* workspace) {
  Plan p;
  // fp32 accumulation and scaling for every type; CUBLAS_COMPUTE_32F (not _FAST_TF32) keeps
  // float inputs in full fp32, as cublasSgemm does in gemm().
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(p.op, CUBLASLT_MATMUL_DESC_TRANSA, lt_op(c.tb));
  set_desc(p.op, CUBLASLT_MATMUL_DESC_TRANSB, lt_op(c.ta));
  set_desc(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(c.epilogue));
  // The bias (or bias gradient) and aux keep D's element type: the defaults, not set.
  if (uses_bias(c.epilogue)) set_desc(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias);
  if (uses_aux(c.epilogue)) {
    set_desc(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.aux);
    set_desc(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t(c.ldaux));
  }
  // Column-major shapes as stored (see the top of the file).
  const bool bn = c.tb == Trans::N, an = c.ta == Trans::N;
  MESHTRAIN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.a, c.type, bn ? c.N : c.K, bn ? c.K : c.N, c.ldb));
  MESHTRAIN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.b, c.type, an ? c.K : c.M, an ? c.M : c.K, c.lda));
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, c.type, c.N, c.M, c.ldc));
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, c.type, c.N, c.M, c.ldd));

  cublasLtMatmulPreference_t pref = make_preference(c);

  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  // A status other than success means the same as no algorithm: this case is not supported.
  const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(
      handle, p.op, p.a, p.b, p.c, p.d, pref, lt_candidates_wanted(), results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (rc != CUBLAS_STATUS_SUCCESS || found == 0) {
    destroy(p);
    return p;
  }
  p.algo = results[fastest(handle, p, c, stream, workspace, results, found)].algo;
  p.ok = true;
  return p;
}

}  // namespace

bool lt_matmul(const Kokkos::Cuda& exec, const LtCall& call) {
  LtCall c = call;
  // C is not read when beta == 0: point it at D so that the key and the layouts do not depend
  // on whatever the caller passed.
  if (c.beta == 0.0f) {
    c.C = c.D;
    c.ldc = c.ldd;
  }
  if (!uses_bias(c.epilogue)) c.bias = nullptr;  // likewise unused pointers
  if (!uses_aux(c.epilogue)) c.aux = nullptr;
  if (!lt_allowed(c)) return false;
  const PlanKey key{int(c.type), int(c.ta), int(c.tb), c.M, c.N, c.K, c.lda, c.ldb, c.ldc, c.ldd,
                    int(c.epilogue), c.beta != 0.0f, uses_aux(c.epilogue) ? c.ldaux : 0,
                    align_log2(c.A) | align_log2(c.B) << 4 | align_log2(c.C) << 8 |
                        align_log2(c.D) << 12 | align_log2(c.bias) << 16 |
                        align_log2(c.aux) << 20};

  LtState& s = state();
  // Held through the launch: the plan's descriptor gets this call's pointers.
  std::lock_guard<std::mutex> lock(s.mutex);
  ensure_started(s);
  auto it = s.plans.find(key);
  if (it == s.plans.end())
    it = s.plans.emplace(key, make_plan(s.handle, c, exec.cuda_stream(), s.workspace_aligned))
             .first;
  Plan& p = it->second;
  if (!p.ok) return false;
  if (uses_bias(c.epilogue)) set_desc(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias);
  if (uses_aux(c.epilogue)) set_desc(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.aux);
  const cublasStatus_t rc =
      cublasLtMatmul(s.handle, p.op, &c.alpha, c.B, p.a, c.A, p.b, &c.beta, c.C, p.c, c.D, p.d,
                     &p.algo, s.workspace_aligned, kWorkspaceBytes, exec.cuda_stream());
  if (rc != CUBLAS_STATUS_SUCCESS) {
    // Nothing was launched: remember the refusal and let the caller fall back (the result stays
    // right; the tests that require fusion report it). Said once per shape, on stderr.
    std::fprintf(stderr,
                 "meshtrain: cublasLtMatmul refused row-major %s%s M=%d N=%d K=%d epilogue %d "
                 "(%s); this shape runs as GEMM + epilogue kernel\n",
                 c.ta == Trans::N ? "N" : "T", c.tb == Trans::N ? "N" : "T", c.M, c.N, c.K,
                 int(lt_epilogue(c.epilogue)), cublasGetStatusString(rc));
    destroy(p);
    return false;
  }
  return true;
}

namespace {

// The plan of one bucket: the descriptor and the heuristic's algorithm for the bucket's upper
// end (layouts of that size only while asking). The alignment preferences are the call's.
Plan make_bucket_plan(cublasLtHandle_t handle, const LtCall& c) {
  Plan p;
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(p.op, CUBLASLT_MATMUL_DESC_TRANSA, lt_op(c.tb));
  set_desc(p.op, CUBLASLT_MATMUL_DESC_TRANSB, lt_op(c.ta));
  StackLayouts l(c);
  cublasLtMatmulPreference_t pref = make_preference(c);
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  const cublasStatus_t rc =
      cublasLtMatmulAlgoGetHeuristic(handle, p.op, &l.a, &l.b, &l.c, &l.c, pref, 1, &result,
                                     &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (rc != CUBLAS_STATUS_SUCCESS || found == 0) {
    destroy(p);
    return p;
  }
  p.algo = result.algo;
  p.ok = true;
  return p;
}

}  // namespace

bool lt_matmul_bucketed(const Kokkos::Cuda& exec, const LtCall& call, bool vary_m) {
  LtCall c = call;
  if (c.epilogue != LtEpilogue::none) return false;  // not offered: gemm_varying has none
  if (c.beta == 0.0f) {
    c.C = c.D;
    c.ldc = c.ldd;
  }
  if (c.ldc != c.ldd || c.C != c.D) return false;  // gemm's contract: C is D
  if (!lt_allowed(c)) return false;
  // The bucket's representative shape: its upper end. A leading dimension that must cover the
  // varying size (a stored row as wide as it) grows with it there, by a multiple of 256
  // elements, which keeps its alignment. (The experts' GEMMs have none: their lds are fixed.)
  LtCall rep = c;
  const int v = vary_m ? c.M : c.K, bucket = gemm_size_bucket(v);
  (vary_m ? rep.M : rep.K) = bucket;
  const int grow = (bucket - v + 255) / 256 * 256;
  if (vary_m ? c.ta == Trans::T : c.ta == Trans::N) rep.lda += grow;
  if (!vary_m && c.tb == Trans::T) rep.ldb += grow;
  // The epilogue slot (always none here) tells M-bucketed plans from K-bucketed ones.
  const PlanKey key{int(c.type), int(c.ta), int(c.tb), rep.M, rep.N, rep.K, c.lda, c.ldb,
                    c.ldc, c.ldd, vary_m ? 1 : 2, c.beta != 0.0f, 0,
                    align_log2(c.A) | align_log2(c.B) << 4 | align_log2(c.C) << 8 |
                        align_log2(c.D) << 12};
  LtState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ensure_started(s);
  auto it = s.bucket_plans.find(key);
  if (it == s.bucket_plans.end())
    it = s.bucket_plans.emplace(key, make_bucket_plan(s.handle, rep)).first;
  Plan& p = it->second;
  if (!p.ok) return false;
  // The call's exact shape, in opaque layouts on the stack: no allocation per call.
  StackLayouts l(c);
  const cublasStatus_t rc =
      cublasLtMatmul(s.handle, p.op, &c.alpha, c.B, &l.a, c.A, &l.b, &c.beta, c.C, &l.c, c.D,
                     &l.c, &p.algo, s.workspace_aligned, kWorkspaceBytes, exec.cuda_stream());
  if (rc != CUBLAS_STATUS_SUCCESS) {
    // Nothing was launched. The bucket's algorithm does not fit this size: the whole bucket
    // goes to the fallback from now on (said once, on stderr).
    std::fprintf(stderr,
                 "meshtrain: cublasLtMatmul refused row-major %s%s M=%d N=%d K=%d with the "
                 "algorithm of its size bucket (%s); this bucket runs through cublasGemmEx\n",
                 c.ta == Trans::N ? "N" : "T", c.tb == Trans::N ? "N" : "T", c.M, c.N, c.K,
                 cublasGetStatusString(rc));
    destroy(p);
    return false;
  }
  return true;
}

void* lt_bias_scratch(std::size_t bytes) {
  LtState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ensure_started(s);  // the finalize hook releases the scratch too
  if (s.bias_scratch.extent(0) < bytes + kAlign)
    s.bias_scratch = Kokkos::View<unsigned char*, MemSpace>(
        Kokkos::view_alloc("meshtrain::cublaslt_bias_scratch", Kokkos::WithoutInitializing),
        bytes + kAlign);
  return align_up(s.bias_scratch.data());
}

// No checks here: also called from the finalize hook, where a throw would abort.
void lt_destroy_plan(LtPlan& p) {
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  for (auto* l : {p.a, p.b, p.c, p.d})
    if (l) cublasLtMatrixLayoutDestroy(l);
  p = LtPlan{};
}

std::uint32_t lt_align_log2(const void* p) { return align_log2(p); }

LtLocked::LtLocked() : lock_(state().mutex) { ensure_started(state()); }
cublasLtHandle_t LtLocked::handle() const { return state().handle; }
void* LtLocked::workspace() const { return state().workspace_aligned; }
std::size_t LtLocked::workspace_bytes() const { return kWorkspaceBytes; }
std::map<std::vector<std::int64_t>, LtPlan>& LtLocked::keyed_plans() {
  return state().keyed_plans;
}

}  // namespace meshtrain::kernels::detail
#endif
