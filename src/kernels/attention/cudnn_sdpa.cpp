// cuDNN's fused flash attention (cudnn_sdpa.hpp): the SDPA forward and backward written as
// cuDNN backend operation graphs of matmul, scale, (causal mask,) softmax and matmul, which
// cuDNN's runtime-fusion engines recognise and compile into one flash kernel each (the graphs
// that cudnn-frontend's SDPA nodes lower to; cuDNN developer guide, "Scaled Dot Product
// Attention"). No cudnn-frontend: it is not packaged, the graphs are short.
//
// Grouped-query attention: K and V have NKV heads; the Q.K^T and dO.V^T matmuls broadcast each
// over its NH / NKV query heads, and dK, dV are computed per query head and summed over each
// group by a reduction, which cuDNN fuses.
//
// Plans: one per (direction, dtype, deterministic, SdpaShape::key()), built on first use and
// kept for the process (the engine search takes ~0.1-1 s; a training run has a few shapes).
// Workspace and scratch are one growing device buffer shared by all plans.
#include "cudnn_sdpa.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN)
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "cudnn_graph.hpp"
#include "meshtrain/core/cuda_check.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/kernels/attention/attention.hpp"
#include "meshtrain/kernels/workspace.hpp"

namespace meshtrain::kernels::detail::cudnn {

namespace {

// Tensor ids of the variant packs.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDQAccum
};

// An operand of NH or NKV heads in place ([b, h, s, d]); K^T and V^T swap the last two.
Dims rows(const SdpaShape& s, const Rows& r) { return {r.batch, s.HS, r.row, 1}; }
Dims transposed(const SdpaShape& s, const Rows& r) { return {r.batch, s.HS, 1, r.row}; }
Dims stats_strides(const SdpaShape& s) { return {s.stats_batch, s.stats_head, 1, 1}; }

// scale, then for a causal shape the mask: keys after the query get -inf (lowest() before
// cuDNN 9.10, which preferred a finite mask value), as cuDNN's SDPA pattern expects them.
int64_t scaled_scores(Graph& g, const SdpaShape& s, int64_t S) {
  const Dims ss{s.B, s.NH, s.Tq, s.Tk};
  const int64_t scaled = g.virt(ss, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, S, kScale, -1, scaled);
  if (!s.causal) return scaled;
  const int64_t row = g.virt(ss, CUDNN_DATA_INT32), col = g.virt(ss, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, -1, -1, row, CUDNN_DATA_INT32, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, -1, -1, col, CUDNN_DATA_INT32, 3);
  const int64_t keep = g.virt(ss, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, -1, keep, CUDNN_DATA_BOOLEAN);
  const int64_t masked = g.virt(ss, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, kNegInf, keep, masked);
  return masked;
}

// The host scalars: scale, and the mask's value where there is a mask (a tensor the graph does
// not use has no place in it or in the variant pack).
void scalar_inputs(Graph& g, const SdpaShape& s) {
  const Dims one{1, 1, 1, 1};
  g.tensor(kScale, one, one, CUDNN_DATA_FLOAT, false, true);
  if (s.causal) g.tensor(kNegInf, one, one, CUDNN_DATA_FLOAT, false, true);
}

// O = softmax(mask(scale Q K^T)) V and Stats = rowmax + log(rowsum exp(. - rowmax)).
Graph forward_graph(const SdpaShape& s, cudnnDataType_t io) {
  Graph g;
  const Dims q{s.B, s.NH, s.Tq, s.HS}, kt{s.B, s.NKV, s.HS, s.Tk}, v{s.B, s.NKV, s.Tk, s.HS};
  g.tensor(kQ, q, rows(s, s.q), io, false);
  g.tensor(kK, kt, transposed(s, s.k), io, false);
  g.tensor(kV, v, rows(s, s.v), io, false);
  g.tensor(kO, q, rows(s, s.o), io, false);
  const Dims row{s.B, s.NH, s.Tq, 1};
  g.tensor(kStats, row, stats_strides(s), CUDNN_DATA_FLOAT, false);
  scalar_inputs(g, s);

  const Dims ss{s.B, s.NH, s.Tq, s.Tk};
  const int64_t S = g.virt(ss, CUDNN_DATA_FLOAT);
  g.matmul(kQ, kK, S);
  const int64_t masked = scaled_scores(g, s, S);
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
Graph backward_graph(const SdpaShape& s, cudnnDataType_t io, bool dq_accum) {
  Graph g;
  const Dims q{s.B, s.NH, s.Tq, s.HS}, kt{s.B, s.NKV, s.HS, s.Tk}, kv{s.B, s.NKV, s.Tk, s.HS};
  g.tensor(kQ, q, rows(s, s.q), io, false);
  g.tensor(kK, kt, transposed(s, s.k), io, false);
  g.tensor(kV, kt, transposed(s, s.v), io, false);  // V^T
  g.tensor(kO, q, rows(s, s.o), io, false);
  g.tensor(kDO, q, rows(s, s.dout), io, false);
  g.tensor(kDQ, q, rows(s, s.dq), io, false);
  g.tensor(kDK, kv, rows(s, s.dk), io, false);
  g.tensor(kDV, kv, rows(s, s.dv), io, false);
  const Dims row{s.B, s.NH, s.Tq, 1}, one{1, 1, 1, 1};
  g.tensor(kStats, row, stats_strides(s), CUDNN_DATA_FLOAT, false);
  scalar_inputs(g, s);
  g.tensor(kOne, one, one, CUDNN_DATA_FLOAT, false, true);
  g.tensor(kSoftmaxSum, row, packed_strides(row), CUDNN_DATA_FLOAT, false);

  // D = rowsum(dO * O), materialised in scratch (softmax_sum).
  const int64_t dOO = g.virt(q, CUDNN_DATA_FLOAT), dsum = g.virt(row, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, kDO, kO, -1, dOO);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dOO, dsum);
  g.pointwise(CUDNN_POINTWISE_MUL, dsum, kOne, -1, kSoftmaxSum);

  // P from the saved statistics. P^T and dS^T: [b, h, key, query] views of the packed
  // [b, h, query, key] scores.
  const int64_t TqTk = int64_t(s.Tq) * s.Tk;
  const Dims ss{s.B, s.NH, s.Tq, s.Tk}, ss_t{s.B, s.NH, s.Tk, s.Tq},
      ss_t_strides{s.NH * TqTk, TqTk, 1, s.Tk};
  const int64_t S = g.virt(ss, CUDNN_DATA_FLOAT);
  g.matmul(kQ, kK, S);
  const int64_t masked = scaled_scores(g, s, S);
  const int64_t shifted = g.virt(ss, CUDNN_DATA_FLOAT), P = g.virt(ss, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, kStats, -1, shifted);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, -1, -1, P);

