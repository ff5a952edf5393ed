#include "meshtrain/core/profile.hpp"

#include <cstdio>

#include "meshtrain/core/error.hpp"

#if defined(MESHTRAIN_HAVE_CUDA)
#include <cuda_profiler_api.h>
#include <nvtx3/nvToolsExt.h>
#endif

namespace meshtrain::prof {

std::string bytes_label(std::size_t bytes) {
  char buf[32];
  if (bytes < 1024) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else if (bytes < (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  else if (bytes < (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  else std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  return buf;
}

StepRange parse_step_range(const std::string& text, const char* option) {
  StepRange r;
  if (text.empty()) return r;
  auto number = [&](const std::string& t) {
    MESHTRAIN_CONFIG_CHECK(!t.empty() && t.size() < 16 &&
                               t.find_first_not_of("0123456789") == std::string::npos,
                           option, "='", text, "' is not A:B (steps, 1-based, A <= B) or A");
    return static_cast<std::int64_t>(std::stoll(t));
  };
  const auto colon = text.find(':');
  r.first = number(text.substr(0, colon));
  r.last = colon == std::string::npos ? r.first : number(text.substr(colon + 1));
  MESHTRAIN_CONFIG_CHECK(r.first >= 1 && r.first <= r.last, option, "='", text,
                         "' must be A:B with 1 <= A <= B (steps as the progress lines count)");
  return r;
}

#if defined(MESHTRAIN_HAVE_CUDA)
namespace {

// NVTX 3 (header-only, from the CUDA toolkit): without a tool attached (nsys) each call returns
// at once; with one, the ranges show under the "meshtrain" domain on the rank's CPU row.
class NvtxSink final : public RangeSink {
 public:
  NvtxSink() : domain_(nvtxDomainCreateA("meshtrain")) {}
  void push(const std::string& name) override {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name.c_str();
    nvtxDomainRangePushEx(domain_, &a);
  }
  void pop() override { nvtxDomainRangePop(domain_); }

 private:
  nvtxDomainHandle_t domain_;
};

void cuda_start() { cudaProfilerStart(); }
void cuda_stop() { cudaProfilerStop(); }

}  // namespace

RangeSink* nvtx_sink() {
  static NvtxSink sink;
  return &sink;
}

bool install_cuda_profiler() {
  set_capture(cuda_start, cuda_stop);
  return true;
}
#else
RangeSink* nvtx_sink() { return nullptr; }
bool install_cuda_profiler() { return false; }
#endif

}  // namespace meshtrain::prof
