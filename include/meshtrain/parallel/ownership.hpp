#pragma once
// Who writes what: the one rule for which rank holds and writes which range of its (tp, pp)
// slice's flat buffer. Checkpoints (engine_checkpoint.cpp, and the planner's count of their
// staging), the HuggingFace export (engine_export.cpp) and the whole-model gather
// (model_transfer.cpp) all ask it; a pure function of the layout (no MPI), tested by
// enumerating layouts (tests/parallel/test_ownership.cpp).
//
// A parameter element has copies of three kinds: the replicas of a slice (every rank of
// {"dp", "cp"} holds the same dense parameters; under mesh.ep every rank of {"edp", "cp"} the
// same experts), the tensor-parallel copies of replicated tensors, and the tied embedding on the
// last stage. The rule splits the first kind among the replicas:
//  - ZeRO >= 1: a rank owns exactly its optimizer shard's pieces (ZeroPartition, which already
//    splits dense units over the replicas and expert units over the expert replicas);
//  - ZeRO 0: the even split [n d / D, n (d + 1) / D) of the flat buffer over the D replicas; under
//    mesh.ep the dense parameters so, and the experts by the same split over the expert replicas
//    (the ep ranks in between hold other experts at the same flat offsets).
// io::pieces_for_range with dedup drops the other two kinds (tp rank != 0, the last stage's
// wte). Over the ranks of a layout every element of every global tensor is then owned exactly
// once.
#include <cstddef>
#include <vector>

#include "meshtrain/io/checkpoint.hpp"
#include "meshtrain/model/registry.hpp"
#include "meshtrain/optim/sharded_adamw.hpp"

namespace meshtrain::parallel {

// A rank's place among the ranks that hold the same values (a communicator's rank and size).
struct Replicas {
  int rank = 0, size = 1;
};

// What the rule reads of a rank's layout.
struct OwnershipInputs {
  std::size_t n = 0;  // elements of the slice's flat buffer
  int zero_stage = 0;
  std::vector<optim::ShardPiece> shard_pieces;  // ZeRO >= 1: the optimizer shard's pieces
  std::size_t shard_size = 0;                   // ZeRO >= 1: its size, padding included
  Replicas replicas;                            // {"dp", "cp"}
  int ep = 1;                                   // mesh.ep
  Replicas expert_replicas;                     // {"edp", "cp"}: read when ep > 1
};

// The disjoint part of its slice a rank owns, as flat ranges; each range's `shard` is its offset
// in a buffer that holds the ranges one after the other (the checkpoint's staging).
struct Ownership {
  // With expert_split (ZeRO 0 under mesh.ep) dense parameters come from `dense` and MoE experts
  // from `expert`; otherwise every parameter in `dense` counts and `expert` is empty.
  std::vector<optim::ShardPiece> dense, expert;
  bool expert_split = false;
  bool whole_shard = false;  // ZeRO >= 1: the ranges are the optimizer shard, in shard order
  std::size_t staged = 0;    // elements of the buffer that holds the ranges
};

Ownership ownership(const OwnershipInputs& in);

// The ranges a rank gives to one whole copy of the model (the gather to rank 0): its whole slice
// where it is the first of its replicas (dense) or of its expert replicas (experts), nothing
// elsewhere. Without dedup of the pieces, tensor-parallel and tied copies are all kept.
Ownership first_copy(std::size_t n, Replicas replicas, int ep, Replicas expert_replicas);

// A piece of a parameter in one of the owned ranges, and that range.
struct OwnedPiece {
  io::TensorPiece piece;
  optim::ShardPiece range;
};
// The registry's pieces in the owned ranges (dense ranges first, then expert ranges; each range
// in flat order). dedup: as io::pieces_for_range (drop the copies another rank writes).
std::vector<OwnedPiece> owned_pieces(const model::ParameterRegistry& reg, const Ownership& own,
                                     bool dedup);

}  // namespace meshtrain::parallel
