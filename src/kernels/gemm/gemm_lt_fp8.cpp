// cuBLASLt FP8 matmul behind gemm_fp8 (CUDA builds; empty otherwise).
//
// What cuBLASLt computes (cuBLAS docs, "Narrow Precision Data Types Usage", tensorwise and
// outer-vector scaling of FP8): D = alpha * scale_A * scale_B * op(A) op(B) + beta * C, the
// scales multiplying as given (a scale may be negative); the scale pointers take our operands'
// scale_inv, so D is the dequantized product, exactly gemm_fp8's contract. Accumulation is fp32
// (CUBLAS_COMPUTE_32F, scale type CUDA_R_32F); FAST_ACCUM stays off, so Hopper promotes the
// tensor cores' partial sums into fp32 at intervals instead of accumulating all of K inside them.
//
// Restrictions we check before asking (cublasLtMatmul's FP8 requirements): A transposed and B not
// (the "TN" form: both operands K-contiguous), 16-byte aligned pointers and leading dimensions,
// E5M2 x E5M2 not supported, C and D of one 16/32-bit type (here CUDA_R_16BF or CUDA_R_32F; FP8
// outputs are not used). Rowwise scaling is cuBLASLt's outer-vector mode
// (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, compute capability 9.0): both A and B in that mode,
// one fp32 scale per row of op(A) and per column of op(B); on other GPUs the heuristic or the
// matmul refuses it and the caller emulates.
//
// Row-major -> column-major as in gemm_lt.cpp: row-major D[M, N] = A[M, K] . B[N, K]^T is
// column-major D^T[N, M] = B^T(T) . A^T; B's memory read column-major is the K x N matrix B^T,
// so cuBLASLt's "A" is our B with op T and its "B" is our A with op N: TRANSA = T, TRANSB = N,
// m = N, n = M, k = K. The scales swap with them: cuBLASLt's A scale is our B's (N entries
// rowwise: its m), its B scale our A's (M entries: its n).
//
// Plans: one per (shape, formats, output type, scaling, beta != 0, pointer alignments), cached in
// gemm_lt.cpp's shared state with its handle and workspace; the scale pointers are set on the
// descriptor per call (a host-side store, under the state's lock). As for the bf16 GEMMs
// (gemm_lt.cpp), up to lt_candidates_wanted() of the heuristic's answers are timed on the first
// call's own operands, D written to scratch, and the fastest kept: the heuristic's first answer,
// which PyTorch's scaled_mm takes untimed, is a model's guess, and the bf16 GEMMs' timed choice
// is part of why meshtrain's bf16 step is ahead of torch.compile's (issue 35). A call whose M
// changes every step (gemm_fp8_varying: an expert's rows) would make and time a plan for each
// new M: its plans are per size bucket of M instead, untimed (LtFp8Call::vary_m).
#include "../common.hpp"  // first: Kokkos defines KOKKOS_ENABLE_CUDA

#if defined(KOKKOS_ENABLE_CUDA)
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gemm_lt.hpp"
#include "gemm_lt_fp8.hpp"
#include "meshtrain/kernels/gemm/gemm_varying.hpp"

