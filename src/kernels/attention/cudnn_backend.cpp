// Loading libcudnn.so.9 and the checked descriptor handle of cudnn_backend.hpp.
#include "cudnn_backend.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN)
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "meshtrain/core/error.hpp"

namespace meshtrain::kernels::detail::cudnn {

namespace {

struct Loaded {
  Api api{};
  bool ok = false;
  std::string why;
};

template <class F>
bool resolve(void* lib, const char* name, F& fn, std::string& why) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) why = cat("libcudnn.so.9 has no symbol ", name);
  return fn != nullptr;
}

Loaded load() {
  Loaded r;
  // RTLD_GLOBAL: libcudnn.so.9 is a dispatcher that dlopens libcudnn_graph.so.9 and the engine
  // libraries next to it; they must see each other's symbols.
  void* lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
  std::string first = lib ? "" : dlerror();
  if (lib == nullptr) {
    if (const char* dir = std::getenv("MESHTRAIN_CUDNN_LIB_DIR"); dir != nullptr && *dir) {
      const std::string path = std::string(dir) + "/libcudnn.so.9";
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (lib == nullptr) first += cat("; ", dlerror());
    }
  }
  if (lib == nullptr) {
    r.why = cat("libcudnn.so.9 not found (", first,
                "); put its folder on LD_LIBRARY_PATH or in MESHTRAIN_CUDNN_LIB_DIR, e.g. "
                "the nvidia/cudnn/lib folder of the nvidia-cudnn-cu13 wheel");
    return r;
  }
  Api& a = r.api;
  bool ok = resolve(lib, "cudnnGetVersion", a.GetVersion, r.why) &&
            resolve(lib, "cudnnGetErrorString", a.GetErrorString, r.why) &&
            resolve(lib, "cudnnCreate", a.Create, r.why) &&
            resolve(lib, "cudnnDestroy", a.Destroy, r.why) &&
            resolve(lib, "cudnnSetStream", a.SetStream, r.why) &&
            resolve(lib, "cudnnBackendCreateDescriptor", a.BackendCreateDescriptor, r.why) &&
            resolve(lib, "cudnnBackendDestroyDescriptor", a.BackendDestroyDescriptor, r.why) &&
            resolve(lib, "cudnnBackendSetAttribute", a.BackendSetAttribute, r.why) &&
            resolve(lib, "cudnnBackendGetAttribute", a.BackendGetAttribute, r.why) &&
            resolve(lib, "cudnnBackendFinalize", a.BackendFinalize, r.why) &&
            resolve(lib, "cudnnBackendExecute", a.BackendExecute, r.why);
  if (!ok) return r;
  a.GetLastErrorString =
      reinterpret_cast<void (*)(char*, size_t)>(dlsym(lib, "cudnnGetLastErrorString"));
  // The SDPA graphs built here (GQA dK/dV reductions, the dP-workspace backward) need 9.0.
  const size_t v = a.GetVersion();
  if (v < 90000) {
    r.why = cat("libcudnn.so.9 reports version ", v, "; cuDNN attention needs 9.0 or newer");
    return r;
  }
  r.ok = true;
  return r;
}

}  // namespace

const Api* api(std::string* why) {
  static const Loaded loaded = load();  // thread-safe initialisation (C++11)
  if (why) *why = loaded.why;
  return loaded.ok ? &loaded.api : nullptr;
}

void check(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  const Api* a = api();
  std::string last;
  if (a && a->GetLastErrorString) {
    char buf[1024] = {};
    a->GetLastErrorString(buf, sizeof buf);
    last = buf;
  }
  throw Error(cat("cuDNN ", what, " failed: ", a ? a->GetErrorString(status) : "?", " (status ",
                  int(status), last.empty() ? "" : "; ", last, ")"));
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  check(api()->BackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor");
}

Descriptor::~Descriptor() {
  if (d_) api()->BackendDestroyDescriptor(d_);
}

Descriptor& Descriptor::operator=(Descriptor&& o) noexcept {
  if (this != &o) {
    if (d_) api()->BackendDestroyDescriptor(d_);
    d_ = std::exchange(o.d_, nullptr);
  }
  return *this;
}

Descriptor& Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                            int64_t count, const void* values) {
  const cudnnStatus_t s = api()->BackendSetAttribute(d_, name, type, count, values);
  if (s != CUDNN_STATUS_SUCCESS)
    check(s, cat("cudnnBackendSetAttribute(attribute ", int(name), ")").c_str());
  return *this;
}
Descriptor& Descriptor::set_i64(cudnnBackendAttributeName_t name, const std::vector<int64_t>& v) {
  return set(name, CUDNN_TYPE_INT64, int64_t(v.size()), v.data());
}
Descriptor& Descriptor::set_i64(cudnnBackendAttributeName_t name, int64_t v) {
  return set(name, CUDNN_TYPE_INT64, 1, &v);
}
Descriptor& Descriptor::set_dtype(cudnnBackendAttributeName_t name, cudnnDataType_t v) {
  return set(name, CUDNN_TYPE_DATA_TYPE, 1, &v);
}
Descriptor& Descriptor::set_bool(cudnnBackendAttributeName_t name, bool v) {
  return set(name, CUDNN_TYPE_BOOLEAN, 1, &v);
}
Descriptor& Descriptor::set_desc(cudnnBackendAttributeName_t name, const Descriptor& d) {
  cudnnBackendDescriptor_t p = d.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
}
Descriptor& Descriptor::set_descs(cudnnBackendAttributeName_t name,
                                  const std::vector<cudnnBackendDescriptor_t>& ds) {
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ds.size()), ds.data());
}
void Descriptor::finalize() { check(api()->BackendFinalize(d_), "cudnnBackendFinalize"); }
cudnnStatus_t Descriptor::try_finalize() { return api()->BackendFinalize(d_); }

}  // namespace meshtrain::kernels::detail::cudnn

#endif
