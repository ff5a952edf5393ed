// The expert GEMMs of one MoE layer on one GPU, timed under several ways of calling cuBLAS.
//
// meshtrain runs an MoE layer's experts as a loop of per-expert GEMMs (src/moe/grouped_gemm.cpp)
// whose row counts follow the router and so change every step. cuBLAS chooses an algorithm for
// every new shape, and that host-side choice can cost more than the GEMM itself. This benchmark
// measures that cost against the alternatives; its results are the reason for
// src/kernels/gemm/gemm_varying.cpp (include/meshtrain/kernels/gemm/gemm_varying.hpp quotes them):
//
//   loop, new shapes each step      cublasGemmEx per expert, new row counts every layer
//   loop, same shapes every step    the same, with counts that repeat (shapes cuBLAS has seen)
//   split 128 / split 256           each expert's rows cut into a multiple of 128 (256) and a
//                                   remainder: exact, and fewer distinct shapes
//   grouped batched, new counts     cublasGemmGroupedBatchedEx, one call per GEMM kind
//   dense R rows (bound)            one GEMM over all rows: the same FLOPs at a single shape
//   lt algo per bucket, new counts  cuBLASLt, its heuristic asked once per size bucket of the
//                                   varying dimension (64, then p, 1.25p, 1.5p, 1.75p for p a
//                                   power of two), run at the exact shape with layouts
//                                   initialised on the stack (what gemm_varying does)
//
// Shapes: GPT-2 124M with 8 experts (hidden 768, expert FFN 3072), 16384 routed rows per layer,
// 12 layers, bf16 with fp32 accumulation. Each expert runs 6 GEMMs: forward fc and proj,
// backward dx of both and dW of both. The data are zeros: only time matters.
//
// For each strategy, 5 warm-up and 25 timed iterations of all 12 layers; prints the median and
// minimum wall time (enqueue to device idle), the median host enqueue time and TFLOP/s at the
// median wall time.
//
// Build and run (standalone, no meshtrain library needed; H100/H200):
//
//   src=perf/bench/bench_expert_gemm_cublas.cu
//   /usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o bench_expert_gemm_cublas $src -lcublas -lcublasLt
//   ./bench_expert_gemm_cublas [spread]
//
// spread (default 0.5) is the standard deviation of the log of the expert loads: each layer
// draws the experts' loads from a log-normal distribution and splits the rows in proportion.
// perf/reference/torch_grouped_mm.py times the same work through torch._grouped_mm.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <tuple>
#include <vector>

