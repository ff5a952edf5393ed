#include "meshtrain/core/signals.hpp"

#include <atomic>
#include <signal.h>

#include <csignal>

#include "meshtrain/core/mpi_check.hpp"

namespace meshtrain::signals {

namespace {

// Lock-free atomics are async-signal-safe; sig_atomic_t alone says nothing about ordering.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) {
  const int prev = g_signal.exchange(sig);
  // The second Ctrl-C (or SIGTERM): the operator does not want to wait for the save.
  if ((sig == SIGTERM || sig == SIGINT) && prev == sig) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // system calls (file and network I/O) continue after the handler
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

bool stop_requested() { return g_signal.load() != 0; }
int stop_signal() { return g_signal.load(); }

bool stop_requested_anywhere(MPI_Comm comm) {
  int mine = stop_requested() ? 1 : 0, any = 0;
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm));
  return any != 0;
}

void clear_stop_request() { g_signal.store(0); }

}  // namespace meshtrain::signals