  // dV = P^T dO (summed over the group when NKV < NH).
  const Dims per_query_head{s.B, s.NH, s.Tk, s.HS};
  const int64_t Pt = g.virt(ss_t, io, ss_t_strides);
  g.reshape(P, Pt);
  // a b into out, per query head and then summed over each kv head's group where NKV < NH.
  const auto matmul_per_kv_head = [&](int64_t a, int64_t b, int64_t out) {
    if (s.NKV == s.NH) {
      g.matmul(a, b, out);
      return;
    }
    const int64_t full = g.virt(per_query_head, io);
    g.matmul(a, b, full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };
  matmul_per_kv_head(Pt, kDO, kDV);

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
  matmul_per_kv_head(dSt, kQ, kDK);

  // dQ = dS K, K as the transpose of K^T.
  const int64_t K = g.virt(kv, io, rows(s, s.k));
  g.reshape(kK, K);
  if (dq_accum) {
    g.tensor(kDQAccum, q, packed_strides(q), CUDNN_DATA_FLOAT, false);
    g.matmul(dS, K, kDQAccum);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, kDQAccum, -1, -1, kDQ);
  } else {
    g.matmul(dS, K, kDQ);
  }
  return g;
}

struct PlanKey {
  bool backward;
  int dtype;
  bool deterministic;
  std::vector<int64_t> shape;
  bool operator<(const PlanKey& o) const {
    return std::tie(backward, dtype, deterministic, shape) <
           std::tie(o.backward, o.dtype, o.deterministic, o.shape);
  }
};