// Works for cudaError_t and cublasStatus_t alike: both are 0 on success.
#define CHECK_STATUS(expr)                                                  \
  do {                                                                      \
    const auto status_ = (expr);                                            \
    if (static_cast<int>(status_) != 0) {                                   \
      std::printf("err %d line %d\n", static_cast<int>(status_), __LINE__); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

namespace {

using bf16 = __nv_bfloat16;

constexpr int kExperts = 8;
constexpr int kHidden = 768;          // the experts' input and output width
constexpr int kFfn = 3072;            // the experts' inner width
constexpr int kRowsPerLayer = 16384;  // routed (token, expert) pairs per layer
constexpr int kLayers = 12;
constexpr int kGemmsPerExpert = 6;
constexpr int kWarmupIters = 5;
constexpr int kTimedIters = 25;
constexpr std::size_t kWorkspaceBytes = 32 << 20;
constexpr unsigned kSeed = 1234;

// Rows sorted by expert: expert e owns rows [offset[e], offset[e + 1]) of every activation.
struct Buffers {
  bf16* x = nullptr;          // [rows, hidden] expert input
  bf16* hidden = nullptr;     // [rows, ffn] fc output
  bf16* y = nullptr;          // [rows, hidden] proj output
  bf16* dy = nullptr;         // [rows, hidden]
  bf16* dhidden = nullptr;    // [rows, ffn]
  bf16* dx = nullptr;         // [rows, hidden]
  bf16* w_fc = nullptr;       // [experts, hidden, ffn]
  bf16* w_proj = nullptr;     // [experts, ffn, hidden]
  bf16* grad_fc = nullptr;    // [experts, hidden, ffn]
  bf16* grad_proj = nullptr;  // [experts, ffn, hidden]
};

cublasHandle_t cublas_handle;
cublasLtHandle_t lt_handle;
void* lt_workspace = nullptr;
Buffers buffers;

// Row-major C[M, N] = op(A) op(B) + beta C, alpha 1.
struct RowMajorGemm {
  bool trans_a, trans_b;
  int M, N, K;
  const bf16* A;
  int lda;
  const bf16* B;
  int ldb;
  float beta;
  bf16* C;
  int ldc;
};

cublasOperation_t to_cublas_op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

// cuBLAS is column-major, and a row-major C = op(A) op(B) is the column-major
// C^T = op(B)^T op(A)^T: the operands and M, N trade places.
void gemm_row_major(const RowMajorGemm& g) {
  const float alpha = 1.f;
  CHECK_STATUS(cublasGemmEx(cublas_handle, to_cublas_op(g.trans_b), to_cublas_op(g.trans_a), g.N,
                            g.M, g.K, &alpha, g.B, CUDA_R_16BF, g.ldb, g.A, CUDA_R_16BF, g.lda,
                            &g.beta, g.C, CUDA_R_16BF, g.ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

// The 6 GEMMs of one expert over rows [row_offset, row_offset + rows), in a fixed order that
// the grouped-batched strategy relies on (one call per position). The dW GEMMs accumulate
// (beta 1), as gradients do over micro-batches.
void append_expert_gemms(int expert, long row_offset, int rows, std::vector<RowMajorGemm>* gemms) {
  const Buffers& b = buffers;
  const bf16* w_fc = b.w_fc + long(expert) * kHidden * kFfn;
  const bf16* w_proj = b.w_proj + long(expert) * kFfn * kHidden;
  bf16* grad_fc = b.grad_fc + long(expert) * kHidden * kFfn;
  bf16* grad_proj = b.grad_proj + long(expert) * kFfn * kHidden;
  const bf16* x = b.x + row_offset * kHidden;
  bf16* hidden = b.hidden + row_offset * kFfn;
  bf16* y = b.y + row_offset * kHidden;
  const bf16* dy = b.dy + row_offset * kHidden;
  bf16* dhidden = b.dhidden + row_offset * kFfn;
  bf16* dx = b.dx + row_offset * kHidden;
  // Forward: hidden = x w_fc, y = hidden w_proj.
  gemms->push_back({false, false, rows, kFfn, kHidden, x, kHidden, w_fc, kFfn, 0.f, hidden, kFfn});
  gemms->push_back(
      {false, false, rows, kHidden, kFfn, hidden, kFfn, w_proj, kHidden, 0.f, y, kHidden});
  // Backward through proj: dhidden = dy w_proj^T, grad_proj += hidden^T dy.
  gemms->push_back(
      {false, true, rows, kFfn, kHidden, dy, kHidden, w_proj, kHidden, 0.f, dhidden, kFfn});
  gemms->push_back(
      {true, false, kFfn, kHidden, rows, hidden, kFfn, dy, kHidden, 1.f, grad_proj, kHidden});
  // Backward through fc: dx = dhidden w_fc^T, grad_fc += x^T dhidden.
  gemms->push_back({false, true, rows, kHidden, kFfn, dhidden, kFfn, w_fc, kFfn, 0.f, dx, kHidden});
  gemms->push_back(
      {true, false, kHidden, kFfn, rows, x, kHidden, dhidden, kFfn, 1.f, grad_fc, kFfn});
}

// The same 6 GEMMs with the rows cut into a multiple of `block` and a remainder: the result is
// unchanged, and the shapes cuBLAS sees are bounded to multiples of the block and remainders.
void append_split_expert_gemms(int expert, long row_offset, int rows, int block,
                               std::vector<RowMajorGemm>* gemms) {
  const int whole_rows = rows / block * block;
  const int remainder_rows = rows - whole_rows;
  if (whole_rows) append_expert_gemms(expert, row_offset, whole_rows, gemms);
  if (remainder_rows) {
    append_expert_gemms(expert, row_offset + whole_rows, remainder_rows, gemms);
  }
}

// An expert the router gave no rows has nothing to compute.
bool is_empty(const RowMajorGemm& g) { return g.M == 0 || g.N == 0 || g.K == 0; }

void run_gemm_loop(const std::vector<RowMajorGemm>& gemms) {
  for (const RowMajorGemm& g : gemms) {
    if (!is_empty(g)) gemm_row_major(g);
  }
}

// Rows per expert for one layer: log-normal loads (log standard deviation `spread`), the rows
// split in proportion, the rounding remainder given to expert 0.
std::vector<int> draw_expert_counts(double spread, std::mt19937* rng) {
  std::normal_distribution<double> log_load(0, spread);
  std::vector<double> loads(kExperts);
  double total_load = 0;
  for (double& load : loads) {
    load = std::exp(log_load(*rng));
    total_load += load;
  }
  std::vector<int> counts(kExperts);
  int assigned_rows = 0;
  for (int e = 0; e < kExperts; ++e) {
    counts[e] = int(kRowsPerLayer * loads[e] / total_load);
    assigned_rows += counts[e];
  }
  counts[0] += kRowsPerLayer - assigned_rows;
  return counts;
}

std::vector<long> row_offsets(const std::vector<int>& counts) {
  std::vector<long> offsets(kExperts + 1, 0);
  for (int e = 0; e < kExperts; ++e) offsets[e + 1] = offsets[e] + counts[e];
  return offsets;
}

// cublasGemmGroupedBatchedEx reads the operand pointers from device memory: per GEMM kind,
// three arrays of kExperts pointers (cuBLAS's A, B, C), refilled every layer.
constexpr int kPointerArraysPerGemm = 3;
void* grouped_pointers_device = nullptr;
std::vector<void*> grouped_pointers_host;

// One grouped call per GEMM kind, each over all experts (one group per expert, group size 1).
void run_grouped_batched(const std::vector<int>& counts, const std::vector<long>& offsets) {
  std::vector<std::vector<RowMajorGemm>> per_expert(kExperts);
  for (int e = 0; e < kExperts; ++e) {
    append_expert_gemms(e, offsets[e], counts[e], &per_expert[e]);
  }
  // Column-major view as in gemm_row_major: cuBLAS's A is our B and its B our A.
  grouped_pointers_host.assign(kGemmsPerExpert * kPointerArraysPerGemm * kExperts, nullptr);
  for (int kind = 0; kind < kGemmsPerExpert; ++kind) {
    void** arrays = grouped_pointers_host.data() + kind * kPointerArraysPerGemm * kExperts;
    for (int e = 0; e < kExperts; ++e) {
      const RowMajorGemm& g = per_expert[e][kind];
      arrays[e] = const_cast<bf16*>(g.B);
      arrays[kExperts + e] = const_cast<bf16*>(g.A);
      arrays[2 * kExperts + e] = g.C;
    }
  }
  // Ordered on the stream after the previous layer's grouped GEMMs, which read the same arrays.
  CHECK_STATUS(cudaMemcpyAsync(grouped_pointers_device, grouped_pointers_host.data(),
                               grouped_pointers_host.size() * sizeof(void*), cudaMemcpyHostToDevice,
                               0));
  for (int kind = 0; kind < kGemmsPerExpert; ++kind) {
    cublasOperation_t trans_a[kExperts], trans_b[kExperts];
    int m[kExperts], n[kExperts], k[kExperts];
    int lda[kExperts], ldb[kExperts], ldc[kExperts];
    int group_size[kExperts];
    float alpha[kExperts], beta[kExperts];
    for (int e = 0; e < kExperts; ++e) {
      const RowMajorGemm& g = per_expert[e][kind];
      trans_a[e] = to_cublas_op(g.trans_b);
      trans_b[e] = to_cublas_op(g.trans_a);
      m[e] = g.N;
      n[e] = g.M;
      k[e] = g.K;
      lda[e] = g.ldb;
      ldb[e] = g.lda;
      ldc[e] = g.ldc;
      group_size[e] = 1;
      alpha[e] = 1.f;
      beta[e] = g.beta;
    }
    void** arrays =
        static_cast<void**>(grouped_pointers_device) + kind * kPointerArraysPerGemm * kExperts;
    CHECK_STATUS(cublasGemmGroupedBatchedEx(cublas_handle, trans_a, trans_b, m, n, k, alpha, arrays,
                                            CUDA_R_16BF, lda, arrays + kExperts, CUDA_R_16BF, ldb,
                                            beta, arrays + 2 * kExperts, CUDA_R_16BF, ldc, kExperts,
                                            group_size, CUBLAS_COMPUTE_32F));
  }
}

// The size bucket of a varying dimension: the smallest of 64 and p, 1.25p, 1.5p, 1.75p, 2p
// (p the largest power of two <= v) that is >= v. Four buckets per octave keep the number of
// heuristic queries small while an algorithm chosen for the bucket still suits every size in it.
int size_bucket(int v) {
  if (v <= 64) return 64;
  int p = 1;
  while (p * 2 <= v) p *= 2;
  for (int quarters = 0; quarters <= 4; ++quarters) {
    const int bucket = p + p / 4 * quarters;
    if (bucket >= v) return bucket;
  }
  return 2 * p;  // not reached: quarters == 4 is 2p
}

// Which dimension follows the router: M (rows) for the forward and dx GEMMs, K for dW.
enum class VaryingDim { M, K };

// A cuBLASLt algorithm chosen once for a size bucket; `found` false when cuBLASLt has none,
// and the bucket's calls go to cublasGemmEx.
struct LtPlan {
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulAlgo_t algo;
  bool found;
};

// trans_a, trans_b, bucketed M, N, bucketed K, lda, ldb, ldc, beta != 0, varying dimension.
using LtPlanKey = std::tuple<int, int, int, int, int, int, int, int, int, int>;
std::map<LtPlanKey, LtPlan> lt_plans;

void create_layout(cublasLtMatrixLayout_t* layout, int rows, int cols, int ld) {
  CHECK_STATUS(cublasLtMatrixLayoutCreate(layout, CUDA_R_16BF, rows, cols, ld));
}

// Layouts and algorithm in cuBLASLt's column-major view (cuBLAS's A is our B, as in
// gemm_row_major), at the bucketed sizes.
LtPlan make_lt_plan(const RowMajorGemm& g, int bucketed_m, int bucketed_k) {
  LtPlan plan{};
  CHECK_STATUS(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = to_cublas_op(g.trans_b);
  const cublasOperation_t op_b = to_cublas_op(g.trans_a);
  CHECK_STATUS(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  CHECK_STATUS(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  cublasLtMatrixLayout_t layout_a, layout_b, layout_c;
  create_layout(&layout_a, g.trans_b ? bucketed_k : g.N, g.trans_b ? g.N : bucketed_k, g.ldb);
  create_layout(&layout_b, g.trans_a ? bucketed_m : bucketed_k, g.trans_a ? bucketed_k : bucketed_m,
                g.lda);
  create_layout(&layout_c, g.N, bucketed_m, g.ldc);
  cublasLtMatmulPreference_t preference;
  CHECK_STATUS(cublasLtMatmulPreferenceCreate(&preference));
  const std::size_t workspace_bytes = kWorkspaceBytes;
  CHECK_STATUS(cublasLtMatmulPreferenceSetAttribute(preference,
                                                    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof workspace_bytes));
  cublasLtMatmulHeuristicResult_t result;
  int found_count = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(lt_handle, plan.desc, layout_a, layout_b, layout_c, layout_c,
                                     preference, 1, &result, &found_count);
  plan.found = status == CUBLAS_STATUS_SUCCESS && found_count > 0;
  if (plan.found) plan.algo = result.algo;
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(layout_a);
  cublasLtMatrixLayoutDestroy(layout_b);
  cublasLtMatrixLayoutDestroy(layout_c);
  return plan;
}

void gemm_lt_bucketed(const RowMajorGemm& g, VaryingDim varying) {
  const int bucketed_m = varying == VaryingDim::M ? size_bucket(g.M) : g.M;
  const int bucketed_k = varying == VaryingDim::K ? size_bucket(g.K) : g.K;
  const LtPlanKey key(int(g.trans_a), int(g.trans_b), bucketed_m, g.N, bucketed_k, g.lda, g.ldb,
                      g.ldc, int(g.beta != 0), int(varying));
  auto it = lt_plans.find(key);
  if (it == lt_plans.end()) {
    it = lt_plans.emplace(key, make_lt_plan(g, bucketed_m, bucketed_k)).first;
  }
  const LtPlan& plan = it->second;
  if (!plan.found) {
    gemm_row_major(g);
    return;
  }
  // Opaque layouts on the stack, at the exact shape: no allocation per call.
  cublasLtMatrixLayoutOpaque_t storage_a, storage_b, storage_c;
  cublasLtMatrixLayout_t layout_a = &storage_a;
  cublasLtMatrixLayout_t layout_b = &storage_b;
  cublasLtMatrixLayout_t layout_c = &storage_c;
  CHECK_STATUS(cublasLtMatrixLayoutInit(layout_a, CUDA_R_16BF, g.trans_b ? g.K : g.N,
                                        g.trans_b ? g.N : g.K, g.ldb));
  CHECK_STATUS(cublasLtMatrixLayoutInit(layout_b, CUDA_R_16BF, g.trans_a ? g.M : g.K,
                                        g.trans_a ? g.K : g.M, g.lda));
  CHECK_STATUS(cublasLtMatrixLayoutInit(layout_c, CUDA_R_16BF, g.N, g.M, g.ldc));
  const float alpha = 1.f;
  const cublasStatus_t status =
      cublasLtMatmul(lt_handle, plan.desc, &alpha, g.B, layout_a, g.A, layout_b, &g.beta, g.C,
                     layout_c, g.C, layout_c, &plan.algo, lt_workspace, kWorkspaceBytes, 0);
  // The bucket's algorithm may not support every size in the bucket.
  if (status != CUBLAS_STATUS_SUCCESS) {
    static bool warned = false;
    if (!warned) std::printf("lt status %d, fallback\n", int(status));
    warned = true;
    gemm_row_major(g);
  }
}

void run_lt_loop(const std::vector<RowMajorGemm>& gemms) {
  for (const RowMajorGemm& g : gemms) {
    // Only the dW GEMMs transpose A, and they vary in K.
    if (!is_empty(g)) gemm_lt_bucketed(g, g.trans_a ? VaryingDim::K : VaryingDim::M);
  }
}

enum class Strategy {
  kLoopNewCounts,
  kLoopSameCounts,
  kSplit128,
  kSplit256,
  kGroupedBatched,
  kDenseBound,
  kLtPerBucket,
};

struct StrategyInfo {
  Strategy strategy;
  const char* name;
};

constexpr StrategyInfo kStrategies[] = {
    {Strategy::kLoopNewCounts, "loop, new shapes each step"},
    {Strategy::kLoopSameCounts, "loop, same shapes every step"},
    {Strategy::kSplit128, "split 128, new counts"},
    {Strategy::kSplit256, "split 256, new counts"},
    {Strategy::kGroupedBatched, "grouped batched, new counts"},
    {Strategy::kDenseBound, "dense R rows (bound)"},
    {Strategy::kLtPerBucket, "lt algo per bucket, new counts"},
};

// Enqueues one layer's expert GEMMs. Building the GEMM list counts in the host time.
void enqueue_layer(Strategy strategy, const std::vector<int>& counts) {
  const std::vector<long> offsets = row_offsets(counts);
  std::vector<RowMajorGemm> gemms;
  switch (strategy) {
    case Strategy::kLoopNewCounts:
    case Strategy::kLoopSameCounts:
    case Strategy::kLtPerBucket:
      for (int e = 0; e < kExperts; ++e) append_expert_gemms(e, offsets[e], counts[e], &gemms);
      break;
    case Strategy::kSplit128:
    case Strategy::kSplit256: {
      const int block = strategy == Strategy::kSplit128 ? 128 : 256;
      for (int e = 0; e < kExperts; ++e) {
        append_split_expert_gemms(e, offsets[e], counts[e], block, &gemms);
      }
      break;
    }
    case Strategy::kDenseBound:
      // All rows through expert 0: the FLOPs of the layer at one shape.
      append_expert_gemms(0, 0, kRowsPerLayer, &gemms);
      break;
    case Strategy::kGroupedBatched:
      break;  // builds its own per-kind lists
  }
  if (strategy == Strategy::kGroupedBatched) {
    run_grouped_batched(counts, offsets);
  } else if (strategy == Strategy::kLtPerBucket) {
    run_lt_loop(gemms);
  } else {
    run_gemm_loop(gemms);
  }
}

double now_ms() {
  const auto since_epoch = std::chrono::steady_clock::now().time_since_epoch();
  return std::chrono::duration<double, std::milli>(since_epoch).count();
}

void allocate_zeroed(bf16** buffer, long elements) {
  CHECK_STATUS(cudaMalloc(buffer, elements * sizeof(bf16)));
  CHECK_STATUS(cudaMemset(*buffer, 0, elements * sizeof(bf16)));
}

void benchmark(const StrategyInfo& info, double spread) {
  // Every strategy sees the same sequence of counts.
  std::mt19937 rng(kSeed);
  const std::vector<int> fixed_counts = draw_expert_counts(spread, &rng);
  std::vector<double> wall_ms, host_ms;
  for (int iter = 0; iter < kWarmupIters + kTimedIters; ++iter) {
    CHECK_STATUS(cudaDeviceSynchronize());
    const double start = now_ms();
    for (int layer = 0; layer < kLayers; ++layer) {
      const std::vector<int> counts = info.strategy == Strategy::kLoopSameCounts
                                          ? fixed_counts
                                          : draw_expert_counts(spread, &rng);
      enqueue_layer(info.strategy, counts);
    }
    const double enqueued = now_ms();
    CHECK_STATUS(cudaDeviceSynchronize());
    const double done = now_ms();
    if (iter >= kWarmupIters) {
      wall_ms.push_back(done - start);
      host_ms.push_back(enqueued - start);
    }
  }
  std::sort(wall_ms.begin(), wall_ms.end());
  std::sort(host_ms.begin(), host_ms.end());
  const double median_wall_ms = wall_ms[wall_ms.size() / 2];
  const double flops = 6.0 * 2 * kRowsPerLayer * double(kHidden) * kFfn * kLayers;
  std::printf("%-32s wall median %8.2f ms  min %8.2f  host %8.2f ms  %6.0f TFLOP/s\n", info.name,
              median_wall_ms, wall_ms[0], host_ms[host_ms.size() / 2],
              flops / (median_wall_ms * 1e-3) / 1e12);
}

}  // namespace

int main(int argc, char** argv) {
  CHECK_STATUS(cublasCreate(&cublas_handle));
  void* cublas_workspace;
  CHECK_STATUS(cudaMalloc(&cublas_workspace, kWorkspaceBytes));
  CHECK_STATUS(cublasSetWorkspace(cublas_handle, cublas_workspace, kWorkspaceBytes));
  const long activation_elements = long(kRowsPerLayer) * kHidden;
  const long hidden_elements = long(kRowsPerLayer) * kFfn;
  const long weight_elements = long(kExperts) * kHidden * kFfn;
  allocate_zeroed(&buffers.x, activation_elements);
  allocate_zeroed(&buffers.hidden, hidden_elements);
  allocate_zeroed(&buffers.y, activation_elements);
  allocate_zeroed(&buffers.dy, activation_elements);
  allocate_zeroed(&buffers.dhidden, hidden_elements);
  allocate_zeroed(&buffers.dx, activation_elements);
  allocate_zeroed(&buffers.w_fc, weight_elements);
  allocate_zeroed(&buffers.w_proj, weight_elements);
  allocate_zeroed(&buffers.grad_fc, weight_elements);
  allocate_zeroed(&buffers.grad_proj, weight_elements);
  CHECK_STATUS(cudaMalloc(&grouped_pointers_device,
                          kGemmsPerExpert * kPointerArraysPerGemm * kExperts * sizeof(void*)));
  const double spread = argc > 1 ? std::atof(argv[1]) : 0.5;
  CHECK_STATUS(cublasLtCreate(&lt_handle));
  CHECK_STATUS(cudaMalloc(&lt_workspace, kWorkspaceBytes));
  for (const StrategyInfo& info : kStrategies) benchmark(info, spread);
  std::printf("(12 layers x 8 experts x 6 GEMMs, %d rows per layer, spread %.2f)\n", kRowsPerLayer,
              spread);
}
