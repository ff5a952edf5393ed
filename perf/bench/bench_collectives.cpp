// Collective bandwidth in nccl-tests' columns, for each backend of this build, with a memcpy
// line measured in the same run as the ceiling for the MPI backend (host memory) and a
// device-to-device copy for NCCL.
//
//   mpirun -np 2 build/cpu/perf/bench/bench_collectives [--backend mpi|nccl|all] [--min-bytes 1024]
//          [--max-bytes 67108864] [--iters 20] [--warmup 5]
//
// Time = median over --iters of one operation between barriers (slowest rank).
// busbw follows nccl-tests: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n times
// algbw; "size" is the all-reduce buffer, the all-gather output, the reduce-scatter input.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "meshtrain/comm/factory.hpp"
#include "meshtrain/comm/flight_recorder.hpp"
#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/mesh/process_mesh.hpp"

using namespace meshtrain;

namespace {

struct Args {
  std::string backend = "all";
  std::size_t min_bytes = 1024;
  std::size_t max_bytes = std::size_t(64) << 20;
  int iters = 20, warmup = 5;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--backend") a.backend = v;
    else if (k == "--min-bytes") a.min_bytes = std::stoull(v);
    else if (k == "--max-bytes") a.max_bytes = std::stoull(v);
    else if (k == "--iters") a.iters = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_collectives: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

double max_over(MPI_Comm c, double t) {
  double out = 0;
  MPI_Allreduce(&t, &out, 1, MPI_DOUBLE, MPI_MAX, c);
  return out;
}

template <class Space>
double copy_bandwidth(std::size_t bytes, int iters) {
  const std::size_t n = bytes / sizeof(float);
  Kokkos::View<float*, Space> a("meshtrain::bench::copy_a", n), b("meshtrain::bench::copy_b", n);
  Kokkos::deep_copy(b, a);
  Kokkos::fence();
  Timer t;
  for (int i = 0; i < iters; ++i) Kokkos::deep_copy(b, a);
  Kokkos::fence();
  return 2.0 * bytes * iters / t.seconds() / 1e9;  // bytes read + bytes written
}

double host_memcpy_bandwidth(std::size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::memcpy(b.data(), a.data(), bytes);
  Timer t;
  for (int i = 0; i < iters; ++i) std::memcpy(b.data(), a.data(), bytes);
  return 2.0 * bytes * iters / t.seconds() / 1e9;
}

template <class Space>
void run(comm::Communicator& c, MPI_Comm mpi, const Args& a) {
  const int n = c.size();
  const bool root = c.rank() == 0;
  if (root) {
    std::printf("# backend %s, %d ranks, float32\n", comm::backend_name(c.backend()), n);
    std::printf("%-15s %12s %12s %10s %11s %11s %11s\n", "op", "size(B)", "count", "type",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)");
  }
  using View = Kokkos::View<float*, Space>;
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter"}) {
    for (std::size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 4) {
      const std::size_t total = std::max<std::size_t>(bytes / sizeof(float) / n * n, n);
      const std::size_t block = total / n;
      View big("meshtrain::bench::big", total), small("meshtrain::bench::small", block);
      Kokkos::deep_copy(big, 1.0f);
      Kokkos::deep_copy(small, 1.0f);
      auto once = [&] {
        if (op[4] == 'r') c.all_reduce(big);
        else if (op[4] == 'g') c.all_gather(small, big);
        else c.reduce_scatter(big, small);
      };
      for (int i = 0; i < a.warmup; ++i) once();
      Kokkos::fence();
      // Median over iterations, each timed between barriers and taken as the slowest rank's:
      // robust against the scheduling noise of oversubscribed or shared machines.
      std::vector<double> times;
      for (int i = 0; i < a.iters; ++i) {
        MPI_Barrier(mpi);
        Timer t;
        once();
        Kokkos::fence();
        times.push_back(max_over(mpi, t.seconds()));
      }
      std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
      const double sec = times[times.size() / 2];
      const double size_b = static_cast<double>(total) * sizeof(float);
      const double algbw = size_b / sec / 1e9;
      const double factor = op[4] == 'r' ? 2.0 * (n - 1) / n : double(n - 1) / n;
      if (root)
        std::printf("%-15s %12.0f %12zu %10s %11.1f %11.3f %11.3f\n", op, size_b, total,
                    "float", sec * 1e6, algbw, algbw * factor);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  meshtrain::comm::set_flight_world(MPI_COMM_WORLD);  // world ranks in flight dumps
  {
    const Args a = parse(argc, argv);
    auto node = mesh::node_local_rank(MPI_COMM_WORLD);
    kc::initialize(mesh::select_device(node.rank, kc::device_count()));
    {
      auto world = mesh::MpiComm::duplicate(MPI_COMM_WORLD);
      const bool root = world.rank() == 0;
      // Ceilings, measured now on this machine: every rank copies at once, as in the collectives.
      const std::size_t cbytes = std::max<std::size_t>(a.max_bytes, 16u << 20);
      MPI_Barrier(world.get());
      const double hcopy = max_over(world.get(), 0) + host_memcpy_bandwidth(cbytes, 10);
      const double kcopy = copy_bandwidth<MemSpace>(cbytes, 10);
      if (root) {
        std::printf("# ceiling: host memcpy %.2f GB/s (read+write, %zu B, rank 0 while all copy)\n",
                    hcopy, cbytes);
        std::printf("# ceiling: Kokkos deep_copy in %s %.2f GB/s (read+write)\n", MemSpace::name(),
                    kcopy);
      }
      for (comm::Backend be : comm::available_backends()) {
        if (a.backend != "all" && a.backend != comm::backend_name(be)) continue;
        auto c = comm::make_communicator(be, world.get());
        if (be == comm::Backend::mpi) run<Kokkos::HostSpace>(*c, world.get(), a);
        else run<MemSpace>(*c, world.get(), a);
      }
    }
    Kokkos::finalize();
  }
  MPI_Finalize();
  return 0;
}
