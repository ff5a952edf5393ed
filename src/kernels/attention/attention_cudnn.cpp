// Causal attention through cuDNN's fused flash attention (attention_cudnn.hpp): the SDPA
// forward and backward written as cuDNN backend operation graphs of matmul, scale, causal mask,
// softmax and matmul, which cuDNN's runtime-fusion engines recognise and compile into one flash
// kernel each (the graphs that cudnn-frontend's SDPA nodes lower to; cuDNN developer guide,
// "Scaled Dot Product Attention"). No cudnn-frontend: it is not packaged, the graphs are short.
//
// Layout: Q, K, V are read in place from the packed qkv buffer [B, T, (NH + 2 NKV) HS] through
// strides (Q [B, NH, T, HS] with row stride ld = (NH + 2 NKV) HS, K and V [B, NKV, T, HS] at
// column offsets NH HS and (NH + NKV) HS); O and dO are [B, T, NH HS]; dQ, dK, dV are written
// into dqkv at the same strides. The softmax statistics are our lse: [B, NH, T] fp32, the natural
// log-sum-exp of the scaled scores, so either direction can pair with our kernels'.
//
// Grouped-query attention: K and V have NKV heads; the Q.K^T and dO.V^T matmuls broadcast each
// over its NH / NKV query heads, and dK, dV are computed per query head and summed over each
// group by a reduction, which cuDNN fuses.
//
// Plans: one per (direction, dtype, B, T, NH, NKV, HS, deterministic), built on first use and
// kept for the process (the engine search takes ~0.1-1 s; a training run has one or two
// shapes). Workspace and scratch are one growing device buffer shared by all plans: every call
// runs on the caller's stream, which orders their uses.
#include "attention_cudnn.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN)
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <string>
#include <type_traits>
#include <vector>

#include "cudnn_graph.hpp"
#include "meshtrain/core/cuda_check.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/kernels/attention/attention.hpp"
#include "meshtrain/kernels/workspace.hpp"

namespace meshtrain::kernels {

std::string cudnn_attention_unavailable_reason() {
  std::string why;
  return detail::cudnn::api(&why) ? std::string() : why;
}

namespace detail {

namespace {
using cudnn::Dims;
using cudnn::Graph;

// Tensor ids of the variant packs.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDQAccum
};

struct Shape {
  int B, T, NH, NKV, HS;
  int64_t C() const { return int64_t(NH) * HS; }
  int64_t Ckv() const { return int64_t(NKV) * HS; }
  int64_t ld() const { return C() + 2 * Ckv(); }
};

// In-place views of the packed buffers (dims [b, h, s, d]; K^T and V^T swap the last two).
Dims q_strides(const Shape& s) { return {s.T * s.ld(), s.HS, s.ld(), 1}; }
Dims kt_strides(const Shape& s) { return {s.T * s.ld(), s.HS, 1, s.ld()}; }
Dims o_strides(const Shape& s) { return {s.T * s.C(), s.HS, s.C(), 1}; }

// scale, then the causal mask: keys after the query get -inf (lowest() before cuDNN 9.10, which
// preferred a finite mask value), as cuDNN's SDPA pattern expects them.
int64_t scaled_causal_scores(Graph& g, const Shape& s, int64_t S) {
  const Dims ss{s.B, s.NH, s.T, s.T};
  const int64_t scaled = g.virt(ss, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, S, kScale, -1, scaled);
  const int64_t row = g.virt(ss, CUDNN_DATA_INT32), col = g.virt(ss, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, -1, -1, row, CUDNN_DATA_INT32, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, -1, -1, col, CUDNN_DATA_INT32, 3);
  const int64_t keep = g.virt(ss, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, -1, keep, CUDNN_DATA_BOOLEAN);
  const int64_t masked = g.virt(ss, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, kNegInf, keep, masked);
  return masked;
}

void scalar_inputs(Graph& g) {
  const Dims one{1, 1, 1, 1};
  g.tensor(kScale, one, one, CUDNN_DATA_FLOAT, false, true);
  g.tensor(kNegInf, one, one, CUDNN_DATA_FLOAT, false, true);
}

// O = softmax(mask(scale Q K^T)) V and Stats = rowmax + log(rowsum exp(. - rowmax)).
Graph forward_graph(const Shape& s, cudnnDataType_t io) {
  Graph g;
  const Dims q{s.B, s.NH, s.T, s.HS}, kt{s.B, s.NKV, s.HS, s.T}, v{s.B, s.NKV, s.T, s.HS};
  g.tensor(kQ, q, q_strides(s), io, false);
  g.tensor(kK, kt, kt_strides(s), io, false);
  g.tensor(kV, v, q_strides(s), io, false);
  g.tensor(kO, q, o_strides(s), io, false);
  const Dims row{s.B, s.NH, s.T, 1};
  g.tensor(kStats, row, cudnn::packed_strides(row), CUDNN_DATA_FLOAT, false);
  scalar_inputs(g);

  const Dims ss{s.B, s.NH, s.T, s.T};
  const int64_t S = g.virt(ss, CUDNN_DATA_FLOAT);
  g.matmul(kQ, kK, S);
  const int64_t masked = scaled_causal_scores(g, s, S);
  const int64_t mx = g.virt(row, CUDNN_DATA_FLOAT);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, mx);
  const int64_t shifted = g.virt(ss, CUDNN_DATA_FLOAT), e = g.virt(ss, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, mx, -1, shifted);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, -1, -1, e);
  const int64_t sum = g.virt(row, CUDNN_DATA_FLOAT), logsum = g.virt(row, CUDNN_DATA_FLOAT);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, -1, -1, logsum);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, logsum, -1, kStats);
  const int64_t P = g.virt(ss, io);  // the second matmul takes P in the i/o type
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, -1, P);
  g.matmul(P, kV, kO);
  return g;
}

