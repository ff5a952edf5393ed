#pragma once
// Private to src/kernels/: cuDNN 9's C backend API (cudnn_graph.h), loaded at run time.
//
// Why dlopen: the binary must run where cuDNN comes only from a Python wheel
// (nvidia-cudnn-cu13, what PyTorch installs), outside the toolkit's library path, and on
// machines with no cuDNN at all (then attention runs our kernels). Only the header is needed to
// build; libcudnn.so.9 is looked up through the dynamic loader's path and, failing that, in
// $MESHTRAIN_CUDNN_LIB_DIR (jobs/bundle-gpu.sh's env.sh sets both).
//
// Descriptor is an owning handle of one backend descriptor; the set/get helpers check every
// status and throw with the call, the attribute and cuDNN's own last error message.
#include <Kokkos_Macros.hpp>  // KOKKOS_ENABLE_CUDA

#if defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN)
#include <cudnn_graph.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::kernels::detail::cudnn {

// The entry points used, resolved from libcudnn.so.9.
struct Api {
  size_t (*GetVersion)();
  const char* (*GetErrorString)(cudnnStatus_t);
  void (*GetLastErrorString)(char*, size_t);  // null before cuDNN 9.0
  cudnnStatus_t (*Create)(cudnnHandle_t*);
  cudnnStatus_t (*Destroy)(cudnnHandle_t);
  cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
  cudnnStatus_t (*BackendCreateDescriptor)(cudnnBackendDescriptorType_t,
                                           cudnnBackendDescriptor_t*);
  cudnnStatus_t (*BackendDestroyDescriptor)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*BackendSetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, const void*);
  cudnnStatus_t (*BackendGetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, int64_t*, void*);
  cudnnStatus_t (*BackendFinalize)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*BackendExecute)(cudnnHandle_t, cudnnBackendDescriptor_t,
                                  cudnnBackendDescriptor_t);
};

// The loaded API, or null with `why` set (library not found, symbol missing, version < 9).
// Loads once per process; thread-safe.
const Api* api(std::string* why = nullptr);

// Throws Error("cuDNN <what> failed: <status> (<cuDNN's last message>)") unless ok.
void check(cudnnStatus_t status, const char* what);

class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(Descriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Descriptor& operator=(Descriptor&& o) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  explicit operator bool() const { return d_ != nullptr; }

  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  int64_t count, const void* values);
  Descriptor& set_i64(cudnnBackendAttributeName_t name, const std::vector<int64_t>& v);
  Descriptor& set_i64(cudnnBackendAttributeName_t name, int64_t v);
  Descriptor& set_dtype(cudnnBackendAttributeName_t name, cudnnDataType_t v);
  Descriptor& set_bool(cudnnBackendAttributeName_t name, bool v);
  Descriptor& set_desc(cudnnBackendAttributeName_t name, const Descriptor& d);
  Descriptor& set_descs(cudnnBackendAttributeName_t name,
                        const std::vector<cudnnBackendDescriptor_t>& ds);
  void finalize();
  // Finalize, returning the status instead of throwing (engine configs that do not apply).
  cudnnStatus_t try_finalize();

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

}  // namespace meshtrain::kernels::detail::cudnn

#endif
