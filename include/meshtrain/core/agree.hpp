#pragma once
// Agreement before failure (STYLE 18, DESIGN invariant 6): a check whose outcome can differ
// between ranks (a file one node cannot read, a folder only rank 0 writes) is followed by a
// collective that tells every rank whether any rank failed, so every rank throws the same error
// at the same point and none waits forever in a later collective.
#include <mpi.h>

#include <functional>
#include <string>

#include "meshtrain/core/error.hpp"

namespace meshtrain {

// The exceptions that agree() throws carry this tag: every rank of the communicator throws at
// the same point with the same message, so the error handler may exit normally (and unwinding
// may close files collectively). Any other exception may be one rank's alone.
struct AgreedTag {};
template <class Base>
struct Agreed : Base, AgreedTag {
  explicit Agreed(const std::string& what) : Base(what) {}
};

inline bool is_agreed(const std::exception& e) {
  return dynamic_cast<const AgreedTag*>(&e) != nullptr;
}

// Runs `f` on every rank of `comm`; if it throws on any rank, every rank throws the same
// exception type (Agreed<ConfigError> when the lowest failing rank had a ConfigError, else
// Agreed<Error>) with the lowest failing rank's message. When not every rank failed the message
// names the rank ("... (rank 3 of 4)"), so a node-local problem says where it is. `what`
// prefixes the message. Collective: two small all-reduces, plus broadcasts on failure.
void agree(MPI_Comm comm, const std::string& what, const std::function<void()>& f);
// Runs `f` on rank 0 of `comm` only, then agrees as above.
void agree_on_root(MPI_Comm comm, const std::string& what, const std::function<void()>& f);

// Collective: true on every rank iff `flag` is true on any rank.
bool any_rank(MPI_Comm comm, bool flag);

// MPI_Barrier that sleeps between tests of an MPI_Ibarrier instead of spinning, so that a rank
// waiting for slower ones (a checkpoint writer while rank 0 syncs the file) leaves its core to
// the threads that compute.
void quiet_barrier(MPI_Comm comm);

// Rank `root`'s `s` on every rank of `comm`.
void broadcast_string(MPI_Comm comm, std::string& s, int root = 0);

}  // namespace meshtrain