// dQ, dK, dV from dO, O and Stats (FlashAttention-2's backward, Dao 2023):
//   P = exp(mask(scale Q K^T) - Stats), D = rowsum(dO * O), dS = scale P (dO V^T - D),
//   dV = P^T dO, dK = dS^T Q, dQ = dS K  (dK, dV summed over each kv head's query heads).
// dq_accum: dQ accumulates in an fp32 scratch (atomics across key blocks) and is converted at
// the end; without it cuDNN keeps dP in its workspace and computes dQ without atomics, the
// deterministic form (cudnn-frontend takes the same two forms).
Graph backward_graph(const Shape& s, cudnnDataType_t io, bool dq_accum) {
  Graph g;
  const Dims q{s.B, s.NH, s.T, s.HS}, kt{s.B, s.NKV, s.HS, s.T}, kv{s.B, s.NKV, s.T, s.HS};
  g.tensor(kQ, q, q_strides(s), io, false);
  g.tensor(kK, kt, kt_strides(s), io, false);
  g.tensor(kV, kt, kt_strides(s), io, false);  // V^T
  g.tensor(kO, q, o_strides(s), io, false);
  g.tensor(kDO, q, o_strides(s), io, false);
  g.tensor(kDQ, q, q_strides(s), io, false);
  g.tensor(kDK, kv, q_strides(s), io, false);
  g.tensor(kDV, kv, q_strides(s), io, false);
  const Dims row{s.B, s.NH, s.T, 1}, one{1, 1, 1, 1};
  g.tensor(kStats, row, cudnn::packed_strides(row), CUDNN_DATA_FLOAT, false);
  scalar_inputs(g);
  g.tensor(kOne, one, one, CUDNN_DATA_FLOAT, false, true);
  g.tensor(kSoftmaxSum, row, cudnn::packed_strides(row), CUDNN_DATA_FLOAT, false);

  // D = rowsum(dO * O), materialised in scratch (softmax_sum).
  const int64_t dOO = g.virt(q, CUDNN_DATA_FLOAT), dsum = g.virt(row, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, kDO, kO, -1, dOO);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dOO, dsum);
  g.pointwise(CUDNN_POINTWISE_MUL, dsum, kOne, -1, kSoftmaxSum);

  // P from the saved statistics.
  const Dims ss{s.B, s.NH, s.T, s.T}, ss_t_strides{s.NH * int64_t(s.T) * s.T, int64_t(s.T) * s.T,
                                                    1, s.T};
  const int64_t S = g.virt(ss, CUDNN_DATA_FLOAT);
  g.matmul(kQ, kK, S);
  const int64_t masked = scaled_causal_scores(g, s, S);
  const int64_t shifted = g.virt(ss, CUDNN_DATA_FLOAT), P = g.virt(ss, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, kStats, -1, shifted);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, -1, -1, P);

  // dV = P^T dO (summed over the group when NKV < NH).
  const Dims ss_t{s.B, s.NH, s.T, s.T};
  const int64_t Pt = g.virt(ss_t, io, ss_t_strides);
  g.reshape(P, Pt);
  const bool gqa = s.NKV != s.NH;
  if (!gqa) {
    g.matmul(Pt, kDO, kDV);
  } else {
    const int64_t full = g.virt(q, io);
    g.matmul(Pt, kDO, full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, kDV);
  }

  // dS = scale P (dO V^T - D).
  const int64_t dP = g.virt(ss, CUDNN_DATA_FLOAT);
  g.matmul(kDO, kV, dP);
  const int64_t dPD = g.virt(ss, CUDNN_DATA_FLOAT), dS0 = g.virt(ss, CUDNN_DATA_FLOAT),
                dS = g.virt(ss, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_SUB, dP, kSoftmaxSum, -1, dPD);
  g.pointwise(CUDNN_POINTWISE_MUL, dPD, P, -1, dS0);
  g.pointwise(CUDNN_POINTWISE_MUL, dS0, kScale, -1, dS);

  // dK = dS^T Q (summed over the group when NKV < NH).
  const int64_t dSt = g.virt(ss_t, io, ss_t_strides);
  g.reshape(dS, dSt);
  if (!gqa) {
    g.matmul(dSt, kQ, kDK);
  } else {
    const int64_t full = g.virt(q, io);
    g.matmul(dSt, kQ, full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, kDK);
  }

  // dQ = dS K, K as the transpose of K^T.
  const int64_t K = g.virt(kv, io, q_strides(s));
  g.reshape(kK, K);
  if (dq_accum) {
    g.tensor(kDQAccum, q, cudnn::packed_strides(q), CUDNN_DATA_FLOAT, false);
    g.matmul(dS, K, kDQAccum);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, kDQAccum, -1, -1, kDQ);
  } else {
    g.matmul(dS, K, kDQ);
  }
  return g;
}

