// Every communicator operation, on every backend of this build, on every sub-communicator of
// every (dp, pp, tp) factorisation of the world, checked against values computed from rank
// numbers. Odd counts (not divisible by the group size) and empty buffers on purpose.
#include <cstdint>
#include <string>

#include "factorisations.hpp"
#include "harness.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/mesh/process_mesh.hpp"

using namespace meshtrain;
using namespace meshtrain::comm;
using namespace meshtrain::mesh;

namespace {

// Rank r's element i. Small integers: exact in every type we test, sums included.
template <class T>
T val(int r, std::size_t i) {
  return static_cast<T>((r + 1) * static_cast<long>(i % 13 + 1) + r);
}

template <class T, class Space>
struct Buf {
  using View = Kokkos::View<T*, Space>;
  template <class F>
  static View make(std::size_t n, F f) {
    View v(Kokkos::view_alloc(std::string("test_buf"), Kokkos::WithoutInitializing), n);
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < n; ++i) h(i) = f(i);
    Kokkos::deep_copy(v, h);
    return v;
  }
  static auto host(const View& v) {
    Kokkos::fence();
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
  }
};

template <class T, class Space>
void check_ops(Communicator& c, std::size_t cnt) {
  using B = Buf<T, Space>;
  const int n = c.size(), r = c.rank();
  INFO("backend " << backend_name(c.backend()) << " group size " << n << " rank " << r
                  << " count " << cnt << " type " << dtype_name(dtype_of_v<T>));
  {  // all_reduce sum, out of place and in place
    auto s = B::make(cnt, [&](std::size_t i) { return val<T>(r, i); });
    auto d = B::make(cnt, [](std::size_t) { return T(-7); });
    c.all_reduce(s, d, ReduceOp::sum);
    c.all_reduce(s, ReduceOp::sum);
    auto hd = B::host(d), hs = B::host(s);
    for (std::size_t i = 0; i < cnt; ++i) {
      T e = 0;
      for (int q = 0; q < n; ++q) e += val<T>(q, i);
      REQUIRE(hd(i) == e);
      REQUIRE(hs(i) == e);
    }
  }
  for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
    auto s = B::make(cnt, [&](std::size_t i) { return val<T>(r, i); });
    c.all_reduce(s, op);
    auto h = B::host(s);
    for (std::size_t i = 0; i < cnt; ++i)
      REQUIRE(h(i) == (op == ReduceOp::max ? val<T>(n - 1, i) : val<T>(0, i)));
  }
  {  // reduce_scatter: rank r receives block r of the sum
    auto s = B::make(cnt * n, [&](std::size_t i) { return val<T>(r, i); });
    auto d = B::make(cnt, [](std::size_t) { return T(-7); });
    c.reduce_scatter(s, d);
    auto h = B::host(d);
    for (std::size_t j = 0; j < cnt; ++j) {
      T e = 0;
      for (int q = 0; q < n; ++q) e += val<T>(q, r * cnt + j);
      REQUIRE(h(j) == e);
    }
  }
  {  // all_gather: block q holds rank q's contribution
    auto s = B::make(cnt, [&](std::size_t i) { return val<T>(r, i); });
    auto d = B::make(cnt * n, [](std::size_t) { return T(-7); });
    c.all_gather(s, d);
    auto h = B::host(d);
    for (int q = 0; q < n; ++q)
      for (std::size_t j = 0; j < cnt; ++j) REQUIRE(h(q * cnt + j) == val<T>(q, j));
  }
  for (int root : {0, n - 1}) {  // broadcast from the first and the last rank
    auto b = B::make(cnt, [&](std::size_t i) { return r == root ? val<T>(r, i) : T(-7); });
    c.broadcast(b, root);
    auto h = B::host(b);
    for (std::size_t i = 0; i < cnt; ++i) REQUIRE(h(i) == val<T>(root, i));
  }
  if (n > 1) {  // ring: receive from the left, send to the right, non-blocking both ways
    const int to = (r + 1) % n, from = (r + n - 1) % n;
    c.prepare_p2p({from, to});  // again for every count and type: a no-op once prepared
    auto s = B::make(cnt, [&](std::size_t i) { return val<T>(r, i); });
    auto d = B::make(cnt, [](std::size_t) { return T(-7); });
    Request rr = c.irecv(d, from, 3);
    Request sr = c.isend(s, to, 3);
    rr.wait();
    sr.wait();
    auto h = B::host(d);
    for (std::size_t i = 0; i < cnt; ++i) REQUIRE(h(i) == val<T>(from, i));
  }
}