std::string label(const SdpaShape& s) {
  return cat("B=", s.B, " Tq=", s.Tq, " Tk=", s.Tk, " NH=", s.NH, " NKV=", s.NKV, " HS=", s.HS,
             s.causal ? " causal" : " full");
}

}  // namespace

std::vector<int64_t> SdpaShape::key() const {
  std::vector<int64_t> ints{B, Tq, Tk, NH, NKV, HS, causal ? 1 : 0, stats_batch, stats_head};
  for (const Rows* r : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) {
    ints.push_back(r->batch);
    ints.push_back(r->row);
  }
  return ints;
}

struct CachedPlan {
  Graph::Plan plan;
  bool dq_accum = false;
  std::size_t scratch = 0;  // bytes of our own scratch (softmax_sum, dQ accumulator)
};

// One handle, plan cache and buffer per process (one GPU per rank), released by a Kokkos
// finalize hook like cuBLASLt's state (gemm_lt.cpp).
struct State {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
  int sm_major = 0;
  float neg_inf = -std::numeric_limits<float>::infinity();
  std::map<PlanKey, std::unique_ptr<CachedPlan>> plans;  // null: the graph has no engine
  Kokkos::View<unsigned char*, MemSpace> buffer;
};

namespace {

State& state() {
  static State s;
  return s;
}

// Caller holds s.mutex.
void ensure_started(State& s) {
  if (s.handle) return;
  check(api()->Create(&s.handle), "cudnnCreate");
  int dev = 0;
  MESHTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  MESHTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&s.sm_major, cudaDevAttrComputeCapabilityMajor, dev));
  if (api()->GetVersion() < 91000) s.neg_inf = std::numeric_limits<float>::lowest();
  logging::info("attention: cuDNN ", api()->GetVersion(), " fused flash attention");
  Kokkos::push_finalize_hook([] {
    State& st = state();
    std::lock_guard<std::mutex> lock(st.mutex);
    st.plans.clear();
    st.buffer = {};
    if (st.handle) api()->Destroy(st.handle);
    st.handle = nullptr;
  });
}

