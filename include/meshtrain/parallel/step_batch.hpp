#pragma once
// The step's data as data (issue 39): one micro-batch's tokens and targets, produced once by the
// data layer, uploaded once, and only on the pipeline stage that reads each part.
//
// The data layer (the trainer's source: io::BlendedDataset::fill for a step, a validation set's
// fill_sequential for evaluation) writes whole sequences into host memory. StepBatches turns
// the sequences of a micro-batch into a StepBatch where they are read: the tokens on the stage
// that embeds (the first), the targets on the stage that holds the head and the loss (the last);
// a middle stage reads nothing and uploads nothing. Each micro-batch is produced once per pass
// (a training step, an evaluation) whichever of the stage's chunks ask for it: under an
// interleaved schedule a micro-batch passes the first stage once per chunk, but only the first
// chunk embeds and only the last stage's last chunk reads the targets.
//
// The model reads the device views without copying them (GptT::forward). A micro-batch's tokens
// stay in a slot of their own until its embedding backward (the wte gradient reads them): one
// slot per activation slot of the embedding chunk, micro-batch m in slot m % slots (the pipeline
// runner's rule, so a slot is refilled only after its previous micro-batch's backward). The
// targets are read by the head's forward alone (the loss and its gradient in one pass), so one
// buffer serves every micro-batch. Uploads are ordered on the model's execution-space instance,
// after the work that read the buffer before. Under context parallelism the sequences are whole
// on the host and this rank's rows (its layout's positions) are uploaded.
#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::parallel {

// The data layer's side: writes `count` sequences, starting at sequence `first`, into host
// buffers of count x seq_len tokens each (the inputs, and the targets they predict).
using BatchSource =
    std::function<void(int first, int count, std::int32_t* inputs, std::int32_t* targets)>;

// One micro-batch as the model reads it: device views of B x T_local tokens (on the stage that
// embeds) and targets (on the stage that holds the head), empty where the stage does not read
// them. Positions are the model's own (0..T-1, or its rows' under context parallelism:
// ModelLayout::positions), the same for every micro-batch and uploaded once by the model;
// per-row positions and attention masks of packed sequences would join them here.
struct StepBatch {
  View1<const std::int32_t> tokens, targets;
};

class StepBatches {
 public:
  struct Shape {
    int micro_batch = 1;         // sequences per micro-batch (B)
    int seq_len = 1;             // tokens per sequence, as the data layer writes them
    std::vector<int> positions;  // context parallelism: the rows this rank holds; empty: all
    bool tokens = false;         // this stage embeds
    bool targets = false;        // this stage holds the head
    int token_slots = 1;         // activation slots of the embedding chunk
  };
  StepBatches(const Shape& shape, ExecSpace exec);

  // A pass over micro-batches (a training step, an evaluation): micro-batch m is the sequences
  // [first(m), first(m) + B) of `source`. Forgets what an earlier pass uploaded; both must
  // outlive the pass (until end()).
  void begin(const BatchSource& source, std::function<int(int micro)> first);
  void end();
  // Micro-batch m of the pass: produced and uploaded at the first call for it (or once its slot
  // was refilled by a later micro-batch, which no schedule does), the same views after that.
  StepBatch get(int micro);

  // Since construction: micro-batches the data layer produced, and host-to-device uploads.
  std::int64_t produced() const { return produced_; }
  std::int64_t uploads() const { return uploads_; }

 private:
  void produce(int micro);
  void upload(View1<std::int32_t> dst, HostView1<std::int32_t> whole,
              HostView1<std::int32_t> rows);

  Shape shape_;
  ExecSpace exec_;
  std::size_t local_ = 0;                        // B x rows held
  std::vector<View1<std::int32_t>> tokens_;      // per slot (the stage that embeds)
  View1<std::int32_t> targets_;                  // the stage that holds the head
  // What the data layer writes into: the device buffers' mirrors (in a host build, the
  // buffers), or whole sequences (context parallelism) with this rank's rows beside them.
  std::vector<HostView1<std::int32_t>> h_tokens_;  // per slot, or one of whole sequences
  HostView1<std::int32_t> h_targets_;
  HostView1<std::int32_t> h_token_rows_, h_target_rows_;  // context parallelism
  HostView1<std::int32_t> h_unread_;  // the part of a sequence this stage does not read
  const BatchSource* source_ = nullptr;
  std::function<int(int)> first_;
  std::vector<int> token_micro_;  // per slot: the micro-batch uploaded there (-1: none)
  int target_micro_ = -1;
  int host_micro_ = -1;  // the micro-batch in the host buffers
  std::int64_t produced_ = 0, uploads_ = 0;
};

}  // namespace meshtrain::parallel
