#pragma once
// The one place where Catch2 2.x (Debian 12) and 3.x (Spack) differ for our tests.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define MESHTRAIN_CATCH3 1
#else
#include <catch2/catch.hpp>
#define MESHTRAIN_CATCH3 0
#endif

#include <mpi.h>

#include <string>

namespace mt_test {
#if MESHTRAIN_CATCH3
using Catch::Approx;
#else
using Catch::Detail::Approx;
#endif

// Matcher for "the exception message contains s".
#if MESHTRAIN_CATCH3
inline auto contains(const std::string& s) { return Catch::Matchers::ContainsSubstring(s); }
#else
inline auto contains(const std::string& s) { return Catch::Matchers::Contains(s); }
#endif

// MPI tests run under mpiexec; the harness main initialised MPI and Kokkos.
inline MPI_Comm world() { return MPI_COMM_WORLD; }
inline int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
// True on every rank iff `ok` is true on every rank: use before REQUIRE in MPI tests so that a
// failure on one rank fails the assertion everywhere instead of leaving peers in a collective.
inline bool all_ranks(bool ok) {
  int in = ok ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return out == 1;
}
}  // namespace mt_test