// The backward's form and our scratch: kernels/workspace.hpp, shared with the planner.
bool dq_accum_form(const Shape& s, bool deterministic, int sm_major) {
  return cudnn_attention_dq_accum_form(s.B, s.NH, s.T, deterministic, sm_major);
}

struct PlanKey {
  bool backward;
  int dtype, B, T, NH, NKV, HS;
  bool deterministic;
  bool operator<(const PlanKey& o) const {
    return std::tie(backward, dtype, B, T, NH, NKV, HS, deterministic) <
           std::tie(o.backward, o.dtype, o.B, o.T, o.NH, o.NKV, o.HS, o.deterministic);
  }
};

struct CachedPlan {
  Graph::Plan plan;
  bool dq_accum = false;
  std::size_t scratch = 0;  // bytes of our own scratch (softmax_sum, dQ accumulator)
};

// One handle, plan cache and scratch per process (one GPU per rank), released by a Kokkos
// finalize hook like cuBLASLt's state (gemm_lt.cpp).
struct State {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
  int sm_major = 0;
  float neg_inf = -std::numeric_limits<float>::infinity();
  std::map<PlanKey, std::unique_ptr<CachedPlan>> plans;  // null: the graph has no engine
  Kokkos::View<unsigned char*, MemSpace> buffer;
  bool warned_fallback = false;
};

State& state() {
  static State s;
  return s;
}

