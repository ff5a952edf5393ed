// The trainer at a step boundary (issue 17): one agreement over the world of the stop flag and
// the step's health, and what the divergence policy asks for: a rollback to the last
// checkpoint, or the end of the run without saving anything from a non-finite state.
#include <algorithm>

#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/fault_injection.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/signals.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::train {

template <class T>
typename TrainerT<T>::Boundary TrainerT<T>::agree_at_boundary(std::int64_t steps_done,
                                                               const StepMetrics& m) {
  signal_test_hooks(steps_done);
  const auto& h = fault::hooks();
  if (h.throw_at_step == steps_done) {
    const int rank = engine_.world_rank(), size = engine_.world_size();
    if (rank == (h.throw_rank < 0 ? size - 1 : h.throw_rank))
      MESHTRAIN_CHECK(false, "test hook: an error on this rank alone after step ", steps_done);
  }
  // [stop signal, non-finite loss, non-finite gradients, background checkpoint write failed,
  // still writing], the maximum over every rank.
  const auto ws = writer_ ? writer_->state() : io::BackgroundWriter::State::idle;
  int flags[5] = {signals::stop_requested() ? 1 : 0, engine_.loss_finite_here() ? 0 : 1,
                  m.skipped ? 1 : 0, ws == io::BackgroundWriter::State::failed ? 1 : 0,
                  ws == io::BackgroundWriter::State::writing ? 1 : 0};
  engine_.max_over_ranks(flags, 5);
  Boundary b;
  b.stop = flags[0] != 0;
  b.health.loss_finite = flags[1] == 0;
  b.health.grads_finite = flags[2] == 0;
  b.write_failed = flags[3] != 0;
  b.write_busy = flags[4] != 0;
  return b;
}

template <class T>
std::int64_t TrainerT<T>::roll_back(std::int64_t step) {
  const std::int64_t bad = io::batch_of_step(step, skipped_batches_);
  std::vector<std::int64_t> skipped = skipped_batches_;
  skipped.push_back(bad);
  MESHTRAIN_CHECK(!cfg_.ckpt.dir.empty(), "train.on_nonfinite=rollback needs ckpt.dir");
  finish_save(step + 1);  // a write in flight holds a state from before the bad step: keep it
  logging::warn(guard_.reason(), ": restoring the last checkpoint and leaving data batch ", bad,
                " out");
  try {
    restore("latest");
  } catch (const ConfigError& e) {
    // Every rank failed alike (restore agrees): no checkpoint to go back to is a divergence.
    throw Agreed<Error>(cat("training diverged: ", guard_.reason(), ", and there is no checkpoint "
                            "to roll back to (", e.what(), "); save checkpoints with ckpt.every"));
  }
  // The restored attributes hold the batches skipped before that save; ours are a superset.
  for (std::int64_t b : skipped_batches_) skipped.push_back(b);
  std::sort(skipped.begin(), skipped.end());
  skipped.erase(std::unique(skipped.begin(), skipped.end()), skipped.end());
  skipped_batches_ = std::move(skipped);
  logging::info("rolled back to step ", start_step_, " (", last_checkpoint_, "); batches left out: ",
                format_batches(skipped_batches_));
  return start_step_;
}

template <class T>
void TrainerT<T>::diverged(std::int64_t steps_done) {
  // A write in flight holds a finite state from before: it is committed first.
  finish_save(steps_done);
  // Every rank is here at the same step (the health was agreed): the error is agreed too.
  const std::string saved =
      last_checkpoint_.empty()
          ? std::string("no checkpoint was saved by this run")
          : cat("the last checkpoint, ", last_checkpoint_, ", is from before it and stays latest");
  throw Agreed<Error>(cat("training diverged: ", guard_.reason(), " (train.on_nonfinite=",
                          on_nonfinite_name(guard_.config().on_nonfinite),
                          "); nothing was saved or exported from this state, ", saved,
                          ". Lower train.lr, raise train.warmup, or set train.on_nonfinite to "
                          "skip or rollback"));
}

#define MESHTRAIN_TRAINER_GUARD(T)                                                          \
  template TrainerT<T>::Boundary TrainerT<T>::agree_at_boundary(std::int64_t,              \
                                                                 const StepMetrics&);      \
  template std::int64_t TrainerT<T>::roll_back(std::int64_t);                              \
  template void TrainerT<T>::diverged(std::int64_t);
MESHTRAIN_TRAINER_GUARD(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_TRAINER_GUARD(bf16)
MESHTRAIN_TRAINER_GUARD(fp16)
#endif
#undef MESHTRAIN_TRAINER_GUARD

}  // namespace meshtrain::train
