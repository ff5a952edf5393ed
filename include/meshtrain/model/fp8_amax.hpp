#pragma once
// Layout invariance for FP8 current scaling (DESIGN invariant 1): where tensor or sequence
// parallelism splits a tensor, each rank's amax covers only its piece, and casting with it would
// make tp 2 compute something else than tp 1. agree_amax replaces each amax by its maximum over
// the group that splits the tensor, so every rank casts with the scale of the whole tensor.
//
// Which group: tensorwise, every group that splits the tensor (tp for a column- or row-split
// operand, tp under sp for the sequence-split activations). Rowwise, only a group that splits
// the rows' length (the K columns, e.g. the input of a row-parallel linear); a split of the rows
// themselves (sp's tokens) needs no agreement.
//
// The amaxes are reduced as the int32 bits of non-negative floats (as fp8_amax writes them, the
// sign cleared) with a max: exact, order-free, and NaN-propagating — a NaN on one rank reaches
// every rank, where a floating-point max might drop it. One small all-reduce; a GPU build's
// device amax takes a host round trip only when the group's backend needs host memory (MPI).
#include <cstddef>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::model {

// amax[0, count) = max over the group's ranks (collective over `group`; a group of one returns).
void agree_amax(comm::Communicator& group, const ExecSpace& exec, View1<float> amax,
                std::size_t count);

}  // namespace meshtrain::model