// Caller holds s.mutex.
void ensure_started(State& s) {
  if (s.handle) return;
  cudnn::check(cudnn::api()->Create(&s.handle), "cudnnCreate");
  int dev = 0;
  MESHTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  MESHTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&s.sm_major, cudaDevAttrComputeCapabilityMajor, dev));
  if (cudnn::api()->GetVersion() < 91000) s.neg_inf = std::numeric_limits<float>::lowest();
  logging::info("attention: cuDNN ", cudnn::api()->GetVersion(), " fused flash attention");
  Kokkos::push_finalize_hook([] {
    State& st = state();
    std::lock_guard<std::mutex> lock(st.mutex);
    st.plans.clear();
    st.buffer = {};
    if (st.handle) cudnn::api()->Destroy(st.handle);
    st.handle = nullptr;
  });
}

// The plan for key (null when cuDNN has no engine for it: automatic falls back to ours).
CachedPlan* plan_for(State& s, const PlanKey& key, const Shape& shape, cudnnDataType_t io) {
  auto it = s.plans.find(key);
  if (it != s.plans.end()) return it->second.get();
  auto cp = std::make_unique<CachedPlan>();
  try {
    if (!key.backward) {
      Graph g = forward_graph(shape, io);
      cp->plan = g.build(s.handle, key.deterministic, "attention forward");
    } else {
      cp->dq_accum = dq_accum_form(shape, key.deterministic, s.sm_major);
      Graph g = backward_graph(shape, io, cp->dq_accum);
      cp->plan = g.build(s.handle, key.deterministic, "attention backward");
      cp->scratch = cudnn_attention_own_scratch_bytes(shape.B, shape.NH, shape.T, shape.HS,
                                                      cp->dq_accum);
    }
  } catch (const Error& e) {
    if (attention_options().impl == AttentionImpl::cudnn) throw;
    logging::warn("attention: cuDNN cannot run B=", shape.B, " T=", shape.T, " NH=", shape.NH,
                  " NKV=", shape.NKV, " HS=", shape.HS, " (", e.what(),
                  "); our kernels run it instead");
    cp.reset();
  }
  CachedPlan* p = cp.get();
  s.plans.emplace(key, std::move(cp));
  return p;
}

// Scratch then cuDNN's workspace, in one buffer grown to the largest plan's need; 256-byte
// aligned pieces. Growing reallocates (a device synchronisation), once per new largest shape.
unsigned char* buffer_for(State& s, std::size_t scratch, int64_t workspace) {
  const std::size_t need = (scratch + 255) / 256 * 256 + std::size_t(workspace) + 512;
  if (s.buffer.extent(0) < need)
    s.buffer = Kokkos::View<unsigned char*, MemSpace>(
        Kokkos::view_alloc("meshtrain::cudnn_attention_scratch", Kokkos::WithoutInitializing),
        need);
  const auto a = reinterpret_cast<std::uintptr_t>(s.buffer.data());
  return reinterpret_cast<unsigned char*>((a + 255) & ~std::uintptr_t(255));
}

template <class T>
constexpr cudnnDataType_t io_type() {
  if constexpr (std::is_same_v<T, bf16>) return CUDNN_DATA_BFLOAT16;
  else return CUDNN_DATA_HALF;
}
template <class T>
inline constexpr bool kCudnnType = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

// Whether this call is cuDNN's: options, library, dtype, head size, alignment.
bool eligible(int HS, std::initializer_list<const void*> ptrs) {
  const AttentionOptions& o = attention_options();
  if (o.impl == AttentionImpl::meshtrain) return false;
  std::string why;
  if (!cudnn::api(&why)) {
    MESHTRAIN_CHECK(o.impl != AttentionImpl::cudnn, "--attn.impl cudnn: ", why);
    return false;
  }
  if (HS != 64 && HS != 128) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}

}  // namespace

