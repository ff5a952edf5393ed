// The operation-graph builder, engine search and execution of cudnn_graph.hpp.
#include "cudnn_graph.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN)
#include "meshtrain/core/error.hpp"

namespace meshtrain::kernels::detail::cudnn {

namespace {
// The handle attributes of the operation graph and the plan, deprecated (not removed) in
// cuDNN 9.x in favour of device properties; every 9.x accepts them. By value, to keep the
// deprecation warning out of the build.
constexpr auto kGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);
constexpr auto kPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);

// Every pointer handed to the graphs is 16-byte aligned (attention_cudnn.cpp checks it).
constexpr int64_t kAlignment = 16;
}  // namespace

Dims packed_strides(const Dims& dims) {
  Dims s(dims.size(), 1);
  for (int i = int(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

int64_t Graph::tensor(int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type,
                      bool is_virtual, bool by_value) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, type)
      .set_i64(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
      .set_i64(CUDNN_ATTR_TENSOR_STRIDES, strides)
      .set_i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
      .set_i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, kAlignment)
      .set_bool(CUDNN_ATTR_TENSOR_IS_VIRTUAL, is_virtual);
  if (by_value) t.set_bool(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
  t.finalize();
  tensors_.emplace(uid, std::move(t));
  info_[uid] = Info{dims, type};
  return uid;
}

int64_t Graph::virt(const Dims& dims, cudnnDataType_t type, const Dims& strides) {
  return tensor(next_virtual_++, dims, strides.empty() ? packed_strides(dims) : strides, type,
                true);
}

void Graph::pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t b, int64_t t, int64_t y,
                      cudnnDataType_t prec, int64_t axis) {
  Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set_dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, prec);
  if (axis >= 0) pw.set_i64(CUDNN_ATTR_POINTWISE_AXIS, axis);
  pw.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, desc(x));
  if (b >= 0) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, desc(b));
  if (t >= 0) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, desc(t));
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, desc(y));
  op.finalize();
  ops_.push_back(std::move(op));
}

void Graph::reduction(cudnnReduceTensorOp_t mode, int64_t x, int64_t y) {
  Descriptor r(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode)
      .set_dtype(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
  r.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r)
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, desc(x))
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, desc(y));
  op.finalize();
  ops_.push_back(std::move(op));
}

void Graph::matmul(int64_t a, int64_t b, int64_t c) {
  Descriptor m(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  m.set_dtype(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
  m.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, desc(a))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, desc(b))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, desc(c))
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
  op.finalize();
  ops_.push_back(std::move(op));
}

void Graph::reshape(int64_t x, int64_t y) {
  Descriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, desc(x))
      .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, desc(y));
  op.finalize();
  ops_.push_back(std::move(op));
}

namespace {

// The engine configurations that heuristics `mode` proposes for the graph.
std::vector<Descriptor> engine_configs(const Descriptor& graph, cudnnBackendHeurMode_t mode) {
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (heur.try_finalize() != CUDNN_STATUS_SUCCESS) return {};
  int64_t count = 0;
  check(api()->BackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
        "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS count)");
  std::vector<Descriptor> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(cfgs.back().get());
  }
  int64_t got = 0;
  if (count > 0)
    check(api()->BackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
          "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)");
  cfgs.resize(std::size_t(got));
  return cfgs;
}

// Whether the engine behind a configuration carries cuDNN's NONDETERMINISTIC note.
bool nondeterministic(const Descriptor& cfg) {
  Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  int64_t n = 0;
  if (api()->BackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e) != CUDNN_STATUS_SUCCESS)
    return true;  // unknown: not for a deterministic run
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t count = 0;
  if (api()->BackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count,
                                 notes) != CUDNN_STATUS_SUCCESS)
    return true;
  for (int64_t i = 0; i < count; ++i)
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
  return false;
}

}  // namespace

Graph::Plan Graph::build(cudnnHandle_t handle, bool deterministic, const char* what) {
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Descriptor& d : ops_) ops.push_back(d.get());
  graph.set_descs(CUDNN_ATTR_OPERATIONGRAPH_OPS, ops)
      .set(kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle);
  graph.finalize();
  int tried = 0;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (Descriptor& cfg : engine_configs(graph, mode)) {
      if (deterministic && nondeterministic(cfg)) continue;
      ++tried;
      Plan p{Descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR), 0};
      p.plan.set(kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle)
          .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
      if (p.plan.try_finalize() != CUDNN_STATUS_SUCCESS) continue;
      int64_t n = 0;
      check(api()->BackendGetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &n, &p.workspace),
            "cudnnBackendGetAttribute(EXECUTION_PLAN_WORKSPACE_SIZE)");
      return p;
    }
  }
  throw Error(cat("cuDNN has no engine for the ", what, " graph (", tried,
                  " configurations tried", deterministic ? ", deterministic only" : "",
                  "); run with --attn.impl meshtrain"));
}

void execute(cudnnHandle_t handle, const Graph::Plan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& ptrs, void* workspace) {
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()),
           ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  check(api()->BackendExecute(handle, plan.plan.get(), pack.get()), "cudnnBackendExecute");
}

}  // namespace meshtrain::kernels::detail::cudnn

#endif
