#pragma once
// RAII owner of an MPI communicator: the destructor frees it. Move-only. A null handle
// (MPI_COMM_NULL) stands for "this rank is not in the group".
#include <mpi.h>

#include "meshtrain/core/mpi_check.hpp"

namespace meshtrain::mesh {

class MpiComm {
 public:
  MpiComm() = default;
  // Takes ownership of `comm` (which must not be MPI_COMM_WORLD/SELF).
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {}
  ~MpiComm() { reset(); }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  MpiComm(MpiComm&& o) noexcept : comm_(o.comm_) { o.comm_ = MPI_COMM_NULL; }
  MpiComm& operator=(MpiComm&& o) noexcept {
    if (this != &o) {
      reset();
      comm_ = o.comm_;
      o.comm_ = MPI_COMM_NULL;
    }
    return *this;
  }

  // A duplicate that this object owns.
  static MpiComm duplicate(MPI_Comm comm) {
    MPI_Comm d;
    MESHTRAIN_MPI_CHECK(MPI_Comm_dup(comm, &d));
    return MpiComm(d);
  }
  static MpiComm split(MPI_Comm comm, int color, int key) {
    MPI_Comm d;
    MESHTRAIN_MPI_CHECK(MPI_Comm_split(comm, color, key, &d));
    return MpiComm(d);
  }

  MPI_Comm get() const { return comm_; }
  bool is_null() const { return comm_ == MPI_COMM_NULL; }
  int rank() const {
    int r = -1;
    if (!is_null()) MESHTRAIN_MPI_CHECK(MPI_Comm_rank(comm_, &r));
    return r;
  }
  int size() const {
    int s = 0;
    if (!is_null()) MESHTRAIN_MPI_CHECK(MPI_Comm_size(comm_, &s));
    return s;
  }

 private:
  void reset() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace meshtrain::mesh
