// Asynchronous checkpoints (issue 36, ckpt.async): a save costs the training thread the copy of
// its state into host staging buffers (Engine::stage_checkpoint); a background thread with its
// own communicator writes and commits the file (io::BackgroundWriter) while the next steps run.
//
// Every decision about a write is agreed over the world, so the ranks act at the same step:
// whether a write has ended well everywhere (then it is collected and `latest` names it) or
// failed somewhere (then the run ends with the file and the cause, `latest` untouched) rides on
// the step boundary's all-reduce; waiting for a write (the next save, a stop, a rollback, the
// end of the run) polls the ranks' writers together, so a write that failed on one rank while
// another's waits for it in a collective ends the wait everywhere instead of hanging it.
#include <chrono>
#include <cstdlib>
#include <thread>

#include "meshtrain/core/log.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::train {

namespace {

using State = io::BackgroundWriter::State;

}  // namespace

template <class T>
void TrainerT<T>::start_save(std::int64_t steps_done) {
  finish_save(steps_done);  // at most one write in flight: its buffers are about to be reused
  writer_->start(engine_.stage_checkpoint(cfg_.ckpt.dir, steps_done,
                                          checkpoint_attributes(steps_done), cfg_.ckpt.transfer,
                                          cfg_.ckpt.keep));
}

template <class T>
void TrainerT<T>::finish_save(std::int64_t steps_done, bool log) {
  if (!writer_ || !writer_->in_flight()) return;  // the same on every rank
  writer_->release_hold();
  for (;;) {
    const State s = writer_->state();
    int f[2] = {s == State::failed ? 1 : 0, s == State::writing ? 1 : 0};
    engine_.max_over_ranks(f, 2);
    if (f[0]) write_failed(steps_done);
    if (!f[1]) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  collect_write(log);
}

template <class T>
void TrainerT<T>::after_boundary(const Boundary& b, std::int64_t steps_done) {
  if (!writer_ || !writer_->in_flight()) return;
  if (b.write_failed) write_failed(steps_done);
  if (!b.write_busy) collect_write(true);  // ended well on every rank
}

template <class T>
void TrainerT<T>::collect_write(bool log) {
  const io::BackgroundWriter::Outcome o = writer_->wait();
  MESHTRAIN_CHECK(o.ok, "collecting a background checkpoint write that did not succeed: ",
                  o.error);
  last_checkpoint_ = o.path;
  if (log)
    logging::info("saved checkpoint ", o.path, " (step ", o.step, ", written in the background in ",
                  static_cast<long long>(o.seconds * 1e3 + 0.5), " ms on ", o.cpus, " CPU",
                  o.cpus == 1 ? "" : "s", ")");
}

template <class T>
void TrainerT<T>::write_failed(std::int64_t steps_done) {
  const std::int64_t step = writer_->step();
  const std::string before =
      last_checkpoint_.empty() ? std::string("the last checkpoint before this run")
                               : last_checkpoint_;
  try {
    // The lowest failing rank's cause, on every rank.
    engine_.agree("", [&] {
      if (writer_->state() != State::failed) return;
      const io::BackgroundWriter::Outcome o = writer_->wait();
      const std::string msg =
          cat("the checkpoint of step ", step, " could not be written in the background "
              "(reported after step ", steps_done, "): ", o.error, ". ", cfg_.ckpt.dir,
              "/latest was not changed: it still names ", before, ". Training stops");
      if (o.config_error) throw ConfigError(msg);
      throw Error(msg);
    });
  } catch (...) {
    // A rank whose write still runs waits for the failed ones in a collective that will not
    // complete: it is left behind, and the job ends through MPI_Abort once the error is out.
    writer_->abandon();
    throw;
  }
  MESHTRAIN_CHECK(false, "a background checkpoint write was reported failed, but no rank has it");
  std::abort();  // not reached: the check throws
}

#define MESHTRAIN_TRAINER_ASYNC(T)                                                   \
  template void TrainerT<T>::start_save(std::int64_t);                               \
  template void TrainerT<T>::finish_save(std::int64_t, bool);                        \
  template void TrainerT<T>::after_boundary(const Boundary&, std::int64_t);          \
  template void TrainerT<T>::collect_write(bool);                                    \
  template void TrainerT<T>::write_failed(std::int64_t);
MESHTRAIN_TRAINER_ASYNC(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_TRAINER_ASYNC(bf16)
MESHTRAIN_TRAINER_ASYNC(fp16)
#endif
#undef MESHTRAIN_TRAINER_ASYNC

}  // namespace meshtrain::train
