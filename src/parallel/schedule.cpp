#include "meshtrain/parallel/schedule.hpp"

#include <algorithm>

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

ScheduleKind parse_schedule_kind(const std::string& text) {
  if (text == "gpipe") return ScheduleKind::gpipe;
  if (text == "1f1b") return ScheduleKind::one_f_one_b;
  if (text == "interleaved") return ScheduleKind::interleaved;
  throw ConfigError(cat("pp.schedule='", text, "' is not a pipeline schedule (gpipe, 1f1b or ",
                        "interleaved)"));
}

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
    case ScheduleKind::forward_only: return "forward-only";
  }
  return "?";
}

const char* op_name(Op op) {
  switch (op) {
    case Op::recv_act: return "recv_act";
    case Op::forward: return "forward";
    case Op::send_act: return "send_act";
    case Op::recv_grad: return "recv_grad";
    case Op::backward: return "backward";
    case Op::send_grad: return "send_grad";
  }
  return "?";
}

std::string to_string(const Action& a) {
  std::string s = cat(op_name(a.op), "(micro ", a.micro, ", chunk ", a.chunk);
  if (a.peer >= 0) s += cat(", peer ", a.peer);
  return s + ")";
}

void validate(const ScheduleSpec& s) {
  MESHTRAIN_CONFIG_CHECK(s.pp >= 1, "mesh.pp=", s.pp, " must be a positive integer");
  MESHTRAIN_CONFIG_CHECK(s.n_micro >= 1, "train.grad_accum=", s.n_micro,
                         " must be a positive integer (micro-batches per step)");
  MESHTRAIN_CONFIG_CHECK(s.chunks >= 1, "pp.virtual_chunks=", s.chunks,
                         " must be a positive integer");
  MESHTRAIN_CONFIG_CHECK(s.chunks == 1 || s.kind == ScheduleKind::interleaved ||
                             s.kind == ScheduleKind::forward_only,
                         "pp.virtual_chunks=", s.chunks, " needs pp.schedule=interleaved (got ",
                         schedule_name(s.kind), ")");
  // Megatron-Core (forward_backward_pipelining_with_interleaving) raises the same: micro-batches
  // go through the chunks in groups of pp, so the last group must be complete.
  if (s.kind == ScheduleKind::interleaved && s.chunks > 1 && s.pp > 1)
    MESHTRAIN_CONFIG_CHECK(s.n_micro % s.pp == 0, "train.grad_accum=", s.n_micro,
                           " is not a multiple of mesh.pp=", s.pp,
                           ", which the interleaved schedule with pp.virtual_chunks=", s.chunks,
                           " needs (micro-batches enter the chunks in groups of pp)");
}

void validate(const ScheduleSpec& s, int n_layer) {
  validate(s);
  const int pieces = s.n_pieces();
  MESHTRAIN_CONFIG_CHECK(pieces <= n_layer, "mesh.pp=", s.pp, " x pp.virtual_chunks=", s.chunks,
                         " = ", pieces, " pipeline stages but model.n_layer=", n_layer,
                         " (each stage needs at least one block)");
  if (s.kind == ScheduleKind::interleaved && s.chunks > 1)
    MESHTRAIN_CONFIG_CHECK(n_layer % pieces == 0, "model.n_layer=", n_layer,
                           " is not divisible by mesh.pp=", s.pp, " x pp.virtual_chunks=",
                           s.chunks, " = ", pieces,
                           " (the interleaved schedule gives each virtual stage the same number "
                           "of blocks)");
}

namespace {

class Builder {
 public:
  Builder(const ScheduleSpec& s, int stage) : s_(s), stage_(stage) {}

  void fwd(int micro, int chunk) {
    const int vs = s_.virtual_stage(stage_, chunk);
    if (vs > 0) out_.push_back({Op::recv_act, micro, chunk, prev()});
    out_.push_back({Op::forward, micro, chunk, -1});
    if (vs < last()) out_.push_back({Op::send_act, micro, chunk, next()});
  }
  void bwd(int micro, int chunk) {
    const int vs = s_.virtual_stage(stage_, chunk);
    if (vs < last()) out_.push_back({Op::recv_grad, micro, chunk, next()});
    out_.push_back({Op::backward, micro, chunk, -1});
    if (vs > 0) out_.push_back({Op::send_grad, micro, chunk, prev()});
  }
  std::vector<Action> take() { return std::move(out_); }

 private:
  int last() const { return s_.n_pieces() - 1; }
  // The rank of the neighbouring virtual stage; chunk boundaries wrap from rank pp-1 to rank 0.
  int prev() const { return (stage_ + s_.pp - 1) % s_.pp; }
  int next() const { return (stage_ + 1) % s_.pp; }

