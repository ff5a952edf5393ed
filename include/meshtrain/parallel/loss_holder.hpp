#pragma once
// Who holds the loss: the one rule for which ranks' loss sums make up a loss over the job. The
// step's global loss (Engine::global_loss_sum) and evaluation (Engine::evaluate) both ask it; a
// pure function of a rank's coordinates (no MPI), tested by enumerating meshes
// (tests/parallel/test_loss_holder.cpp).
//
// Only the last pipeline stage computes a loss. Its tp ranks all hold the same sum (the
// vocabulary-parallel cross-entropy reduces over tp), so tp rank 0's counts; its cp ranks each
// hold the loss of their rows of every sequence, and its dp ranks that of their sequences, so
// all of them count, unless every dp rank read the same batches (evaluation): then dp rank 0's.
#include "meshtrain/mesh/rank_math.hpp"

namespace meshtrain::parallel {

enum class LossBatches {
  per_dp_rank,  // each dp rank read its own sequences (a training step)
  same_on_dp,   // every dp rank read the same sequences (evaluation)
};

// Whether the loss sum of the rank at `c` in a pipeline of `pp` stages is part of the total.
bool holds_loss(const mesh::Coord& c, int pp, LossBatches batches);

}  // namespace meshtrain::parallel
