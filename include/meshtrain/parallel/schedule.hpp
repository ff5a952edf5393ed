#pragma once
// Pipeline schedules as pure functions: each pipeline rank's ordered list of actions (receive,
// compute, send) for one training step. Nothing here touches MPI, so schedules are unit-tested
// without it (deadlock freedom, in-flight bound) and every rank can compute every other rank's
// list (the runner uses that to post receives in the order the peer sends).
//
// Vocabulary: pp pipeline ranks ("stages"), each holding v = chunks model chunks. Chunk c of
// rank r is virtual stage c * pp + r (Megatron's interleaving), so a micro-batch visits rank 0,
// 1, ..., pp-1, then rank 0 again for chunk 1, and so on; with v = 1 the virtual stage is the
// rank. m = n_micro micro-batches per step.
#include <string>
#include <vector>

namespace meshtrain::parallel {

enum class ScheduleKind {
  gpipe,        // all forwards, then all backwards (Huang et al. 2019): keeps m in flight
  one_f_one_b,  // PipeDream-Flush (Narayanan et al. 2021): warm-up, 1F1B, cool-down
  interleaved,  // Megatron's interleaved 1F1B over v virtual chunks per rank
  // Evaluation, not a training schedule (pp.schedule does not name it): forwards only, each
  // micro-batch through this rank's chunks in turn, micro-batches in order (so the last stage
  // adds their losses in the order a single rank does).
  forward_only,
};

// "gpipe" | "1f1b" | "interleaved"; ConfigError naming pp.schedule otherwise.
ScheduleKind parse_schedule_kind(const std::string& text);
const char* schedule_name(ScheduleKind k);

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int pp = 1;       // pipeline ranks
  int n_micro = 1;  // micro-batches per step (1: naive model parallelism)
  int chunks = 1;   // virtual chunks per rank (> 1 only for interleaved)

  int n_pieces() const { return pp * chunks; }  // virtual stages = contiguous layer pieces
  int virtual_stage(int stage, int chunk) const { return chunk * pp + stage; }
};

// Counts only: pp, n_micro, chunks >= 1; chunks > 1 only with interleaved (or forward_only,
// which runs a training layout's chunks); interleaved with
// pp > 1 and chunks > 1 needs n_micro % pp == 0 (Megatron's requirement: micro-batches enter
// the chunks in groups of pp). ConfigError naming the option otherwise.
void validate(const ScheduleSpec& spec);
// The counts, plus the model: at most one virtual stage per block (pp * v <= n_layer) and, for
// interleaving, n_layer divisible by pp * v (Megatron's layers per virtual stage).
void validate(const ScheduleSpec& spec, int n_layer);

enum class Op { recv_act, forward, send_act, recv_grad, backward, send_grad };
const char* op_name(Op op);

// One step of a rank's list. micro: micro-batch index; chunk: this rank's local chunk the
// action belongs to (the receiving chunk for a receive, the sending chunk for a send); peer:
// the pp rank sent to / received from, -1 for compute.
struct Action {
  Op op;
  int micro;
  int chunk;
  int peer;
  bool operator==(const Action&) const = default;
};
std::string to_string(const Action& a);

// Rank `stage`'s ordered actions for one step. A receive sits right before the compute that
// needs it (where the rank would block), a send right after the compute that produces it; the
// runner posts receives earlier and never blocks on sends.
std::vector<Action> build_schedule(const ScheduleSpec& spec, int stage);

// Identity of the message an action sends or receives, the same on both ends: activations
// cross virtual-stage boundary `boundary` -> `boundary + 1`, gradients the other way.
struct MessageKey {
  bool grad;     // false: activation (forward direction)
  int micro;
  int boundary;  // virtual stage that sends the activation (and receives its gradient)
  bool operator==(const MessageKey&) const = default;
};
MessageKey message_key(const ScheduleSpec& spec, int stage, const Action& a);  // comm ops only

// Micro-batches whose activations this rank keeps at once, summed over its chunks (the peak
// activation memory in units of one chunk's activations of one micro-batch).
int max_in_flight(const ScheduleSpec& spec, int stage);
// The model's activation slots per chunk: the peak over chunks of micro-batches in flight in
// one chunk. Every chunk runs its forwards and its backwards in micro-batch order, so the
// micro-batches in flight in a chunk are consecutive and slot = micro % n_slots never collides.
int slots_needed(const ScheduleSpec& spec, int stage);
// The same per chunk of the stage: chunk c's own peak. Interleaved chunks peak at different
// times (stage 0's first chunk holds up to 2(pp-1)+(v-1)pp+1 micro-batches, its last far fewer),
// so allocating each chunk its own count instead of the largest saves up to half the memory.
std::vector<int> chunk_slots_needed(const ScheduleSpec& spec, int stage);

// Idle fraction of an ideal pipeline (equal stages, free communication):
// (pp - 1) / (v m + pp - 1) (Narayanan et al. 2021, section 2.2).
double analytic_bubble(const ScheduleSpec& spec);

}  // namespace meshtrain::parallel
