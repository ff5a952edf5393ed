#pragma once
// Fault injection for the tests of the executable: set once per process by `meshtrain train`
// from MESHTRAIN_TEST_* variables (app/train_cmd.cpp), never in production runs, and read at the
// few points where a fault is injected. Steps count completed steps; -1 leaves a hook off.
#include <cstdint>

namespace meshtrain::fault {

struct Hooks {
  std::int64_t crash_at_checkpoint = -1;  // world rank 0 raises SIGKILL after writing that
                                          // step's .tmp file, before the commit
  std::int64_t signal_at_step = -1;       // world rank signal_rank raises SIGUSR1 after that
  int signal_rank = -1;                   // step (-1: the last rank)
  std::int64_t wait_signal_at_step = -1;  // world rank 0 waits (up to 120 s) at that step's
                                          // boundary until a stop signal arrives from outside
  bool hold_after_stop = false;           // ...and then holds (up to 120 s) as a slow save
                                          // would, so that a second signal meets a rank still
                                          // busy with the first
  std::int64_t hold_ckpt_write = -1;       // the background write of that step's checkpoint
                                          // holds on every rank with its data written and
                                          // its .tmp still open (incomplete), until the
                                          // trainer waits for it (the next save, a stop, the
                                          // end; at most 120 s)
  std::int64_t nan_batch = -1;            // the gradients of data batch N are NaN on every
                                          // rank (a bad batch), wherever it is trained
  std::int64_t throw_at_step = -1;        // world rank throw_rank (-1: the last) throws an
  int throw_rank = -1;                    // Error of its own after that step (not agreed)
};

// The process's hooks (all off unless set).
Hooks& hooks();

}  // namespace meshtrain::fault
