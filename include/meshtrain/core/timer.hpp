#pragma once
#include <chrono>

namespace meshtrain {

// Wall-clock seconds since construction or the last reset. Device work must be fenced before
// reading it; the timer knows nothing about streams.
class Timer {
 public:
  Timer() : t0_(clock::now()) {}
  void reset() { t0_ = clock::now(); }
  double seconds() const { return std::chrono::duration<double>(clock::now() - t0_).count(); }

 private:
  using clock = std::chrono::steady_clock;
  clock::time_point t0_;
};

}  // namespace meshtrain