constexpr std::size_t round256(std::size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

bool eligible(int HS, std::initializer_list<const void*> ptrs,
              std::initializer_list<int64_t> strides) {
  const AttentionOptions& o = attention_options();
  if (o.impl == AttentionImpl::meshtrain) return false;
  std::string why;
  if (!api(&why)) {
    MESHTRAIN_CHECK(o.impl != AttentionImpl::cudnn, "--attn.impl cudnn: ", why);
    return false;
  }
  if (HS != 64 && HS != 128) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  for (int64_t st : strides)
    if (st % 8 != 0) return false;
  return true;
}

Sdpa::Sdpa(const ExecSpace& exec) : s_(state()), lock_(s_.mutex), stream_(exec.cuda_stream()) {
  ensure_started(s_);
  check(api()->SetStream(s_.handle, stream_), "cudnnSetStream");
}

Sdpa::~Sdpa() = default;

bool Sdpa::plan(bool backward, cudnnDataType_t io, const SdpaShape& shape) {
  MESHTRAIN_CHECK(!shape.causal || shape.Tq == shape.Tk,
                  "cuDNN attention: a causal shape needs Tq == Tk (", label(shape), ")");
  const bool det = backward && attention_options().deterministic;
  const PlanKey key{backward, int(io), det, shape.key()};
  shape_ = shape;
  own_ = workspace_ = nullptr;
  auto it = s_.plans.find(key);
  if (it == s_.plans.end()) {
    auto cp = std::make_unique<CachedPlan>();
    try {
      if (!backward) {
        cp->plan = forward_graph(shape, io).build(s_.handle, false, "attention forward");
      } else {
        cp->dq_accum = cudnn_attention_dq_accum_form(shape.B, shape.NH, shape.Tq, shape.Tk, det,
                                                     s_.sm_major);
        cp->plan = backward_graph(shape, io, cp->dq_accum)
                       .build(s_.handle, det, "attention backward");
        cp->scratch = cudnn_attention_own_scratch_bytes(shape.B, shape.NH, shape.Tq, shape.HS,
                                                        cp->dq_accum);
      }
    } catch (const Error& e) {
      if (attention_options().impl == AttentionImpl::cudnn) throw;
      logging::warn("attention: cuDNN cannot run the ", backward ? "backward" : "forward", " of ",
                    label(shape), " (", e.what(), "); our kernels run it instead");
      cp.reset();
    }
    it = s_.plans.emplace(key, std::move(cp)).first;
  }
  plan_ = it->second.get();
  return plan_ != nullptr;
}

// Our scratch, the caller's and cuDNN's workspace, in one buffer grown to the largest need;
// 256-byte aligned pieces. Growing reallocates (a device synchronisation), once per new
// largest shape.
unsigned char* Sdpa::scratch(std::size_t bytes) {
  MESHTRAIN_CHECK(plan_ != nullptr, "cuDNN attention: scratch() before a plan");
  const std::size_t own = round256(plan_->scratch), mine = round256(bytes);
  const std::size_t need = own + mine + std::size_t(plan_->plan.workspace) + 512;
  if (s_.buffer.extent(0) < need)
    s_.buffer = Kokkos::View<unsigned char*, MemSpace>(
        Kokkos::view_alloc("meshtrain::cudnn_attention_scratch", Kokkos::WithoutInitializing),
        need);
  const auto a = reinterpret_cast<std::uintptr_t>(s_.buffer.data());
  own_ = reinterpret_cast<unsigned char*>((a + 255) & ~std::uintptr_t(255));
  workspace_ = own_ + own + mine;
  return own_ + own;
}

void Sdpa::forward(const ForwardPtrs& p) {
  if (!own_) scratch(0);
  float scale = 1.f / std::sqrt(float(shape_.HS)), neg_inf = s_.neg_inf;
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs{const_cast<void*>(p.q), const_cast<void*>(p.k),
                          const_cast<void*>(p.v), p.o, p.stats, &scale};
  if (shape_.causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
  }
  execute(s_.handle, plan_->plan, uids, ptrs, workspace_);
}

void Sdpa::backward(const BackwardPtrs& p) {
  if (!own_) scratch(0);
  const std::size_t n_rows = std::size_t(shape_.B) * shape_.NH * shape_.Tq;
  auto* softmax_sum = reinterpret_cast<float*>(own_);
  float* dq_accum = softmax_sum + n_rows;
  // The accumulator is summed into with atomics: it starts at zero (cuDNN < 9.6 expects the
  // caller to clear it; later versions clear it themselves, clearing twice is harmless).
  if (plan_->dq_accum)
    MESHTRAIN_CUDA_CHECK(
        cudaMemsetAsync(dq_accum, 0, n_rows * shape_.HS * sizeof(float), stream_));
  float scale = 1.f / std::sqrt(float(shape_.HS)), neg_inf = s_.neg_inf, one = 1.f;
  std::vector<int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kOne,
                            kSoftmaxSum};
  std::vector<void*> ptrs{const_cast<void*>(p.q),    const_cast<void*>(p.k),
                          const_cast<void*>(p.v),    const_cast<void*>(p.o),
                          const_cast<void*>(p.dout), const_cast<float*>(p.stats),
                          p.dq,                      p.dk,
                          p.dv,                      &scale,
                          &one,                      softmax_sum};
  if (shape_.causal) {
    uids.push_back(kNegInf);
    ptrs.push_back(&neg_inf);
  }
  if (plan_->dq_accum) {
    uids.push_back(kDQAccum);
    ptrs.push_back(dq_accum);
  }
  execute(s_.handle, plan_->plan, uids, ptrs, workspace_);
}

}  // namespace meshtrain::kernels::detail::cudnn

#endif
