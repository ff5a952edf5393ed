// Writing a staged checkpoint, on the calling thread or in the background (checkpoint_async.hpp).
#include "meshtrain/io/checkpoint_async.hpp"

#include <optional>

#include <signal.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <exception>

#include "hdf5_util.hpp"
#include "meshtrain/core/fault_injection.hpp"
#include "meshtrain/core/profile.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/core/mpi_threads.hpp"
#include "meshtrain/core/timer.hpp"

namespace meshtrain::io {

namespace {

// How long a writer destroyed by an exception waits for its write before leaving it behind: the
// other ranks' writers finish theirs meanwhile unless one of them is gone.
constexpr double kUnwindWaitSeconds = 30;
// The longest a test hold keeps a write from committing.
constexpr double kHoldSeconds = 120;

int rank_of(MPI_Comm comm) {
  int r = 0;
  MESHTRAIN_MPI_CHECK(MPI_Comm_rank(comm, &r));
  return r;
}

}  // namespace

std::string write_staged(MPI_Comm comm, const StagedCheckpoint& s,
                         const std::function<void()>& before_close, bool ranges) {
  CheckpointWriter writer(comm, s.dir, s.step);
  if (before_close) writer.set_before_close(before_close);
  {
    std::optional<prof::Range> phase;
    if (ranges) phase.emplace("checkpoint: write");
    writer.write(s.attrs, s.groups, s.transfer);
  }
  if (fault::hooks().crash_at_checkpoint == s.step && rank_of(comm) == 0) {
    logging::each("test hook: rank 0 kills itself after writing ", writer.tmp_path());
    std::raise(SIGKILL);
  }
  std::optional<prof::Range> phase;
  if (ranges) phase.emplace("checkpoint: commit");
  return writer.commit(s.keep);
}

BackgroundWriter::BackgroundWriter(MPI_Comm world) : sh_(std::make_shared<Shared>()) {
  MESHTRAIN_CHECK(mpi_thread_multiple(), "a background checkpoint writer calls MPI from its own "
                  "thread, which needs MPI_THREAD_MULTIPLE");
  MESHTRAIN_MPI_CHECK(MPI_Comm_dup(world, &sh_->comm));
  MESHTRAIN_MPI_CHECK(MPI_Comm_set_errhandler(sh_->comm, MPI_ERRORS_RETURN));
}

BackgroundWriter::~BackgroundWriter() {
  if (thread_.joinable()) {
    if (std::uncaught_exceptions() > 0) {
      // The job is failing; a write that cannot finish (a rank gone) must not keep it alive.
      sh_->release = true;
      const Timer t;
      while (state() == State::writing && t.seconds() < kUnwindWaitSeconds) usleep(10000);
      if (state() == State::writing) abandon();
    }
    if (thread_.joinable()) thread_.join();
  }
  if (sh_->comm != MPI_COMM_NULL) MPI_Comm_free(&sh_->comm);
}

BackgroundWriter::State BackgroundWriter::state() const {
  return static_cast<State>(sh_->state.load(std::memory_order_acquire));
}

void BackgroundWriter::start(StagedCheckpoint s) {
  MESHTRAIN_CHECK(state() == State::idle, "a background checkpoint write (step ", step_,
                  ") is still in flight: wait() for it before starting the next");
  MESHTRAIN_CHECK(sh_->comm != MPI_COMM_NULL, "this background writer was abandoned");
  if (thread_.joinable()) thread_.join();
  step_ = s.step;
  sh_->result = Outcome{};
  sh_->release = false;
  sh_->state.store(static_cast<int>(State::writing), std::memory_order_release);
  // Stop signals belong to the training thread (it agrees on them at step boundaries): the
  // writer thread inherits a mask that blocks them, so none interrupts its file I/O.
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  try {
    thread_ = std::thread([sh = sh_, st = std::move(s)]() mutable { run(sh, std::move(st)); });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    sh_->state.store(static_cast<int>(State::idle), std::memory_order_release);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

namespace {

// Lets the calling thread run on every CPU of the node that the job's cpuset allows (the kernel
// intersects the mask with it). The writer inherits the rank's binding, and launchers bind a
// rank to its cores (Open MPI binds each of up to 2 ranks to one core by default): there the
// writer shared the training thread's one core while the node's other cores idled, and on a
// 2-core machine a write took 20-37 s instead of 10 (perf/README, asynchronous checkpoints). At
// nice 19 it takes only what other threads leave, wherever that is. Returns the CPUs it may run
// on now (the inherited mask where widening fails).
int widen_to_node() {
  const long n = sysconf(_SC_NPROCESSORS_CONF);
  if (n > 0 && n <= CPU_SETSIZE) {
    cpu_set_t all;
    CPU_ZERO(&all);
    for (long c = 0; c < n; ++c) CPU_SET(static_cast<int>(c), &all);
    sched_setaffinity(0, sizeof all, &all);  // 0: this thread; a failure keeps the binding
  }
  cpu_set_t now;
  CPU_ZERO(&now);
  return sched_getaffinity(0, sizeof now, &now) == 0 ? CPU_COUNT(&now) : 0;
}

}  // namespace

void BackgroundWriter::run(const std::shared_ptr<Shared>& sh, StagedCheckpoint s) {
  // The writer takes what the training thread leaves: the lowest CPU priority for this thread
  // (Linux gives each thread its own nice value), on any CPU of the node. Where a core is free
  // (GPU nodes, a CPU rank bound to one core of several) it writes there; where training keeps
  // every core busy (a small CPU node) training keeps its speed and the write takes longer.
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  Outcome o;
  o.cpus = widen_to_node();
  o.started = true;
  o.step = s.step;
  const Timer t;
  // Test hook: with its data in but its file still open (incomplete), the write holds until
  // the trainer waits for it, so a test can kill or signal the job during a background write.
  auto hold = [&] {
    if (fault::hooks().hold_ckpt_write != s.step) return;
    if (rank_of(sh->comm) == 0)
      logging::each("test hook: background write of step ", s.step, " held before its file is "
                    "closed");
    const Timer held;
    while (!sh->release.load() && held.seconds() < kHoldSeconds) usleep(10000);
  };
  try {
    o.path = write_staged(sh->comm, s, hold);
    o.ok = true;
  } catch (const ConfigError& e) {
    o.error = e.what();
    o.config_error = true;
  } catch (const std::exception& e) {
    o.error = e.what();
  }
  o.seconds = t.seconds();
  const bool ok = o.ok;
  sh->result = std::move(o);
  sh->state.store(static_cast<int>(ok ? State::done : State::failed), std::memory_order_release);
}

void BackgroundWriter::release_hold() { sh_->release = true; }

BackgroundWriter::Outcome BackgroundWriter::wait() {
  if (state() == State::idle) return Outcome{};
  sh_->release = true;
  if (thread_.joinable()) thread_.join();
  Outcome o = std::move(sh_->result);
  sh_->result = Outcome{};
  sh_->state.store(static_cast<int>(State::idle), std::memory_order_release);
  return o;
}

void BackgroundWriter::abandon() {
  if (state() != State::writing) return;
  sh_->release = true;
  if (thread_.joinable()) thread_.detach();
  // The thread may still use the communicator and an open parallel file: neither is freed (the
  // thread keeps its own reference to what it shares), and the job's error handler ends the
  // process with MPI_Abort.
  sh_ = std::make_shared<Shared>();
  h5::note_released();
}

}  // namespace meshtrain::io
