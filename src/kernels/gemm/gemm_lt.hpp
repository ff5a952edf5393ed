#pragma once
// Private to src/kernels/, CUDA builds only: row-major GEMMs with fused epilogues through
// cuBLASLt, with one cached plan (descriptors + the heuristic's algorithm) per call shape.
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "gemm_detail.hpp"

namespace meshtrain::kernels::detail {

// The cuBLASLt epilogues gemm_ex / gemm_dbias use.
enum class LtEpilogue { none, bias, gelu_aux, gelu_aux_bias, dgelu, bgrad, dgelu_bgrad };

// One row-major call, as gemm_ex takes it: D = epilogue(alpha op(A) op(B) + beta C).
// bias: the bias for bias/gelu_aux_bias, the bias-gradient output (overwritten) for bgrad and
// dgelu_bgrad.
struct LtCall {
  cudaDataType_t type;
  Trans ta, tb;
  int M, N, K;
  float alpha;
  const void* A;
  int lda;
  const void* B;
  int ldb;
  float beta;
  const void* C;  // ignored when beta == 0
  int ldc;
  void* D;
  int ldd;
  LtEpilogue epilogue;
  const void* bias;
  void* aux;
  int ldaux;
};

// Enqueues the call on exec's stream as one cublasLtMatmul and returns true; or returns false,
// enqueueing nothing, when cuBLASLt has no algorithm for it (or its documented restrictions
// exclude it): the caller then runs its fallback. Host-side only, no synchronisation.
bool lt_matmul(const Kokkos::Cuda& exec, const LtCall& call);

// lt_matmul for gemm_varying (kernels/gemm_varying.hpp): no epilogue; M (vary_m) or K changes
// between calls. One plan per size bucket of that dimension (the heuristic's first answer for
// the bucket's upper end, not timed: a timing run at that size would read past the operands),
// run at the call's exact shape. Returns false, enqueueing nothing, where cuBLASLt refuses.
bool lt_matmul_bucketed(const Kokkos::Cuda& exec, const LtCall& call, bool vary_m);

// A device buffer of at least `bytes` kept for the run (grown, never shrunk): the bias-gradient
// epilogue overwrites its output, so gemm_dbias points it here and adds the result into dbias.
// Uses are ordered by the one execution-space instance's stream, as for persistent_buffer.
void* lt_bias_scratch(std::size_t bytes);

// What other cuBLASLt callers in src/kernels (gemm_lt_fp8.cpp) share with lt_matmul: one handle,
// one workspace and one place for cached plans per process, so a second caller neither creates a
// second 32 MiB workspace nor its own finalize hook.

// A plan: descriptors and the heuristic's algorithm (ok false: cuBLASLt has none, cached too).
struct LtPlan {
  bool ok = false;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};
void lt_destroy_plan(LtPlan& p);  // releases the descriptors; p becomes an empty plan

// How many of the heuristic's candidates a new plan times (MESHTRAIN_GEMM_CANDIDATES, 1..8,
// default 8; 1 takes the first answer untimed, as PyTorch does).
int lt_candidates_wanted();

// Of `found` candidate algorithms, the index of the fastest: run(i) enqueues candidate i once on
// `stream` and says whether cuBLASLt took it; each runs 3 times (the first a warm-up) between
// events, one synchronisation per run. found <= 1: 0, nothing run.
int lt_fastest(cudaStream_t stream, int found, const std::function<bool(int)>& run);

// log2 of the largest power of two dividing the address, capped at 8 (256 bytes); null gives 8.
std::uint32_t lt_align_log2(const void* p);

// The shared state, locked for the object's lifetime (started on first use): plans and the
// workspace are used under the lock, as lt_matmul does. keyed_plans() is for callers other than
// lt_matmul; each key starts with a tag of its caller. The finalize hook destroys those plans.
class LtLocked {
 public:
  LtLocked();
  LtLocked(const LtLocked&) = delete;
  LtLocked& operator=(const LtLocked&) = delete;
  cublasLtHandle_t handle() const;
  void* workspace() const;  // 256-byte aligned
  std::size_t workspace_bytes() const;
  std::map<std::vector<std::int64_t>, LtPlan>& keyed_plans();

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace meshtrain::kernels::detail