template <class Space>
void check_overlapped(Communicator& c) {
  // Several operations in flight at once, completed in reverse order of issue.
  using B = Buf<float, Space>;
  const int n = c.size(), r = c.rank();
  auto a = B::make(1001, [&](std::size_t i) { return val<float>(r, i); });
  auto b = B::make(333, [&](std::size_t i) { return val<float>(r, i + 5); });
  auto g = B::make(17, [&](std::size_t i) { return val<float>(r, i); });
  auto gd = B::make(17 * n, [](std::size_t) { return -1.f; });
  Request ra = c.iall_reduce(a);
  Request rb = c.iall_reduce(b, ReduceOp::max);
  Request rg = c.iall_gather(g, gd);
  REQUIRE(ra.pending());
  rg.wait();
  rb.wait();
  ra.wait();
  REQUIRE(!ra.pending());
  auto ha = B::host(a), hb = B::host(b), hg = B::host(gd);
  for (std::size_t i = 0; i < 1001; ++i) {
    float e = 0;
    for (int q = 0; q < n; ++q) e += val<float>(q, i);
    REQUIRE(ha(i) == e);
  }
  for (std::size_t i = 0; i < 333; ++i) REQUIRE(hb(i) == val<float>(n - 1, i + 5));
  for (int q = 0; q < n; ++q)
    for (std::size_t j = 0; j < 17; ++j) REQUIRE(hg(q * 17 + j) == val<float>(q, j));
}

template <class Space>
void run_backend(Backend be) {
  const int world = mt_test::world_size();
  for (const Shape& s : mt_test::factorisations(world)) {
    for (const char* o : {"tp-dp-pp", "pp-tp-dp"}) {
      ProcessMesh m(mt_test::world(), s, Order::parse(o));
      INFO("dp=" << s.dp << " pp=" << s.pp << " tp=" << s.tp << " order " << o);
      const MpiComm* groups[] = {&m.tp(), &m.dp(), &m.pp(), &m.model_parallel(), &m.embedding()};
      for (const MpiComm* g : groups) {
        if (g->is_null()) continue;
        auto c = make_communicator(be, g->get());
        REQUIRE(c->size() == g->size());
        REQUIRE(c->rank() == g->rank());
        for (std::size_t cnt : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(1000)})
          check_ops<float, Space>(*c, cnt);
      }
    }
  }
  // Every element type on the whole world, with an odd count.
  auto w = MpiComm::duplicate(mt_test::world());
  auto c = make_communicator(be, w.get());
  check_ops<double, Space>(*c, 1003);
  check_ops<std::int32_t, Space>(*c, 1003);
  check_ops<std::int64_t, Space>(*c, 5);
  check_overlapped<Space>(*c);
  c->barrier();
}

}  // namespace

TEST_CASE("MPI backend: every op on every sub-communicator", "[comm][mpi]") {
  run_backend<Kokkos::HostSpace>(Backend::mpi);
}

#if defined(MESHTRAIN_HAVE_NCCL)
TEST_CASE("NCCL backend: every op on every sub-communicator", "[comm][nccl]") {
  REQUIRE(kc::device_count() > 0);  // a CUDA build's tests need a GPU
  run_backend<MemSpace>(Backend::nccl);
}
#endif

// On NCCL an unprepared receive posted before its send hangs (and two pairs that connect in
// different orders do): every backend refuses such a message, so the CPU suite finds the call.
TEST_CASE("a message to a peer not prepared is refused, naming prepare_p2p", "[comm]") {
  auto w = MpiComm::duplicate(mt_test::world());
  auto c = make_communicator(Backend::mpi, w.get());
  const int n = c->size(), r = c->rank();
  Kokkos::View<float*, Kokkos::HostSpace> a("a", 4);
  const int peer = (r + 1) % n;
  if (n > 1) {
    REQUIRE_THROWS_WITH(c->isend(a, peer), mt_test::contains("prepare_p2p"));
    REQUIRE_THROWS_WITH(c->irecv(a, peer), mt_test::contains("prepare_p2p"));
    c->prepare_p2p({peer});
    REQUIRE(c->p2p_prepared(peer));
    REQUIRE_FALSE(c->p2p_prepared(r));  // itself only when named
    c->prepare_p2p({r});
    REQUIRE(c->p2p_prepared(r));
  }
  REQUIRE_THROWS_WITH(c->prepare_p2p({n}), mt_test::contains("group of"));
  REQUIRE_THROWS_WITH(c->isend(a, -1), mt_test::contains("peer -1"));
  c->barrier();
}

TEST_CASE("a View in the wrong memory space is refused with a clear error", "[comm]") {
  auto w = MpiComm::duplicate(mt_test::world());
  auto c = make_communicator(Backend::mpi, w.get());
  Kokkos::View<float*, Kokkos::HostSpace> a("a", 4), b("b", 5);
  REQUIRE_THROWS_AS(c->all_reduce(a, b), Error);  // extents differ
  if constexpr (!kDeviceIsHost) {
    Kokkos::View<float*, MemSpace> d("d", 4);
    REQUIRE_THROWS_AS(c->all_reduce(d), Error);   // MPI backend, device memory
  }
}
