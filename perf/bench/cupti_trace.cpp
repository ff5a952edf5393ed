// A CUDA injection library that writes the GPU timeline of any process: every kernel, copy and
// memset with its start and end on the device clock, and the host's synchronizations. Nothing is
// fenced, so the timeline is the step as it runs (our bench_train_step's per-kernel profile
// fences around every kernel, which adds its own gaps). Works the same for meshtrain and for a
// PyTorch process, which is what makes the two comparable kernel by kernel.
//   CUDA_INJECTION64_PATH=/path/libmeshtrain_cupti_trace.so MESHTRAIN_CUPTI_OUT=trace.csv CMD
// "%p" in MESHTRAIN_CUPTI_OUT becomes the process id: `meshtrain train` run without mpirun
// starts Open MPI's helper processes under the same environment, and they opened (and
// truncated) the one file too. Each process initializes once; later calls are ignored.
// Then perf/tools/cupti_trace_summary.py trace.csv --step-end REGEX summarizes the last steps.
// The CSV rows: kind,start_ns,end_ns,stream,extra,name with kind K (kernel; extra = blocks),
// C (copy; extra = bytes, name = direction/host memory kind), M (memset; extra = bytes),
// Y (host synchronization; name = its type) and R (a runtime call that took over 20 us on the
// host; name = the call).
#include <cupti.h>

#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include <unistd.h>

namespace {

std::FILE* g_out = nullptr;
std::mutex g_mutex;
constexpr std::size_t kBufferBytes = 16u << 20;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  std::fprintf(stderr, "cupti_trace: %s failed: %s\n", what, s ? s : "?");
}

std::string demangle(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  // Commas and newlines would break the CSV; the analysis only needs the words.
  for (char& c : s)
    if (c == ',' || c == '\n') c = ';';
  return s;
}

const char* copy_kind(std::uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    default: return "other";
  }
}

const char* memory_kind(std::uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE: return "pageable";
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED: return "pinned";
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE: return "device";
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED: return "managed";
    default: return "other";
  }
}

const char* sync_kind(CUpti_ActivitySynchronizationType t) {
  switch (t) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: return "event_sync";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT: return "stream_wait_event";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: return "stream_sync";
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: return "context_sync";
    default: return "unknown";
  }
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size,
                               std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void write_record(const CUpti_Activity* rec) {
  switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      const long blocks = static_cast<long>(k->gridX) * k->gridY * k->gridZ;
      std::fprintf(g_out, "K,%llu,%llu,%u,%ld,%s\n", static_cast<unsigned long long>(k->start),
                   static_cast<unsigned long long>(k->end), k->streamId, blocks,
                   demangle(k->name).c_str());
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      const bool from_host = c->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
      std::fprintf(g_out, "C,%llu,%llu,%u,%llu,%s %s\n", static_cast<unsigned long long>(c->start),
                   static_cast<unsigned long long>(c->end), c->streamId,
                   static_cast<unsigned long long>(c->bytes), copy_kind(c->copyKind),
                   memory_kind(from_host ? c->srcKind : c->dstKind));
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      std::fprintf(g_out, "M,%llu,%llu,%u,%llu,memset\n",
                   static_cast<unsigned long long>(m->start),
                   static_cast<unsigned long long>(m->end), m->streamId,
                   static_cast<unsigned long long>(m->bytes));
      break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      const auto* s = reinterpret_cast<const CUpti_ActivitySynchronization2*>(rec);
      std::fprintf(g_out, "Y,%llu,%llu,%u,0,%s\n", static_cast<unsigned long long>(s->start),
                   static_cast<unsigned long long>(s->end), s->streamId, sync_kind(s->type));
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME: {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      if (a->end - a->start < 20000) break;  // launches and the like: too many to keep
      const char* name = nullptr;
      cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
      std::fprintf(g_out, "R,%llu,%llu,0,%u,%s\n", static_cast<unsigned long long>(a->start),
                   static_cast<unsigned long long>(a->end), a->threadId, name ? name : "?");
      break;
    }
    default: break;
  }
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t,
                               std::size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* rec = nullptr;
    while (g_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS)
      write_record(rec);
    if (g_out) std::fflush(g_out);
  }
  std::free(buffer);
}

void flush_all() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

// The records of a context must be flushed before it goes away; the process's exit may come
// after CUDA has torn the context down, so flush on both.
void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                          const void*) {
  if (domain == CUPTI_CB_DOMAIN_RESOURCE && cbid == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING)
    flush_all();
}

}  // namespace

extern "C" int InitializeInjection() {
  static bool initialized = false;
  if (initialized) return 1;
  initialized = true;
  const char* path = std::getenv("MESHTRAIN_CUPTI_OUT");
  std::string file = path && *path ? path : "cupti_trace.csv";
  if (const std::size_t at = file.find("%p"); at != std::string::npos)
    file.replace(at, 2, std::to_string(getpid()));
  g_out = std::fopen(file.c_str(), "w");
  if (!g_out) {
    std::fprintf(stderr, "cupti_trace: cannot write %s\n", file.c_str());
    return 0;
  }
  std::fprintf(g_out, "kind,start_ns,end_ns,stream,extra,name\n");
  CUpti_SubscriberHandle sub;
  check(cuptiSubscribe(&sub, on_callback, nullptr), "cuptiSubscribe");
  check(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE,
                            CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING),
        "cuptiEnableCallback");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
        "cuptiActivityRegisterCallbacks");
  for (CUpti_ActivityKind k :
       {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
        CUPTI_ACTIVITY_KIND_RUNTIME})
    check(cuptiActivityEnable(k), "cuptiActivityEnable");
  std::atexit(flush_all);
  std::fprintf(stderr, "cupti_trace: writing the GPU timeline to %s\n", file.c_str());
  return 1;
}
