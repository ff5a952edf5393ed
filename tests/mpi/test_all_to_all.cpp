// all_to_all and all_to_allv (with the counts exchange in front) on every backend of this
// build and on the one-rank SelfCommunicator, over the world and the sub-communicators of each
// (dp, pp, tp) factorisation: values computed from (source rank, destination rank, index),
// zero-sized blocks, ranks that send nothing at all, and two exchanges in flight at once; 16-bit
// elements over MPI as their bits.
#include <cstdint>
#include <string>

#include "factorisations.hpp"
#include "harness.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/comm/self_communicator.hpp"
#include "meshtrain/mesh/process_mesh.hpp"

using namespace meshtrain;
using namespace meshtrain::comm;
using namespace meshtrain::mesh;

namespace {

// Element i of the block that rank `from` sends to rank `to`: exact in every tested type.
template <class T>
T val(int from, int to, std::size_t i) {
  return static_cast<T>(1000 * from + 100 * to + static_cast<long>(i % 97));
}

template <class T, class Space>
Kokkos::View<T*, Space> make(std::size_t n, const std::vector<T>& h) {
  Kokkos::View<T*, Space> v("test_buf", n);
  auto m = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < n; ++i) m(i) = h[i];
  Kokkos::deep_copy(v, m);
  return v;
}

template <class V>
auto host(const V& v) {
  Kokkos::fence();
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
}

template <class T, class Space>
void check_equal_blocks(Communicator& c, std::size_t cnt) {
  const int n = c.size(), r = c.rank();
  INFO("all_to_all: backend " << backend_name(c.backend()) << " size " << n << " rank " << r
                              << " count " << cnt);
  std::vector<T> h(cnt * n);
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < cnt; ++i) h[q * cnt + i] = val<T>(r, q, i);
  auto s = make<T, Space>(cnt * n, h);
  auto d = make<T, Space>(cnt * n, std::vector<T>(cnt * n, T(-7)));
  c.all_to_all(s, d);
  auto hd = host(d);
  bool ok = true;
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < cnt; ++i) ok = ok && hd(q * cnt + i) == val<T>(q, r, i);
  REQUIRE(ok);
}

// How many elements rank `from` sends to rank `to` under pattern `p`: pattern 0 has zeros
// scattered over the pairs, pattern 1 has rank 0 send nothing at all, pattern 2 has every rank
// send only to the last one (the others receive nothing).
std::size_t count_of(int p, int from, int to, int n) {
  switch (p) {
    case 0: return static_cast<std::size_t>((from + 2 * to) % 3) * 5;
    case 1: return from == 0 ? 0 : static_cast<std::size_t>(from + to + 1);
    default: return to == n - 1 ? static_cast<std::size_t>(3 + from) : 0;
  }
}

template <class T, class Space>
struct Varying {
  std::vector<std::size_t> send_counts, recv_counts;
  Kokkos::View<T*, Space> s, d;
};

template <class T, class Space>
Varying<T, Space> start_varying(Communicator& c, int p, Request& req) {
  const int n = c.size(), r = c.rank();
  Varying<T, Space> v;
  std::vector<T> h;
  for (int q = 0; q < n; ++q) {
    v.send_counts.push_back(count_of(p, r, q, n));
    for (std::size_t i = 0; i < v.send_counts.back(); ++i) h.push_back(val<T>(r, q, i));
  }
  v.recv_counts = c.exchange_counts(v.send_counts);
  std::size_t total = 0;
  for (std::size_t x : v.recv_counts) total += x;
  v.s = make<T, Space>(h.size(), h);
  v.d = make<T, Space>(total, std::vector<T>(total, T(-7)));
  req = c.iall_to_allv(v.s, v.send_counts, v.d, v.recv_counts);
  return v;
}

template <class T, class Space>
bool check_varying(Communicator& c, int p, const Varying<T, Space>& v) {
  const int n = c.size(), r = c.rank();
  auto hd = host(v.d);
  bool ok = true;
  std::size_t at = 0;
  for (int q = 0; q < n; ++q) {
    ok = ok && v.recv_counts[q] == count_of(p, q, r, n);
    for (std::size_t i = 0; i < v.recv_counts[q]; ++i) ok = ok && hd(at++) == val<T>(q, r, i);
  }
  return ok && at == hd.extent(0);
}

template <class T, class Space>
void check_all(Communicator& c) {
  for (std::size_t cnt : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(300)})
    check_equal_blocks<T, Space>(c, cnt);
  for (int p = 0; p < 3; ++p) {
    INFO("all_to_allv: backend " << backend_name(c.backend()) << " size " << c.size()
                                 << " rank " << c.rank() << " pattern " << p);
    Request req;
    auto v = start_varying<T, Space>(c, p, req);
    req.wait();
    REQUIRE(check_varying<T, Space>(c, p, v));
  }
  {  // two exchanges in flight, completed in reverse order of issue
    Request r0, r1;
    auto v0 = start_varying<T, Space>(c, 0, r0);
    auto v1 = start_varying<T, Space>(c, 1, r1);
    r1.wait();
    r0.wait();
    REQUIRE(check_varying<T, Space>(c, 0, v0));
    REQUIRE(check_varying<T, Space>(c, 1, v1));
  }
}

