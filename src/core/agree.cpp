#include "meshtrain/core/agree.hpp"

#include <chrono>
#include <thread>

#include "meshtrain/core/mpi_check.hpp"

namespace meshtrain {

namespace {

enum Kind : int { kOk = 0, kConfig = 1, kOther = 2 };

// Every rank learns the lowest failing rank, how many failed, and that rank's kind and message.
void settle(MPI_Comm comm, const std::string& what, int kind, std::string msg, bool name_rank) {
  int rank = 0, size = 1;
  MESHTRAIN_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MESHTRAIN_MPI_CHECK(MPI_Comm_size(comm, &size));
  // The lowest failing rank as the largest (size - rank); 0 when nobody failed (the common
  // case: one all-reduce). On failure a second one counts the failing ranks.
  const int mine = kind != kOk ? size - rank : 0, failing = kind != kOk ? 1 : 0;
  int top = 0, failed = 0;
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(&mine, &top, 1, MPI_INT, MPI_MAX, comm));
  if (top == 0) return;
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(&failing, &failed, 1, MPI_INT, MPI_SUM, comm));
  const int first = size - top;
  MESHTRAIN_MPI_CHECK(MPI_Bcast(&kind, 1, MPI_INT, first, comm));
  broadcast_string(comm, msg, first);
  if (!what.empty()) msg = cat(what, ": ", msg);
  // Where only some ranks failed, say which: the problem is local to them (a node's staging
  // folder, a file system that lags on one node). Error texts from check macros already carry
  // "[rank r, file:line]".
  if (name_rank && failed < size && msg.find(cat("[rank ", first, ",")) == std::string::npos)
    msg = cat(msg, " (rank ", first, " of ", size,
              failed > 1 ? cat("; ", failed - 1, " more rank(s) failed too") : std::string(), ")");
  if (kind == kConfig) throw Agreed<ConfigError>(msg);
  throw Agreed<Error>(msg);
}

void run_and_settle(MPI_Comm comm, const std::string& what, const std::function<void()>& f,
                    bool name_rank) {
  int kind = kOk;
  std::string msg;
  try {
    f();
  } catch (const ConfigError& e) {
    kind = kConfig, msg = e.what();
  } catch (const std::exception& e) {
    kind = kOther, msg = e.what();
  }
  settle(comm, what, kind, std::move(msg), name_rank);
}

}  // namespace

void agree(MPI_Comm comm, const std::string& what, const std::function<void()>& f) {
  run_and_settle(comm, what, f, true);
}

void agree_on_root(MPI_Comm comm, const std::string& what, const std::function<void()>& f) {
  int rank = 0;
  MESHTRAIN_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  // Only rank 0 runs f: naming it would add nothing.
  run_and_settle(comm, what, [&] {
    if (rank == 0) f();
  }, false);
}

void broadcast_string(MPI_Comm comm, std::string& s, int root) {
  unsigned long long n = s.size();
  MESHTRAIN_MPI_CHECK(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm));
  s.resize(static_cast<std::size_t>(n));
  if (n > 0) MESHTRAIN_MPI_CHECK(MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, root, comm));
}

void quiet_barrier(MPI_Comm comm) {
  MPI_Request req;
  MESHTRAIN_MPI_CHECK(MPI_Ibarrier(comm, &req));
  int done = 0;
  for (;;) {
    MESHTRAIN_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

bool any_rank(MPI_Comm comm, bool flag) {
  int mine = flag ? 1 : 0, any = 0;
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm));
  return any != 0;
}

}  // namespace meshtrain
