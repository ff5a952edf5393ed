#include "meshtrain/parallel/pipeline_runner.hpp"

#include <algorithm>

#include "meshtrain/core/profile.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/parallel/receive_posting.hpp"

namespace meshtrain::parallel {

model::ModelLayout pipeline_layout(const ScheduleSpec& spec, const std::vector<LayerRange>& pieces,
                                   int stage, model::ModelLayout base) {
  MESHTRAIN_CHECK(static_cast<int>(pieces.size()) == spec.n_pieces(), "pipeline_layout: ",
                  pieces.size(), " pieces for pp=", spec.pp, " x chunks=", spec.chunks);
  base.chunks = stage_chunks(pieces, spec.pp, stage);
  base.has_embedding = stage == 0;
  base.has_head = stage == spec.pp - 1;
  base.n_slots = slots_needed(spec, stage);
  base.chunk_slots = chunk_slots_needed(spec, stage);
  base.pp_stage = stage;
  return base;
}

template <class T>
PipelineRunner<T>::PipelineRunner(model::GptT<T>& model, comm::Communicator& pp,
                                  const ScheduleSpec& spec, int stage, int recv_ahead)
    : model_(model),
      pp_(pp),
      spec_(spec),
      stage_(stage),
      n_slots_(0),
      recv_ahead_(recv_ahead),
      flow_((validate(spec), build_schedule(spec, stage)), chunk_slots_needed(spec, stage),
            post_policy_for(pp.stream_ordered()), recv_ahead,
            pp.stream_ordered() ? message_pool_cap(spec, stage) : 0,
            pp.stream_ordered() ? receive_posting(spec, stage) : std::vector<std::size_t>{}) {
  MESHTRAIN_CHECK(pp.size() == spec.pp && pp.rank() == stage, "PipelineRunner: stage ", stage,
                  " of pp=", spec.pp, " on a communicator of rank ", pp.rank(), " / size ",
                  pp.size());
  n_slots_ = slots_needed(spec_, stage_);
  const model::ModelLayout& l = model.layout();
  MESHTRAIN_CHECK(model.n_chunks() == spec.chunks, "PipelineRunner: the model holds ",
                  model.n_chunks(), " chunks, the schedule runs ", spec.chunks);
  chunk_slots_ = chunk_slots_needed(spec_, stage_);
  for (int c = 0; c < spec.chunks; ++c)
    MESHTRAIN_CHECK(model.slots(c) >= chunk_slots_[static_cast<std::size_t>(c)],
                    "PipelineRunner: the model keeps ", model.slots(c),
                    " activation slots in chunk ", c, ", the ", schedule_name(spec.kind),
                    " schedule needs ", chunk_slots_[static_cast<std::size_t>(c)], " on stage ",
                    stage);
  MESHTRAIN_CHECK(l.has_embedding == (stage == 0) && l.has_head == (stage == spec.pp - 1),
                  "PipelineRunner: stage ", stage, " of ", spec.pp,
                  " must hold the embedding iff first and the head iff last (pipeline_layout)");
  messages_.resize(flow_.actions().size());
  std::vector<int> peers;
  for (const Action& a : flow_.actions())
    if (a.peer >= 0) peers.push_back(a.peer);
  pp.prepare_p2p(peers);
  // at_use (NCCL): the whole capped pool now, so that no step allocates (an allocation or a
  // free synchronises the device, which must never wait for a message in flight mid-step).
  if (flow_.policy() == PostPolicy::at_use)
    for (int b = 0, cap = message_pool_cap(spec, stage); b < cap; ++b)
      pool_.push_back(alloc<T>("pipeline_message", model_.activation_elems()));
}

template <class T>
PipelineRunner<T>::~PipelineRunner() = default;

// Tags keep messages of one pair apart under MPI (NCCL ignores them and matches in issue order,
// which the schedule keeps consistent). MPI guarantees tags up to 32767; two messages that
// wrap to the same tag are thousands of micro-batches apart and never in flight together.
template <class T>
int PipelineRunner<T>::tag(const Action& a) const {
  const MessageKey k = message_key(spec_, stage_, a);
  const long message = static_cast<long>(k.micro) * spec_.n_pieces() + k.boundary;
  const long t = 2 * message + (k.grad ? 1 : 0);
  return static_cast<int>(t % 32768);
}

template <class T>
void PipelineRunner<T>::grow_pool(int buffer) {
  if (buffer < static_cast<int>(pool_.size())) return;  // allocated up front (at_use)
  MESHTRAIN_CHECK(buffer == static_cast<int>(pool_.size()), "PipelineRunner: pool grew to ",
                  buffer, " with ", pool_.size(), " buffers");
  pool_.push_back(alloc<T>("pipeline_message", model_.activation_elems()));
}

template <class T>
void PipelineRunner<T>::issue(const Message& m) {
  const Action& a = running_->actions()[m.action];
  const prof::Range range([&] { return cat("pipeline ", to_string(a)); });
  comm::Request& r = messages_[m.action];
  MESHTRAIN_CHECK(!r.pending(), "PipelineRunner: ", to_string(a), " issued twice in one step");
  if (a.op == Op::recv_act || a.op == Op::recv_grad) {
    r = pp_.irecv(pool_[static_cast<std::size_t>(m.buffer)], a.peer, tag(a));
  } else {
    MESHTRAIN_CHECK(out_.span() == model_.activation_elems(), "PipelineRunner: ", to_string(a),
                    " has nothing to send");
    if (a.op == Op::send_act) {
      r = pp_.isend(out_, a.peer, tag(a));
    } else {
      // The model's d(input) is overwritten by its next backward: send a copy.
      const auto b = static_cast<std::size_t>(m.buffer);
      Kokkos::deep_copy(model_.exec(), pool_[b], out_);
      r = pp_.isend(pool_[b], a.peer, tag(a));
    }
  }
  ++st_.messages;
}

template <class T>
void PipelineRunner<T>::wait(std::size_t i) {
  const prof::Range r([&] { return cat("pipeline wait ", to_string(running_->actions()[i])); });
  Timer t;
  messages_[i].wait();
  st_.idle_s += t.seconds();
}

template <class T>
bool PipelineRunner<T>::test(std::size_t i) {
  return messages_[i].test();
}

template <class T>
void PipelineRunner<T>::compute(std::size_t i, int input) {
  const Action& a = running_->actions()[i];
  const int slot = a.micro % chunk_slots_[static_cast<std::size_t>(a.chunk)];
  const View1<const T> in =
      input >= 0 ? View1<const T>(pool_[static_cast<std::size_t>(input)]) : View1<const T>{};
  const prof::Range r([&] { return cat("pipeline ", to_string(a)); });
  if (a.op == Op::forward) {
    // Only the chunk that embeds reads the tokens, only the head's the targets: the data of a
    // micro-batch is asked for where it is read, not once per chunk.
    const model::ModelLayout& l = model_.layout();
    const bool reads =
        (a.chunk == 0 && l.has_embedding) || (a.chunk == spec_.chunks - 1 && l.has_head);
    const StepBatch mb = reads ? (*batch_)(a.micro) : StepBatch{};
    Timer t;
    out_ = model_.forward(a.chunk, slot, mb.tokens, in, mb.targets, grad_scale_, train_);
    st_.compute_s += t.seconds();
    return;
  }
  Timer t;
  out_ = model_.backward(a.chunk, slot, in);
  st_.compute_s += t.seconds();
}

template <class T>
void PipelineRunner<T>::wait_all_sends() {
  Timer t;
  for (comm::Request& r : messages_) r.wait();
  st_.idle_s += t.seconds();
}

template <class T>
PipelineStepStats PipelineRunner<T>::run(MessageFlow& flow, const BatchProvider& batch,
                                         float grad_scale, bool train) {
  st_ = PipelineStepStats{};
  if (messages_.size() < flow.actions().size()) messages_.resize(flow.actions().size());
  running_ = &flow;
  batch_ = &batch;
  grad_scale_ = grad_scale;
  train_ = train;
  Timer wall;
  flow.run_step(*this);
  batch_ = nullptr;
  running_ = nullptr;
  st_.wall_s = wall.seconds();
  return st_;
}

template <class T>
PipelineStepStats PipelineRunner<T>::step(const BatchProvider& batch, float grad_scale) {
  return run(flow_, batch, grad_scale, true);
}

template <class T>
PipelineStepStats PipelineRunner<T>::forward_only(int n_micro, const BatchProvider& batch) {
  if (!forward_flow_ || forward_micro_ != n_micro) {
    ScheduleSpec s = spec_;
    s.kind = ScheduleKind::forward_only;
    s.n_micro = n_micro;
    // The step's slots (the model's), so a forward waits for the send from the slot it
    // overwrites as in a step. On NCCL every receive is posted at its use: receive_posting
    // moves receives earlier only for crossing gradients, which forwards alone never have;
    // and the step's pool, allocated up front, holds the one receive in flight at a time.
    forward_flow_ = std::make_unique<MessageFlow>(
        build_schedule(s, stage_), chunk_slots_, flow_.policy(), recv_ahead_,
        flow_.policy() == PostPolicy::at_use ? message_pool_cap(spec_, stage_) : 0);
    forward_micro_ = n_micro;
  }
  return run(*forward_flow_, batch, 0.0f, false);
}


template class PipelineRunner<float>;
#if MESHTRAIN_HAVE_BF16
template class PipelineRunner<bf16>;
template class PipelineRunner<fp16>;
#endif

}  // namespace meshtrain::parallel