template <class Space>
void run_backend(Backend be) {
  const int world = mt_test::world_size();
  for (const Shape& s : mt_test::factorisations(world)) {
    ProcessMesh m(mt_test::world(), s, Order::parse("tp-dp-pp"));
    INFO("dp=" << s.dp << " pp=" << s.pp << " tp=" << s.tp);
    for (const MpiComm* g : {&m.tp(), &m.dp(), &m.pp()}) {
      auto c = make_communicator(be, g->get());
      check_all<float, Space>(*c);
    }
  }
  auto w = MpiComm::duplicate(mt_test::world());
  auto c = make_communicator(be, w.get());
  check_all<double, Space>(*c);
  check_all<std::int64_t, Space>(*c);
}

}  // namespace

TEST_CASE("all_to_all(v), MPI backend", "[comm][mpi][all_to_all]") {
  run_backend<Kokkos::HostSpace>(Backend::mpi);
}

#if defined(MESHTRAIN_HAVE_NCCL)
TEST_CASE("all_to_all(v), NCCL backend", "[comm][nccl][all_to_all]") {
  REQUIRE(kc::device_count() > 0);
  run_backend<MemSpace>(Backend::nccl);
}
#endif

TEST_CASE("all_to_all(v), a group of one rank", "[comm][all_to_all]") {
  SelfCommunicator self(Backend::mpi);
  check_all<float, Kokkos::HostSpace>(self);
  if constexpr (!kDeviceIsHost) {
    SelfCommunicator dev(Backend::nccl);
    check_all<float, MemSpace>(dev);
  }
}

// A 16-bit MoE model's rows (bf16 / fp16) cross all_to_allv: MPI moves them as their bits
// (MPI_UINT16_T; the CPU build has no 16-bit types, so raw buffers and DType stand for them),
// including bit patterns that are NaN or infinite as numbers. Reducing them stays refused.
TEST_CASE("all_to_all(v), MPI backend: 16-bit elements travel as their bits",
          "[comm][mpi][all_to_all]") {
  auto w = MpiComm::duplicate(mt_test::world());
  auto c = make_communicator(Backend::mpi, w.get());
  const int n = c->size(), r = c->rank();
  auto bits = [](int from, int to, std::size_t i) {
    return static_cast<std::uint16_t>(i % 3 == 0 ? 0x7f80 + 0x101 * from + 0x11 * to + i
                                                 : 0x8000 + 0x100 * from + 0x10 * to + i);
  };
  for (DType t : {DType::bf16, DType::f16}) {
    INFO(dtype_name(t));
    std::vector<std::size_t> sc, sd, rc, rd;
    std::vector<std::uint16_t> send;
    for (int q = 0; q < n; ++q) {
      sd.push_back(send.size());
      sc.push_back(count_of(0, r, q, n) + 1);
      for (std::size_t i = 0; i < sc.back(); ++i) send.push_back(bits(r, q, i));
    }
    rc = c->exchange_counts(sc);
    std::size_t total = 0;
    for (std::size_t x : rc) {
      rd.push_back(total);
      total += x;
    }
    std::vector<std::uint16_t> recv(total, 0);
    c->iall_to_allv_raw(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), t)
        .wait();
    bool ok = true;
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < rc[q]; ++i) ok = ok && recv[rd[q] + i] == bits(q, r, i);
    REQUIRE(ok);
    // Equal blocks of 5.
    std::vector<std::uint16_t> es, er(5 * std::size_t(n), 0);
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < 5; ++i) es.push_back(bits(r, q, i));
    c->iall_to_all_raw(es.data(), er.data(), 5, t).wait();
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < 5; ++i) ok = ok && er[q * 5 + i] == bits(q, r, i);
    REQUIRE(ok);
    std::uint16_t one = 1;
    REQUIRE_THROWS_WITH(c->iall_reduce_raw(&one, &one, 1, t, ReduceOp::sum).wait(),
                        mt_test::contains("the MPI backend does not reduce"));
  }
}

TEST_CASE("all_to_allv refuses counts that do not fit", "[comm][all_to_all]") {
  auto w = MpiComm::duplicate(mt_test::world());
  auto c = make_communicator(Backend::mpi, w.get());
  const std::size_t n = static_cast<std::size_t>(c->size());
  Kokkos::View<float*, Kokkos::HostSpace> a("a", 4), b("b", 4);
  REQUIRE_THROWS_WITH(c->iall_to_allv(a, std::vector<std::size_t>(n + 1, 0), b,
                                      std::vector<std::size_t>(n, 0)),
                      mt_test::contains("counts for a group of"));
  std::vector<std::size_t> four(n, 0);
  four[0] = 3;  // adds up to 3, the View holds 4
  REQUIRE_THROWS_WITH(c->iall_to_allv(a, four, b, four), mt_test::contains("buffer sizes"));
  if (n > 1) REQUIRE_THROWS_AS(c->all_to_all(a, Kokkos::View<float*, Kokkos::HostSpace>("c", 5)), Error);
}