  const ScheduleSpec& s_;
  int stage_;
  std::vector<Action> out_;
};

// PipeDream-Flush: stage s runs pp - s - 1 forwards ahead, then alternates one forward and one
// backward, then drains the remaining backwards. At most pp - s micro-batches are in flight.
void one_f_one_b(Builder& b, int pp, int m, int stage) {
  const int warmup = std::min(pp - stage - 1, m);
  const int steady = m - warmup;
  for (int i = 0; i < warmup; ++i) b.fwd(i, 0);
  for (int i = 0; i < steady; ++i) {
    b.fwd(warmup + i, 0);
    b.bwd(i, 0);
  }
  for (int i = steady; i < m; ++i) b.bwd(i, 0);
}

// Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, section 2.2; Megatron-Core
// schedules.py, forward_backward_pipelining_with_interleaving). The k-th forward of a rank
// runs micro-batch group k / (pp v) and, inside the group, chunk (k mod pp v) / pp on
// micro-batch (k mod pp); the k-th backward is the same walk with the chunks reversed.
void interleaved(Builder& b, int pp, int v, int m, int stage) {
  const int total = v * m;
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % (pp * v)) / pp;
    return forward ? c : v - 1 - c;
  };
  auto micro_of = [&](int k) { return (k / (pp * v)) * pp + k % pp; };
  int warmup;
  if (m == pp) {
    warmup = total;  // Megatron: with one group every forward runs first
  } else {
    warmup = std::min((pp - stage - 1) * 2 + (v - 1) * pp, total);
  }
  const int steady = total - warmup;
  for (int k = 0; k < warmup; ++k) b.fwd(micro_of(k), chunk_of(k, true));
  for (int k = 0; k < steady; ++k) {
    const int kf = warmup + k;
    b.fwd(micro_of(kf), chunk_of(kf, true));
    b.bwd(micro_of(k), chunk_of(k, false));
  }
  for (int k = steady; k < total; ++k) b.bwd(micro_of(k), chunk_of(k, false));
}

}  // namespace

std::vector<Action> build_schedule(const ScheduleSpec& s, int stage) {
  validate(s);
  MESHTRAIN_CHECK(stage >= 0 && stage < s.pp, "build_schedule: stage ", stage,
                  " outside [0, ", s.pp, ")");
  Builder b(s, stage);
  const int m = s.n_micro;
  switch (s.kind) {
    case ScheduleKind::gpipe:
      for (int i = 0; i < m; ++i) b.fwd(i, 0);
      for (int i = 0; i < m; ++i) b.bwd(i, 0);
      break;
    case ScheduleKind::one_f_one_b: one_f_one_b(b, s.pp, m, stage); break;
    case ScheduleKind::interleaved:
      // One chunk is plain 1F1B, as in Megatron (which runs the non-interleaved schedule then).
      if (s.chunks == 1) one_f_one_b(b, s.pp, m, stage);
      else interleaved(b, s.pp, s.chunks, m, stage);
      break;
    case ScheduleKind::forward_only:
      for (int i = 0; i < m; ++i)
        for (int c = 0; c < s.chunks; ++c) b.fwd(i, c);
      break;
  }
  return b.take();
}

MessageKey message_key(const ScheduleSpec& s, int stage, const Action& a) {
  const int vs = s.virtual_stage(stage, a.chunk);
  switch (a.op) {
    case Op::send_act: return {false, a.micro, vs};
    case Op::recv_act: return {false, a.micro, vs - 1};
    case Op::send_grad: return {true, a.micro, vs - 1};
    case Op::recv_grad: return {true, a.micro, vs};
    default: break;
  }
  throw_error(cat("message_key: ", to_string(a), " is not a send or receive"), __FILE__,
              __LINE__);
}

namespace {
// Peak of forwards minus backwards: over all chunks (per_chunk false) or the largest of one
// chunk (per_chunk true).
int peak_in_flight(const ScheduleSpec& s, int stage, bool per_chunk) {
  std::vector<int> live(static_cast<std::size_t>(s.chunks), 0);
  int total = 0, peak = 0;
  for (const Action& a : build_schedule(s, stage)) {
    const int d = a.op == Op::forward ? 1 : a.op == Op::backward ? -1 : 0;
    if (d == 0) continue;
    live[static_cast<std::size_t>(a.chunk)] += d;
    total += d;
    peak = std::max(peak, per_chunk ? live[static_cast<std::size_t>(a.chunk)] : total);
  }
  return peak;
}
}  // namespace

int max_in_flight(const ScheduleSpec& s, int stage) { return peak_in_flight(s, stage, false); }
int slots_needed(const ScheduleSpec& s, int stage) { return peak_in_flight(s, stage, true); }

std::vector<int> chunk_slots_needed(const ScheduleSpec& s, int stage) {
  std::vector<int> live(static_cast<std::size_t>(s.chunks), 0), peak(live);
  for (const Action& a : build_schedule(s, stage)) {
    const int d = a.op == Op::forward ? 1 : a.op == Op::backward ? -1 : 0;
    if (d == 0) continue;
    const auto c = static_cast<std::size_t>(a.chunk);
    live[c] += d;
    peak[c] = std::max(peak[c], live[c]);
  }
  for (int& p : peak) p = std::max(p, 1);
  return peak;
}

double analytic_bubble(const ScheduleSpec& s) {
  const double p = s.pp, vm = static_cast<double>(s.chunks) * s.n_micro;
  return (p - 1.0) / (vm + p - 1.0);
}

}  // namespace meshtrain::parallel
