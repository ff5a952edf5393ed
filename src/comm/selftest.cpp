#include "meshtrain/comm/selftest.hpp"

namespace meshtrain::comm {

namespace {

// Expected values: rank r contributes r*1000 + i at element i (exact in float for our sizes).
float val(int r, std::size_t i) { return static_cast<float>(r * 1000 + static_cast<long>(i % 997)); }

template <class Space>
struct Buffers {
  using View = Kokkos::View<float*, Space>;
  static View make(const char* label, std::size_t n) {
    return View(Kokkos::view_alloc(std::string("meshtrain::selftest::") + label,
                                   Kokkos::WithoutInitializing),
                n);
  }
  template <class F>
  static View filled(const char* label, std::size_t n, F f) {
    View v = make(label, n);
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < n; ++i) h(i) = f(i);
    Kokkos::deep_copy(v, h);
    return v;
  }
  template <class F>
  static std::string mismatch(const View& v, F expect) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
    for (std::size_t i = 0; i < v.extent(0); ++i) {
      if (h(i) != expect(i))
        return cat("element ", i, ": got ", h(i), ", expected ", expect(i));
    }
    return {};
  }
};

template <class Space>
std::vector<CheckResult> run(Communicator& c, const std::vector<std::size_t>& counts) {
  using B = Buffers<Space>;
  const int n = c.size(), r = c.rank();
  std::vector<CheckResult> out;
  auto record = [&](const char* op, std::size_t count, std::string mm) {
    out.push_back(CheckResult{op, count, mm.empty(), std::move(mm)});
  };
  for (std::size_t cnt : counts) {
    for (bool blocking : {true, false}) {
      {
        auto v = B::filled("ar", cnt, [&](std::size_t i) { return val(r, i); });
        auto req = c.iall_reduce(v, ReduceOp::sum);
        if (blocking) req.wait();
        req.wait();
        Kokkos::fence();
        record(blocking ? "all_reduce(sum)" : "iall_reduce(sum)", cnt,
               B::mismatch(v, [&](std::size_t i) {
                 float s = 0;
                 for (int q = 0; q < n; ++q) s += val(q, i);
                 return s;
               }));
      }
      {
        auto s = B::filled("arm_s", cnt, [&](std::size_t i) { return val(r, i); });
        auto v = B::make("arm_r", cnt);
        c.iall_reduce(s, v, ReduceOp::max).wait();
        Kokkos::fence();
        record(blocking ? "all_reduce(max)" : "iall_reduce(max)", cnt,
               B::mismatch(v, [&](std::size_t i) { return val(n - 1, i); }));
      }
      {
        auto s = B::filled("rs_s", cnt * n, [&](std::size_t i) { return val(r, i); });
        auto v = B::make("rs_r", cnt);
        c.ireduce_scatter(s, v).wait();
        Kokkos::fence();
        record("reduce_scatter", cnt, B::mismatch(v, [&](std::size_t j) {
                 float sum = 0;
                 for (int q = 0; q < n; ++q) sum += val(q, r * cnt + j);
                 return sum;
               }));
      }
      {
        auto s = B::filled("ag_s", cnt, [&](std::size_t i) { return val(r, i); });
        auto v = B::make("ag_r", cnt * n);
        c.iall_gather(s, v).wait();
        Kokkos::fence();
        record("all_gather", cnt, B::mismatch(v, [&](std::size_t i) {
                 return val(static_cast<int>(i / (cnt ? cnt : 1)), i % (cnt ? cnt : 1));
               }));
      }
      {
        const int root = n - 1;
        auto v = B::filled("bc", cnt, [&](std::size_t i) { return r == root ? val(r, i) : -1.f; });
        c.ibroadcast(v, root).wait();
        Kokkos::fence();
        record("broadcast", cnt, B::mismatch(v, [&](std::size_t i) { return val(root, i); }));
      }
      if (n > 1) {
        const int to = (r + 1) % n, from = (r + n - 1) % n;
        auto s = B::filled("p2p_s", cnt, [&](std::size_t i) { return val(r, i); });
        auto v = B::make("p2p_r", cnt);
        // Post the receive first so the ring cannot deadlock on rendezvous sends; on NCCL each
        // direction of each neighbour pair needs a stream of its own for that (prepare_p2p:
        // on one stream the receive would hold back this rank's send).
        c.prepare_p2p({from, to});
        auto rr = c.irecv(v, from, 7);
        auto sr = c.isend(s, to, 7);
        rr.wait();
        sr.wait();
        Kokkos::fence();
        record("send/recv ring", cnt, B::mismatch(v, [&](std::size_t i) { return val(from, i); }));
      }
    }
  }
  c.barrier();
  return out;
}

}  // namespace

std::vector<CheckResult> self_test(Communicator& c, const std::vector<std::size_t>& counts) {
  if (c.needs_host_memory()) return run<Kokkos::HostSpace>(c, counts);
  return run<MemSpace>(c, counts);
}

}  // namespace meshtrain::comm
