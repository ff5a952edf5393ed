// `meshtrain prep`'s progress line. The ranks tokenise independently and never wait for each
// other until the end, so rank 0 learns their counts from small point-to-point messages (one in
// flight per rank, on a communicator of its own) that it picks up between its own documents.
#include <time.h>

#include <cstdio>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/train/trainer.hpp"
#include "prep_internal.hpp"

namespace meshtrain::app::prep {

namespace {
constexpr int kTag = 38;
}

Progress::Progress(MPI_Comm comm, std::uint64_t total_bytes, double every)
    : total_(total_bytes), every_(every), next_(every) {
  MESHTRAIN_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  if (rank_ == 0) counts_.assign(static_cast<std::size_t>(size_) * 3, 0);
}

Progress::~Progress() {
  if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void Progress::report() {
  next_ = clock_.seconds() + every_;
  if (rank_ == 0) {
    receive();
    print();
    return;
  }
  int done = 1;
  if (request_ != MPI_REQUEST_NULL) MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
  if (!done) return;  // rank 0 is busy with a long document: skip this update
  for (int i = 0; i < 3; ++i) send_[i] = mine_[i];
  send_[3] = 0;
  MESHTRAIN_MPI_CHECK(MPI_Isend(send_, 4, MPI_UINT64_T, 0, kTag, comm_, &request_));
}

void Progress::receive() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    MESHTRAIN_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm_, &flag, &st));
    if (!flag) return;
    std::uint64_t m[4];
    MESHTRAIN_MPI_CHECK(MPI_Recv(m, 4, MPI_UINT64_T, st.MPI_SOURCE, kTag, comm_, MPI_STATUS_IGNORE));
    for (int i = 0; i < 3; ++i) counts_[static_cast<std::size_t>(st.MPI_SOURCE) * 3 + i] = m[i];
    if (m[3]) ++finished_;
  }
}

void Progress::print() {
  for (int i = 0; i < 3; ++i) counts_[static_cast<std::size_t>(i)] = mine_[i];
  std::uint64_t sum[3] = {};
  for (int r = 0; r < size_; ++r)
    for (int i = 0; i < 3; ++i) sum[i] += counts_[static_cast<std::size_t>(r) * 3 + i];
  const double t = clock_.seconds();
  const double rate = t > 0 ? static_cast<double>(sum[0]) / t : 0;
  const double left = total_ > sum[0] ? static_cast<double>(total_ - sum[0]) : 0;
  char line[256];
  std::snprintf(line, sizeof line,
                "prep: %4.1f%% of %.1f MB | %.1f MB/s | %llu documents | %.2fM tokens | ETA %s",
                total_ > 0 ? 100.0 * static_cast<double>(sum[0]) / static_cast<double>(total_) : 100.0,
                static_cast<double>(total_) / 1e6, rate / 1e6,
                static_cast<unsigned long long>(sum[1]), static_cast<double>(sum[2]) / 1e6,
                rate > 0 ? train::format_duration(left / rate).c_str() : "?");
  logging::info(line);
}

void Progress::finish() {
  if (size_ == 1) return;
  if (rank_ != 0) {
    if (request_ != MPI_REQUEST_NULL) MESHTRAIN_MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE));
    for (int i = 0; i < 3; ++i) send_[i] = mine_[i];
    send_[3] = 1;
    MESHTRAIN_MPI_CHECK(MPI_Send(send_, 4, MPI_UINT64_T, 0, kTag, comm_));
    return;
  }
  // Rank 0 keeps the line going while the others finish.
  while (finished_ < size_ - 1) {
    receive();
    if (finished_ == size_ - 1) break;
    if (every_ > 0 && clock_.seconds() >= next_) {
      next_ = clock_.seconds() + every_;
      print();
    }
    const timespec pause{0, 2'000'000};  // 2 ms: the ranks finish within a unit of each other
    nanosleep(&pause, nullptr);
  }
}

}  // namespace meshtrain::app::prep
