#include "meshtrain/parallel/pipeline_runner.hpp"

#include <algorithm>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/timer.hpp"

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
struct PipelineRunner<T>::Posted {
  std::size_t action;  // index into actions_
  int buffer;          // index into pool_
  comm::Request req;
};

template <class T>
PipelineRunner<T>::PipelineRunner(model::GptT<T>& model, comm::Communicator& pp,
                                  const ScheduleSpec& spec, int stage, int recv_ahead)
    : model_(model), pp_(pp), spec_(spec), stage_(stage), recv_ahead_(std::max(recv_ahead, 0)) {
  validate(spec_);
  MESHTRAIN_CHECK(pp.size() == spec.pp && pp.rank() == stage, "PipelineRunner: stage ", stage,
                  " of pp=", spec.pp, " on a communicator of rank ", pp.rank(), " / size ",
                  pp.size());
  actions_ = build_schedule(spec_, stage_);
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
  for (std::size_t i = 0; i < actions_.size(); ++i)
    if (actions_[i].op == Op::recv_act || actions_[i].op == Op::recv_grad) recv_at_.push_back(i);
  act_sends_.resize(static_cast<std::size_t>(spec.chunks * n_slots_));
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
int PipelineRunner<T>::take_buffer() {
  if (free_.empty()) {
    PipelineStepStats unused;
    reap_sends(false, unused);
  }
  if (free_.empty()) {
    pool_.push_back(alloc<T>("pipeline_message", model_.activation_elems()));
    return static_cast<int>(pool_.size()) - 1;
  }
  const int b = free_.back();
  free_.pop_back();
  return b;
}

// Returns the buffers of completed gradient sends to the pool; with wait_all, waits for all.
template <class T>
void PipelineRunner<T>::reap_sends(bool wait_all, PipelineStepStats& st) {
  Timer t;
  auto done = [&](std::pair<comm::Request, int>& s) {
    if (wait_all) s.first.wait();
    if (!s.first.test()) return false;
    free_.push_back(s.second);
    return true;
  };
  grad_sends_.erase(std::remove_if(grad_sends_.begin(), grad_sends_.end(), done),
                    grad_sends_.end());
  if (wait_all) st.idle_s += t.seconds();
}

template <class T>
void PipelineRunner<T>::post_receives(std::size_t upto, PipelineStepStats& st) {
  upto = std::min(upto, recv_at_.size());
  while (next_post_ < upto) {
    const std::size_t i = recv_at_[next_post_++];
    const Action& a = actions_[i];
    const int b = take_buffer();
    auto p = std::make_unique<Posted>();
    p->action = i;
    p->buffer = b;
    p->req = pp_.irecv(pool_[static_cast<std::size_t>(b)], a.peer, tag(a));
    posted_.push_back(std::move(p));
    ++st.messages;
  }
}

template <class T>
PipelineStepStats PipelineRunner<T>::step(const BatchProvider& batch, float grad_scale) {
  PipelineStepStats st;
  Timer wall;
  next_post_ = 0;
  std::size_t received = 0;  // receive actions done
  int input = -1;            // pool buffer holding the received input of the next compute
  View1<const T> out;        // what the last compute produced, for the send after it
  auto release_input = [&] {
    if (input >= 0) free_.push_back(input);
    input = -1;
  };
  auto input_view = [&]() -> View1<const T> {
    return input >= 0 ? View1<const T>(pool_[static_cast<std::size_t>(input)]) : View1<const T>{};
  };
  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    // The receive this action may wait for, and recv_ahead after it, are in flight.
    post_receives(received + 1 + static_cast<std::size_t>(recv_ahead_), st);
    // Micro-batches in flight in one chunk are consecutive: modulo the chunk's peak never
    // gives two live ones the same slot.
    const int slot = a.micro % chunk_slots_[static_cast<std::size_t>(a.chunk)];
    comm::Request& act_send =
        act_sends_[static_cast<std::size_t>(a.chunk * n_slots_ + slot)];
    switch (a.op) {
      case Op::recv_act:
      case Op::recv_grad: {
        MESHTRAIN_CHECK(!posted_.empty() && posted_.front()->action == i,
                        "PipelineRunner: receive ", to_string(a), " was not posted");
        Timer t;
        posted_.front()->req.wait();
        st.idle_s += t.seconds();
        input = posted_.front()->buffer;
        posted_.erase(posted_.begin());
        ++received;
        break;
      }
      case Op::forward: {
        act_send.wait();  // the slot's previous output left (long ago: see the header)
        const MicroBatch mb = batch(a.micro);
        Timer t;
        out = model_.forward(a.chunk, slot, mb.tokens, input_view(), mb.targets, grad_scale);
        st.compute_s += t.seconds();
        release_input();  // the model copied it
        break;
      }
      case Op::send_act:
        MESHTRAIN_CHECK(out.span() == model_.activation_elems(), "PipelineRunner: ",
                        to_string(a), " has no activation to send");
        act_send = pp_.isend(out, a.peer, tag(a));
        ++st.messages;
        break;
      case Op::backward: {
        {
          // Complete already: the next stage received this activation before it sent the
          // gradient this backward consumes. Waiting makes that explicit before the model may
          // overwrite the slot (recompute rewrites block outputs).
          Timer t;
          act_send.wait();
          st.idle_s += t.seconds();
        }
        Timer t;
        out = model_.backward(a.chunk, slot, input_view());
        st.compute_s += t.seconds();
        release_input();
        break;
      }
      case Op::send_grad: {
        MESHTRAIN_CHECK(out.span() == model_.activation_elems(), "PipelineRunner: ",
                        to_string(a), " has no gradient to send");
        // The model's d(input) is overwritten by its next backward: send a copy.
        const int b = take_buffer();
        Kokkos::deep_copy(model_.exec(), pool_[static_cast<std::size_t>(b)], out);
        grad_sends_.emplace_back(pp_.isend(pool_[static_cast<std::size_t>(b)], a.peer, tag(a)), b);
        ++st.messages;
        break;
      }
    }
  }
  MESHTRAIN_CHECK(posted_.empty() && received == recv_at_.size(),
                  "PipelineRunner: receives left over at the end of the step");
  {
    Timer t;
    for (comm::Request& r : act_sends_) r.wait();
    st.idle_s += t.seconds();
  }
  reap_sends(true, st);
  st.wall_s = wall.seconds();
  return st;
}

template class PipelineRunner<float>;
#if MESHTRAIN_HAVE_BF16
template class PipelineRunner<bf16>;
template class PipelineRunner<fp16>;
#endif

}  // namespace meshtrain::parallel
