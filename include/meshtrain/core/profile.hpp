#pragma once
// Named ranges over the host timeline for profilers: steps, forward and backward per block, the
// optimizer, each collective with its bytes and group, pipeline sends and receives, checkpoint
// phases. A RangeSink consumes them: the CUDA build's NVTX sink (--profile.nvtx; Nsight Systems
// shows the ranges on each rank's timeline), or a test's recorder. With no sink installed a
// Range costs one load of a global pointer and a branch that is never taken: its name is built
// only when a sink is there (pass a callable for names that need formatting).
//
// The profiler's capture window (--profile.steps A:B, for nsys --capture-range=cudaProfilerApi)
// goes through the same place: the trainer calls capture_start / capture_stop, which call what
// the build installed (cudaProfilerStart / cudaProfilerStop on CUDA, a test's recorder).
#include <cstdint>
#include <string>
#include <type_traits>

namespace meshtrain::prof {

class RangeSink {
 public:
  virtual ~RangeSink() = default;
  // Ranges nest on the calling thread: pop closes the innermost open one.
  virtual void push(const std::string& name) = 0;
  virtual void pop() = 0;
};

namespace detail {
inline RangeSink* g_sink = nullptr;
inline void (*g_capture_start)() = nullptr;
inline void (*g_capture_stop)() = nullptr;
}  // namespace detail

// Installs `sink` for the process (nullptr: off). Not synchronised: set it before ranges open,
// from the thread that opens them (the main thread; the watchdog thread opens none).
inline void set_sink(RangeSink* sink) { detail::g_sink = sink; }
inline RangeSink* sink() { return detail::g_sink; }
inline bool enabled() { return detail::g_sink != nullptr; }

class Range {
 public:
  explicit Range(const char* name) {
    if (detail::g_sink) [[unlikely]] open(name);
  }
  // make_name() -> std::string, called only when a sink is installed.
  template <class F, std::enable_if_t<std::is_invocable_r_v<std::string, F&>, int> = 0>
  explicit Range(F&& make_name) {
    if (detail::g_sink) [[unlikely]] open(make_name());
  }
  ~Range() {
    if (sink_) [[unlikely]] sink_->pop();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  void open(const std::string& name) {
    sink_ = detail::g_sink;
    sink_->push(name);
  }
  RangeSink* sink_ = nullptr;
};

// "1.5 MiB", "512 B": a collective's size in a range name.
std::string bytes_label(std::size_t bytes);

// The NVTX sink of the CUDA build (nullptr where the build has no NVTX): a process-wide object
// whose ranges go to the "meshtrain" NVTX domain.
RangeSink* nvtx_sink();

// The capture window. A step range "A:B" (1-based, inclusive, A <= B) or empty (first = -1).
struct StepRange {
  std::int64_t first = -1, last = -1;
  bool empty() const { return first < 0; }
  bool contains(std::int64_t step) const { return !empty() && step >= first && step <= last; }
};
// ConfigError naming `option` for anything but "", "A" or "A:B" with 1 <= A <= B.
StepRange parse_step_range(const std::string& text, const char* option);

// What starts and stops the profiler's capture (nullptr: nothing). The CUDA build installs
// cudaProfilerStart / cudaProfilerStop through install_cuda_profiler (false where there is none).
inline void set_capture(void (*start)(), void (*stop)()) {
  detail::g_capture_start = start;
  detail::g_capture_stop = stop;
}
bool install_cuda_profiler();
inline void capture_start() {
  if (detail::g_capture_start) detail::g_capture_start();
}
inline void capture_stop() {
  if (detail::g_capture_stop) detail::g_capture_stop();
}

}  // namespace meshtrain::prof