namespace meshtrain::kernels::detail {

namespace {

// First entry of our keys in LtLocked::keyed_plans ('F' 'P' '8'; 'F' 'P' 'B' for the plans of
// a size bucket of M).
constexpr std::int64_t kKeyTag = 0x465038, kBucketKeyTag = 0x465042;

// Outer-vector scaling came with cuBLAS 12.9; older headers lack the enum: rowwise falls back.
#if CUBLAS_VERSION >= 120900
constexpr bool kHaveOuterVec = true;
#else
constexpr bool kHaveOuterVec = false;
#endif

template <class V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const V& v) {
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}
template <class V>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
              const V& v) {
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// The documented restrictions (see the top of the file): nullptr where the call may run, else
// why not (the caller emulates, and says so once per shape).
const char* fp8_refusal(const LtFp8Call& c) {
  const auto fp8 = [](cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; };
  if (!fp8(c.a_type) || !fp8(c.b_type)) return "an operand is not FP8";
  if (c.a_type == CUDA_R_8F_E5M2 && c.b_type == CUDA_R_8F_E5M2)
    return "E5M2 x E5M2 has no kernel";
  if (c.out_type != CUDA_R_32F && c.out_type != CUDA_R_16BF) return "output neither fp32 nor bf16";
  if (c.rowwise && !kHaveOuterVec) return "no rowwise (outer-vector) scaling in this cuBLASLt";
  if (c.M < 1 || c.N < 1 || c.K < 16) return "M, N < 1 or K < 16";
  // 16-byte alignment of every pointer and leading dimension; K too, since a K-contiguous row of
  // FP8 codes must fill whole 16-byte vectors.
  const int out_bytes = c.out_type == CUDA_R_32F ? 4 : 2;
  if (c.K % 16 != 0 || c.lda % 16 != 0 || c.ldb % 16 != 0)
    return "K or an operand's leading dimension is not a multiple of 16";
  if ((c.ldc * out_bytes) % 16 != 0 || (c.ldd * out_bytes) % 16 != 0)
    return "the output's row stride is not a multiple of 16 bytes";
  if (!aligned16(c.A) || !aligned16(c.B) || !aligned16(c.C) || !aligned16(c.D))
    return "an operand or the output is not 16-byte aligned";
  // Scale pointers 16-byte aligned, tensorwise too: cuBLASLt 13 refused tensorwise FP8 matmuls
  // ("not supported") whose scale_inv was only 8-byte aligned.
  if (!aligned16(c.a_scale) || !aligned16(c.b_scale)) return "a scale is not 16-byte aligned";
  return nullptr;
}

// The fastest of `found` algorithms on the call's operands (lt_fastest), D written to a scratch
// buffer; C, A, B and the scales are only read.
int fastest(cublasLtHandle_t handle, const LtPlan& p, const LtFp8Call& c, cudaStream_t stream,
            void* workspace, std::size_t workspace_bytes,
            const cublasLtMatmulHeuristicResult_t* results, int found) {
  if (found <= 1) return 0;
  const std::size_t out_bytes = c.out_type == CUDA_R_32F ? 4 : 2;
  void* d = nullptr;  // a transient of the first step, freed below
  MESHTRAIN_CUDA_CHECK(cudaMalloc(&d, std::size_t(c.M) * std::size_t(c.ldd) * out_bytes));
  const void* cin = c.beta != 0.0f ? c.C : d;
  const int best = lt_fastest(stream, found, [&](int i) {
    return cublasLtMatmul(handle, p.op, &c.alpha, c.B, p.a, c.A, p.b, &c.beta, cin, p.c, d, p.d,
                          &results[i].algo, workspace, workspace_bytes,
                          stream) == CUBLAS_STATUS_SUCCESS;
  });
  MESHTRAIN_CUDA_CHECK(cudaFree(d));
  return best;
}

// The plan's descriptor: the TN form, the scale modes and this call's scale pointers.
void make_desc(LtPlan& p, const LtFp8Call& c) {
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(p.op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_desc(p.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
#if CUBLAS_VERSION >= 120900
  if (c.rowwise) {
    const std::int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;  // int32_t attribute
    set_desc(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode);
    set_desc(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode);
  }
#endif
  // The swap (top of the file): cuBLASLt's A is our B.
  set_desc(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(c.b_scale));
  set_desc(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(c.a_scale));
}

// The alignment preferences of the call's pointers.
cublasLtMatmulPreference_t make_preference(const LtFp8Call& c, std::size_t workspace_bytes) {
  cublasLtMatmulPreference_t pref = nullptr;
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes);
  const auto bytes = [](const void* q) { return std::uint32_t(1) << lt_align_log2(q); };
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, bytes(c.B));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, bytes(c.A));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, bytes(c.C));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, bytes(c.D));
  return pref;
}

LtPlan make_plan(cublasLtHandle_t handle, const LtFp8Call& c, cudaStream_t stream,
                 void* workspace, std::size_t workspace_bytes) {
  LtPlan p;
  make_desc(p, c);
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, c.b_type, c.K, c.N, c.ldb));
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, c.a_type, c.K, c.M, c.lda));
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, c.out_type, c.N, c.M, c.ldc));
  MESHTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, c.out_type, c.N, c.M, c.ldd));

  cublasLtMatmulPreference_t pref = make_preference(c, workspace_bytes);
  constexpr int kMaxCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates] = {};
  const int wanted = lt_candidates_wanted() < kMaxCandidates ? lt_candidates_wanted()
                                                             : kMaxCandidates;
  int found = 0;
  // A status other than success means the same as no algorithm: this case is not supported.
  const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.d,
                                                           pref, wanted, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (rc != CUBLAS_STATUS_SUCCESS || found == 0) {
    lt_destroy_plan(p);
    return p;
  }
  p.algo = results[fastest(handle, p, c, stream, workspace, workspace_bytes, results, found)].algo;
  p.ok = true;
  return p;
}

// The layouts of one call's exact shape, opaque on the stack: a bucket's plan holds none.
struct StackLayouts {
  cublasLtMatrixLayoutOpaque_t a, b, c, d;
  explicit StackLayouts(const LtFp8Call& k) {
    MESHTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&a, k.b_type, k.K, k.N, k.ldb));
    MESHTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&b, k.a_type, k.K, k.M, k.lda));
    MESHTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&c, k.out_type, k.N, k.M, k.ldc));
    MESHTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&d, k.out_type, k.N, k.M, k.ldd));
  }
};

