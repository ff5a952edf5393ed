#pragma once
// Helpers for the kernel tests: host <-> device copies, seeded random data, NaN poisoning,
// tolerance checks that name the worst element, central finite differences, and a record of
// which implementation a dispatching kernel ran.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "harness.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/view.hpp"

namespace kt {

using meshtrain::ExecSpace;
using meshtrain::View1;

template <class T>
std::vector<T> random_vector(std::size_t n, std::uint32_t seed, double lo = -1.0,
                             double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

template <class T>
std::vector<T> cast_vector(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <class T>
View1<T> to_device(const std::vector<T>& h, const std::string& label = "test") {
  View1<T> d(label, h.size());
  auto m = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < h.size(); ++i) m(i) = h[i];
  Kokkos::deep_copy(d, m);
  return d;
}

template <class V>
auto to_host(const V& d) {
  using T = std::remove_const_t<typename V::value_type>;
  auto m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  std::vector<T> h(d.extent(0));
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = m(i);
  return h;
}

// A View whose every element is NaN: an output element a kernel forgets to write stays NaN.
template <class T>
View1<T> nan_view(std::size_t n, const std::string& label = "poisoned") {
  return to_device(std::vector<T>(n, std::numeric_limits<T>::quiet_NaN()), label);
}

template <class T>
float scalar_value(const meshtrain::Scalar<T>& s) {
  auto m = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s);
  return m();
}

// Requires |got[i] - want[i]| <= atol + rtol * |want[i]| for all i (NaN fails); on failure the
// message names the worst element.
template <class A, class B>
void require_close(const std::vector<A>& got, const std::vector<B>& want, double rtol,
                   double atol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t worst = 0;
  double worst_excess = -1.0;
  bool ok = true;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double tol = atol + rtol * std::fabs(w);
    const double err = std::fabs(g - w);
    const double excess = std::isfinite(g) && std::isfinite(w) ? err / tol : 1e300;
    if (!(err <= tol) || !std::isfinite(g)) ok = false;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  std::ostringstream os;
  os.precision(10);
  if (!got.empty())
    os << what << ": worst element " << worst << " got " << static_cast<double>(got[worst])
       << " want " << static_cast<double>(want[worst]) << " (rtol " << rtol << ", atol " << atol
       << ", error/tolerance " << worst_excess << ")";
  INFO(os.str());
  REQUIRE(ok);
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences dL/dx_i = (L(x + eps e_i) - L(x - eps e_i)) / (2 eps); x is restored.
inline std::vector<double> fd_gradient(std::vector<double>& x,
                                       const std::function<double()>& objective, double eps) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = objective();
    x[i] = x0 - eps;
    const double lm = objective();
    x[i] = x0;
    g[i] = (lp - lm) / (2 * eps);
  }
  return g;
}

// Element-wise casts between storage types (float <-> bf16 go through float).
template <class To, class From>
std::vector<To> convert(const std::vector<From>& v) {
  std::vector<To> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<To>(static_cast<float>(v[i]));
  return r;
}

template <class A>
double max_abs(const std::vector<A>& v) {
  double m = 0;
  for (const A& x : v) m = std::max(m, std::fabs(static_cast<double>(static_cast<float>(x))));
  return m;
}

// Records, while alive, the names of the Kokkos kernels launched and of the Kokkos Tools regions
// pushed, through Kokkos' profiling callbacks (the same setters in Kokkos 3.4 and 4.x). One
// at a time; nothing else in the tests installs callbacks.
class KernelLog {
 public:
  KernelLog() {
    events() = Events{};
    install(true);
  }
  ~KernelLog() { install(false); }
  KernelLog(const KernelLog&) = delete;
  KernelLog& operator=(const KernelLog&) = delete;

  bool launched_prefix(const std::string& prefix) const { return count_prefix(prefix) > 0; }
  // Kernels launched whose label starts with prefix.
  std::size_t count_prefix(const std::string& prefix) const {
    std::size_t n = 0;
    for (const auto& k : events().kernels)
      if (k.compare(0, prefix.size(), prefix) == 0) ++n;
    return n;
  }
  // Regions pushed whose name starts with prefix (a CUDA kernel's "meshtrain::<op>_cuda").
  std::size_t count_region_prefix(const std::string& prefix) const {
    std::size_t n = 0;
    for (const auto& r : events().regions)
      if (r.compare(0, prefix.size(), prefix) == 0) ++n;
    return n;
  }
  bool pushed(const std::string& region) const {
    for (const auto& r : events().regions)
      if (r == region) return true;
    return false;
  }

 private:
  struct Events {
    std::vector<std::string> kernels, regions;
  };
  static Events& events() {
    static Events e;
    return e;
  }
  static void begin_kernel(const char* name, std::uint32_t, std::uint64_t*) {
    events().kernels.emplace_back(name ? name : "");
  }
  static void push_region(const char* name) { events().regions.emplace_back(name ? name : ""); }
  static void install(bool on) {
    namespace E = Kokkos::Tools::Experimental;
    E::set_begin_parallel_for_callback(on ? begin_kernel : nullptr);
    E::set_begin_parallel_reduce_callback(on ? begin_kernel : nullptr);
    E::set_begin_parallel_scan_callback(on ? begin_kernel : nullptr);
    E::set_push_region_callback(on ? push_region : nullptr);
  }
};

// Which implementation a dispatching kernel (layernorm_forward, cross_entropy_forward, ...) ran.
// The CUDA kernels push the region "meshtrain::<op>_cuda" and launch no Kokkos kernel; the
// portable ones launch Kokkos kernels labelled "meshtrain::<op>..." (or, on host memory, may
// run a plain loop inside the region "meshtrain::<op>"). Requires exactly one of the two.
enum class Path { portable, cuda };
inline const char* path_name(Path p) { return p == Path::cuda ? "cuda" : "portable"; }

template <class F>
Path run_logged(const std::string& op, F&& call) {
  KernelLog log;
  call();
  ExecSpace().fence();
  const std::string label = "meshtrain::" + op;
  const bool cuda = log.pushed(label + "_cuda");
  const bool portable = log.launched_prefix(label) || log.pushed(label);
  INFO(op << ": CUDA region pushed " << cuda << ", portable kernels run " << portable);
  REQUIRE(cuda != portable);
  return cuda ? Path::cuda : Path::portable;
}

inline std::vector<double> subtract(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

}  // namespace kt
