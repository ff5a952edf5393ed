// The trainer's checkpoints: what a run records besides the model state (the step, the tokens
// seen, the seed, the loss scaler, the configuration), when it saves, and what it says about a
// restore. What each rank writes and reads under its layout is the engine's
// (parallel/engine_checkpoint.cpp).
#include <unistd.h>

#include <csignal>
#include <type_traits>

#include "meshtrain/core/fault_injection.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/signals.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::train {

template <class T>
io::CheckpointAttributes TrainerT<T>::checkpoint_attributes(std::int64_t steps_done) const {
  io::CheckpointAttributes a;
  a.tokens_seen = steps_done * tokens_per_step();
  a.seed = cfg_.seed;
  a.loss_scale = scaler_.scale();
  a.loss_scale_good_steps = scaler_.good_steps();
  a.loss_scale_skipped = scaler_.skipped();
  a.config_text = cfg_.config_text;
  a.extra["train.precision"] = std::is_same_v<T, float> ? "fp32" : "16-bit";
  a.extra["train.tokens_per_step"] = std::to_string(tokens_per_step());
  a.extra["train.loss_scale_hysteresis"] = std::to_string(scaler_.hysteresis());
  if (!skipped_batches_.empty()) a.extra["train.skipped_batches"] = format_batches(skipped_batches_);
  a.extra["data.sources"] = data_record(steps_done);  // what each source has supplied
  return a;
}

template <class T>
std::string TrainerT<T>::save_checkpoint(std::int64_t steps_done) {
  if (writer_) {  // the same file, through the writer thread
    start_save(steps_done);
    finish_save(steps_done, false);
    return last_checkpoint_;
  }
  last_checkpoint_ = engine_.save_checkpoint(cfg_.ckpt.dir, steps_done,
                                             checkpoint_attributes(steps_done),
                                             cfg_.ckpt.transfer, cfg_.ckpt.keep);
  return last_checkpoint_;
}

template <class T>
io::CheckpointAttributes TrainerT<T>::restore(const std::string& spec) {
  // A write in flight first: `latest` may be about to change, and HDF5 serves one thread.
  finish_save(start_step_);
  const Timer t;
  io::CheckpointAttributes a =
      engine_.load_checkpoint(spec, cfg_.ckpt.dir, cfg_.ckpt.verify, cfg_.ckpt.transfer);
  const auto hyst = a.extra.find("train.loss_scale_hysteresis");  // absent before issue 37
  scaler_.set_state(static_cast<float>(a.loss_scale), static_cast<int>(a.loss_scale_good_steps),
                    a.loss_scale_skipped, hyst == a.extra.end() ? -1 : std::stoi(hyst->second));
  start_step_ = a.step;
  last_checkpoint_ = a.path;
  const auto skipped = a.extra.find("train.skipped_batches");
  skipped_batches_ = skipped == a.extra.end() ? std::vector<std::int64_t>{}
                                              : parse_batches(skipped->second);

  logging::info("resumed from ", a.path, " after step ", a.step, " (", a.tokens_seen,
                " tokens; saved under ", io::describe(a.layout), ") in ",
                static_cast<long long>(t.seconds() * 1e3 + 0.5), " ms");
  restore_data(a);
  if (a.seed != cfg_.seed)
    logging::warn("train.seed=", cfg_.seed, " differs from the checkpoint's seed ", a.seed,
                  ": the data order from here on is not the one the saved run would have seen");
  if (a.step > 0 && a.tokens_seen != a.step * tokens_per_step())
    logging::warn("the checkpoint saw ", a.tokens_seen / a.step, " tokens per step, this run "
                  "trains ", tokens_per_step(), ": the global batch changed");
  if (a.step >= cfg_.steps)
    logging::warn("the checkpoint is at step ", a.step, " and train.steps=", cfg_.steps,
                  ": nothing left to train");
  return a;
}

template <class T>
void TrainerT<T>::signal_test_hooks(std::int64_t steps_done) {
  const auto& h = fault::hooks();
  const int rank = engine_.world_rank(), size = engine_.world_size();
  if (h.signal_at_step == steps_done && rank == (h.signal_rank < 0 ? size - 1 : h.signal_rank)) {
    logging::each("test hook: raising SIGUSR1 after step ", steps_done);
    std::raise(SIGUSR1);
  }
  if (h.wait_signal_at_step == steps_done && rank == 0) {
    logging::each("test hook: waiting for a stop signal after step ", steps_done);
    const Timer t;
    while (!signals::stop_requested() && t.seconds() < 120) usleep(10000);
    if (h.hold_after_stop && signals::stop_requested()) {
      logging::each("test hook: stop signal seen, holding before the save");
      const Timer held;
      while (held.seconds() < 120) usleep(10000);
    }
  }
}

#define MESHTRAIN_TRAINER_CKPT(T)                                                    \
  template io::CheckpointAttributes TrainerT<T>::checkpoint_attributes(std::int64_t) const; \
  template std::string TrainerT<T>::save_checkpoint(std::int64_t);                   \
  template io::CheckpointAttributes TrainerT<T>::restore(const std::string&);       \
  template void TrainerT<T>::signal_test_hooks(std::int64_t);
MESHTRAIN_TRAINER_CKPT(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_TRAINER_CKPT(bf16)
MESHTRAIN_TRAINER_CKPT(fp16)
#endif
#undef MESHTRAIN_TRAINER_CKPT

}  // namespace meshtrain::train
