#pragma once
// Shared by the single-GPU kernel benchmarks (bench_attention, bench_kernels_cuda): random
// device inputs and CUDA-event timing on the execution space's stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/core/cuda_check.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::perf_util {

// n values uniform in [lo, hi) from seed, on the device.
template <class T>
View1<T> random_view(const std::string& label, std::size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  View1<T> d(label, n);
  auto m = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < n; ++i) m(i) = static_cast<T>(dist(gen));
  Kokkos::deep_copy(d, m);
  return d;
}

// Median milliseconds of `iters` calls of fn after `warmup`, each bracketed by CUDA events.
template <class F>
double median_ms(const ExecSpace& exec, int warmup, int iters, const F& fn) {
  cudaStream_t st = exec.cuda_stream();
  for (int i = 0; i < warmup; ++i) fn();
  exec.fence();
  cudaEvent_t start, stop;
  MESHTRAIN_CUDA_CHECK(cudaEventCreate(&start));
  MESHTRAIN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    MESHTRAIN_CUDA_CHECK(cudaEventRecord(start, st));
    fn();
    MESHTRAIN_CUDA_CHECK(cudaEventRecord(stop, st));
    MESHTRAIN_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    MESHTRAIN_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  MESHTRAIN_CUDA_CHECK(cudaEventDestroy(start));
  MESHTRAIN_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace meshtrain::perf_util
