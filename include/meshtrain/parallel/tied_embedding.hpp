#pragma once
// The tied embedding of a pipeline: the first stage's wte and the last stage's copy (read by the
// LM head) are one parameter, whose gradient is the sum over the embedding group (first and last
// stage). It is summed after the pipeline has flushed: summing per micro-batch would deadlock
// 1F1B (the last stage would wait for a first stage that waits for it).
//   ZeRO 0/1: after the DP all-reduce (sums commute), in the full gradient buffer.
//   ZeRO 2/3: the two stages partition wte differently (the first stage's embedding unit also
//   holds wpe), so the sum precedes the reduce-scatter: the bucket holding wte accumulates over
//   the micro-batches, is summed over the embedding group and then reduce-scattered once. Both
//   copies take the same update from the same summed gradient, each in its own stage's shards.
// Which of the two happens, and when, is DpPolicy's; this carries it out.
#include <cstddef>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/view.hpp"
#include "meshtrain/model/registry.hpp"
#include "meshtrain/parallel/comm_stats.hpp"

namespace meshtrain::parallel {

template <class T>
class TiedEmbeddingSum {
 public:
  // `embedding`: the group (null or of size 1: nothing to sum).
  TiedEmbeddingSum(const model::ParameterRegistry& reg, comm::Communicator* embedding);
  bool active() const { return embedding_ && embedding_->size() > 1; }
  // wte's gradient inside `buffer`, which holds the flat range starting at `range_begin`.
  void sum_in(View1<T> buffer, std::size_t range_begin, CommStats& stats);

 private:
  comm::Communicator* embedding_;
  std::size_t wte_offset_ = 0, wte_numel_ = 0;
};

}  // namespace meshtrain::parallel
