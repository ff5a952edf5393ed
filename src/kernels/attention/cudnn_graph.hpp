#pragma once
// Private to src/kernels/: a small builder of cuDNN backend operation graphs (tensors,
// pointwise, reduction, matmul and reshape operations), the engine search that turns one into
// an execution plan, and the variant pack that runs it. What attention_cudnn.cpp composes the
// SDPA graphs from; nothing here knows about attention.
#include <Kokkos_Macros.hpp>  // KOKKOS_ENABLE_CUDA

#if defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN)
#include <map>
#include <vector>

#include "cudnn_backend.hpp"

namespace meshtrain::kernels::detail::cudnn {

using Dims = std::vector<int64_t>;

// Row-major strides of dims (the layout of every virtual intermediate).
Dims packed_strides(const Dims& dims);

class Graph {
 public:
  // A tensor with id `uid` (the id that the variant pack binds a pointer to; for virtual
  // tensors any id not used otherwise). by_value: a host scalar passed at execution.
  int64_t tensor(int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type,
                 bool is_virtual, bool by_value = false);
  // A virtual tensor with a fresh id.
  int64_t virt(const Dims& dims, cudnnDataType_t type, const Dims& strides = {});

  // y = mode(x[, b][, t]) elementwise with math precision prec; axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t b, int64_t t, int64_t y,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1);
  // y = reduction of x onto y's dims (size-1 or grouped dims reduced).
  void reduction(cudnnReduceTensorOp_t op, int64_t x, int64_t y);
  // c = a @ b over the last two dims, batched over the first two, fp32 accumulation.
  void matmul(int64_t a, int64_t b, int64_t c);
  // y = x viewed through y's dims and strides (a transpose when they are swapped).
  void reshape(int64_t x, int64_t y);

  const Dims& dims(int64_t uid) const { return info_.at(uid).dims; }

  // The operation graph's first engine configuration (heuristics mode A, then the fallback
  // list) that finalizes into an execution plan; with deterministic, engines with cuDNN's
  // NONDETERMINISTIC numerical note are skipped. Throws when none does.
  struct Plan {
    Descriptor plan;
    int64_t workspace = 0;
  };
  Plan build(cudnnHandle_t handle, bool deterministic, const char* what);

 private:
  struct Info {
    Dims dims;
    cudnnDataType_t type;
  };
  const Descriptor& desc(int64_t uid) const { return tensors_.at(uid); }
  std::map<int64_t, Descriptor> tensors_;
  std::map<int64_t, Info> info_;
  std::vector<Descriptor> ops_;
  int64_t next_virtual_ = 1000;
};

// Runs a plan with the given (uid, device or host pointer) bindings and workspace.
void execute(cudnnHandle_t handle, const Graph::Plan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& ptrs, void* workspace);

}  // namespace meshtrain::kernels::detail::cudnn

#endif
