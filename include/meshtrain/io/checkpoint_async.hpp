#pragma once
// Checkpoints off the critical path (issue 36). A save is two steps:
//  1. staging, on the training thread (parallel/engine_checkpoint.cpp): each rank copies the
//     pieces of its ZeRO partition (parameters or master weights, Adam's m and v) into host
//     buffers and fixes the attributes (step, tokens, loss scaler, configuration, layout);
//  2. writing the staged copy: CheckpointWriter::write and commit (write_staged), the same file
//     byte for byte whoever runs it.
// A synchronous save runs both on the training thread over the world. BackgroundWriter runs
// step 2 on a thread of its own, over a communicator of its own (a duplicate of the world made
// when it is built, on the building thread), while training continues: MPI calls from two
// threads at once need MPI_THREAD_MULTIPLE, which the constructor checks.
//
// HDF5 (Debian's parallel build) is not thread-safe: while a write is in flight the training
// thread makes no HDF5 call (a restore waits for the write first). The staging buffers belong
// to whoever staged; they must stay untouched until the write has ended.
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/io/checkpoint.hpp"

namespace meshtrain::io {

// One rank's part of a checkpoint, ready to be written: data pointers of `groups` point into
// host staging buffers.
struct StagedCheckpoint {
  std::string dir;
  std::int64_t step = 0;
  CheckpointAttributes attrs;
  std::vector<SaveGroup> groups;
  Transfer transfer = Transfer::automatic;
  int keep = 0;  // ckpt.keep: retention after the commit
};

// Collective over `comm` (any communicator over the ranks that staged): writes `s` into
// <dir>/step_XXXXXXXX.h5.tmp (running `before_close`, a test hook, once this rank's data is in
// and the file still open), commits it and points `latest` at it. Returns the committed path.
// Errors as CheckpointWriter's. `ranges`: profiler ranges for the write and the commit (the
// training thread's saves; the background writer's thread records none).
std::string write_staged(MPI_Comm comm, const StagedCheckpoint& s,
                         const std::function<void()>& before_close = {}, bool ranges = false);

class BackgroundWriter {
 public:
  // Collective over `world`: duplicates it for the writer. Error when MPI does not provide
  // MPI_THREAD_MULTIPLE (callers check core/mpi_threads.hpp first and save synchronously).
  explicit BackgroundWriter(MPI_Comm world);
  // Waits for a write still in flight (bounded while an exception unwinds: see abandon()).
  ~BackgroundWriter();
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;

  // Starts writing `s` on the writer thread (collective in effect: every rank of the world must
  // start the same step). At most one write in flight: Error when one is.
  void start(StagedCheckpoint s);

  enum class State { idle, writing, done, failed };
  // Non-blocking: idle (nothing started or the last one collected), writing, or ended (done or
  // failed) and not yet collected by wait().
  State state() const;
  bool in_flight() const { return state() != State::idle; }
  std::int64_t step() const { return step_; }  // of the write in flight or last started

  struct Outcome {
    bool started = false;      // false: nothing was in flight
    bool ok = false;
    std::int64_t step = 0;
    std::string path;          // the committed file (ok)
    std::string error;         // the cause (not ok): names the file
    bool config_error = false;
    double seconds = 0;        // the write's duration on this rank
    int cpus = 0;              // CPUs the writer thread could run on (its affinity)
  };
  // Lets a write held by the test hook (fault::Hooks::hold_ckpt_write) go on.
  void release_hold();
  // Blocks until the write in flight has ended (at once when none) and collects it. Releases a
  // test hold first.
  Outcome wait();
  // The job is failing and will not wait for this write: a write still running is left to the
  // process's end (its thread detached) and the process is marked as holding a parallel HDF5
  // file it cannot close, so the error handler ends the job with MPI_Abort
  // (io::abandoned_hdf5_files).
  void abandon();

 private:
  // What the writer thread shares with its owner; the thread holds a reference of its own, so
  // an abandoned (detached) thread never touches a destroyed writer.
  struct Shared {
    MPI_Comm comm = MPI_COMM_NULL;
    std::atomic<int> state{0};       // State
    std::atomic<bool> release{false};
    Outcome result;                  // written by the thread before `state` leaves `writing`
  };
  static void run(const std::shared_ptr<Shared>& sh, StagedCheckpoint s);

  std::shared_ptr<Shared> sh_;
  std::thread thread_;
  std::int64_t step_ = -1;
};

}  // namespace meshtrain::io