template <class T>
bool attention_forward_cudnn(const ExecSpace& exec, View1<T> out, View1<float> lse,
                             View1<const T> qkv, int B, int Tlen, int NH, int HS, int NKV) {
  if constexpr (!kCudnnType<T>) {
    return false;
  } else {
    if (!eligible(HS, {out.data(), qkv.data()})) return false;
    if (B == 0 || Tlen == 0) return true;
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    ensure_started(s);
    const Shape shape{B, Tlen, NH, NKV, HS};
    const PlanKey key{false, int(io_type<T>()), B, Tlen, NH, NKV, HS, false};
    CachedPlan* p = plan_for(s, key, shape, io_type<T>());
    if (p == nullptr) return false;
    cudnn::check(cudnn::api()->SetStream(s.handle, exec.cuda_stream()), "cudnnSetStream");
    unsigned char* ws = buffer_for(s, 0, p->plan.workspace);
    float scale = 1.f / std::sqrt(float(HS)), neg_inf = s.neg_inf;
    auto* base = const_cast<T*>(qkv.data());
    cudnn::execute(s.handle, p->plan, {kQ, kK, kV, kO, kStats, kScale, kNegInf},
                   {base, base + shape.C(), base + shape.C() + shape.Ckv(), out.data(), lse.data(),
                    &scale, &neg_inf},
                   ws);
    return true;
  }
}

template <class T>
bool attention_backward_cudnn(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                              View1<const T> qkv, View1<const T> out, View1<const float> lse,
                              int B, int Tlen, int NH, int HS, int NKV) {
  if constexpr (!kCudnnType<T>) {
    return false;
  } else {
    if (!eligible(HS, {dqkv.data(), dout.data(), qkv.data(), out.data()})) return false;
    if (B == 0 || Tlen == 0) return true;
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    ensure_started(s);
    const bool det = attention_options().deterministic;
    const Shape shape{B, Tlen, NH, NKV, HS};
    const PlanKey key{true, int(io_type<T>()), B, Tlen, NH, NKV, HS, det};
    CachedPlan* p = plan_for(s, key, shape, io_type<T>());
    if (p == nullptr) return false;
    cudaStream_t st = exec.cuda_stream();
    cudnn::check(cudnn::api()->SetStream(s.handle, st), "cudnnSetStream");
    unsigned char* buf = buffer_for(s, p->scratch, p->plan.workspace);
    const std::size_t rows = std::size_t(B) * NH * Tlen;
    auto* softmax_sum = reinterpret_cast<float*>(buf);
    float* dq_accum = softmax_sum + rows;
    unsigned char* ws = buf + (p->scratch + 255) / 256 * 256;
    // The accumulator is summed into with atomics: it starts at zero (cuDNN < 9.6 expects the
    // caller to clear it; later versions clear it themselves, clearing twice is harmless).
    if (p->dq_accum)
      MESHTRAIN_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, rows * HS * sizeof(float), st));
    float scale = 1.f / std::sqrt(float(HS)), neg_inf = s.neg_inf, one = 1.f;
    auto* q = const_cast<T*>(qkv.data());
    T* dq = dqkv.data();
    const int64_t C = shape.C(), Ckv = shape.Ckv();
    std::vector<int64_t> uids{kQ,  kK,  kV,  kO,     kDO,     kStats, kDQ,
                              kDK, kDV, kScale, kNegInf, kOne, kSoftmaxSum};
    std::vector<void*> ptrs{q,      q + C,    q + C + Ckv,  const_cast<T*>(out.data()),
                            const_cast<T*>(dout.data()), const_cast<float*>(lse.data()),
                            dq,     dq + C,   dq + C + Ckv, &scale,
                            &neg_inf, &one,   softmax_sum};
    if (p->dq_accum) {
      uids.push_back(kDQAccum);
      ptrs.push_back(dq_accum);
    }
    cudnn::execute(s.handle, p->plan, uids, ptrs, ws);
    return true;
  }
}

#define MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN(T)                                                \
  template bool attention_forward_cudnn<T>(const ExecSpace&, View1<T>, View1<float>,            \
                                           View1<const T>, int, int, int, int, int);            \
  template bool attention_backward_cudnn<T>(const ExecSpace&, View1<T>, View1<const T>,         \
                                            View1<const T>, View1<const T>, View1<const float>, \
                                            int, int, int, int, int);
MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN(float)
MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN(double)
MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN(bf16)
MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN(fp16)
#undef MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN

}  // namespace detail
}  // namespace meshtrain::kernels

#endif