// The plan of one size bucket of M (LtFp8Call::vary_m): the descriptor and the heuristic's first
// algorithm for the bucket's upper end, untimed (the calls of a bucket have other operands and
// other M; timing the first one's would pick for that M alone), as gemm_lt.cpp's bucketed plans
// of the 16-bit GEMMs.
LtPlan make_bucket_plan(cublasLtHandle_t handle, const LtFp8Call& rep,
                        std::size_t workspace_bytes) {
  LtPlan p;
  make_desc(p, rep);
  StackLayouts l(rep);
  cublasLtMatmulPreference_t pref = make_preference(rep, workspace_bytes);
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(handle, p.op, &l.a, &l.b, &l.c, &l.d,
                                                           pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (rc != CUBLAS_STATUS_SUCCESS || found == 0) {
    lt_destroy_plan(p);
    return p;
  }
  p.algo = result.algo;
  p.ok = true;
  return p;
}

const char* fp8_name(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 ? "e4m3" : "e5m2"; }

}  // namespace

bool lt_matmul_fp8(const Kokkos::Cuda& exec, const LtFp8Call& call, const char** why) {
  LtFp8Call c = call;
  // C is not read when beta == 0: point it at D so that the key does not depend on it.
  if (c.beta == 0.0f) {
    c.C = c.D;
    c.ldc = c.ldd;
  }
  if (const char* r = fp8_refusal(c)) {
    *why = r;
    return false;
  }
  // vary_m: the plan of M's size bucket (its upper end stands for M in the key), the call's
  // exact shape in layouts on the stack.
  LtFp8Call rep = c;
  if (c.vary_m) rep.M = gemm_size_bucket(c.M);
  const std::vector<std::int64_t> key{
      c.vary_m ? kBucketKeyTag : kKeyTag, c.a_type, c.b_type, c.out_type, c.rowwise, rep.M, c.N,
      c.K, c.lda, c.ldb, c.ldc, c.ldd, c.beta != 0.0f,
      std::int64_t(lt_align_log2(c.A) | lt_align_log2(c.B) << 4 | lt_align_log2(c.C) << 8 |
                   lt_align_log2(c.D) << 12)};
  // Held through the launch: the plan's descriptor gets this call's scale pointers.
  LtLocked lt;
  auto& plans = lt.keyed_plans();
  auto it = plans.find(key);
  if (it == plans.end())
    it = plans.emplace(key, c.vary_m ? make_bucket_plan(lt.handle(), rep, lt.workspace_bytes())
                                     : make_plan(lt.handle(), c, exec.cuda_stream(),
                                                 lt.workspace(), lt.workspace_bytes()))
             .first;
  LtPlan& p = it->second;
  if (!p.ok) {
    *why = "cuBLASLt's heuristic offered no algorithm";
    return false;
  }
  set_desc(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(c.b_scale));
  set_desc(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(c.a_scale));
  cublasStatus_t rc;
  if (c.vary_m) {
    StackLayouts l(c);
    rc = cublasLtMatmul(lt.handle(), p.op, &c.alpha, c.B, &l.a, c.A, &l.b, &c.beta, c.C, &l.c,
                        c.D, &l.d, &p.algo, lt.workspace(), lt.workspace_bytes(),
                        exec.cuda_stream());
  } else {
    rc = cublasLtMatmul(lt.handle(), p.op, &c.alpha, c.B, p.a, c.A, p.b, &c.beta, c.C, p.c, c.D,
                        p.d, &p.algo, lt.workspace(), lt.workspace_bytes(), exec.cuda_stream());
  }
  if (rc != CUBLAS_STATUS_SUCCESS) {
    // Nothing was launched (cuBLASLt checks the scale modes here, not in the heuristic):
    // remember the refusal and let the caller emulate. Said once per plan, on stderr.
    std::fprintf(stderr,
                 "meshtrain: cublasLtMatmul refused FP8 TN M=%d N=%d K=%d A %s B %s out %s %s "
                 "(%s); this %s runs the FP8 emulation\n",
                 c.M, c.N, c.K, fp8_name(c.a_type), fp8_name(c.b_type),
                 c.out_type == CUDA_R_32F ? "fp32" : "bf16", c.rowwise ? "rowwise" : "tensorwise",
                 cublasGetStatusString(rc), c.vary_m ? "size bucket of M" : "shape");
    lt_destroy_plan(p);
    *why = "cublasLtMatmul refused it";
    return false;
  }
  return true;
}

}  // namespace meshtrain::kernels::detail
#endif
