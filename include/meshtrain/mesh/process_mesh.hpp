#pragma once
// ProcessMesh: the world communicator split into the groups of named axes (rank_math.hpp) that
// the engine uses — tp, cp, dp, pp, ep, edp, the model-parallel group (tp x pp, for gradient
// norms), the replicas of the dense parameters (dp x cp) and of the experts (edp x cp) — and the
// embedding group (first and last pipeline stage, for the tied embedding). Groups are asked for
// by axis names; two names spanning the same ranks share one communicator. Built from a
// communicator it duplicates; it never touches MPI_COMM_WORLD itself.
#include <map>
#include <string>
#include <vector>

#include "meshtrain/mesh/mpi_comm.hpp"
#include "meshtrain/mesh/rank_math.hpp"

namespace meshtrain::mesh {

class ProcessMesh {
 public:
  // Collective over `parent`. Throws ConfigError (identically on every rank) when the sizes do
  // not multiply to the communicator's size.
  ProcessMesh(MPI_Comm parent, const Shape& shape, const Order& order = Order{});

  const Shape& shape() const { return shape_; }
  const Order& order() const { return order_; }
  const Coord& coord() const { return coord_; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(shape_.world()); }

  const MpiComm& world() const { return world_; }
  // The group of this rank spanned by the named axes ("tp", "cp", "pp", "dp", "ep", "edp"; the
  // sub-communicator rank is rank_math's key: the first name varies fastest). The mesh builds
  // the groups listed in process_mesh.cpp; asking for another is an error.
  const MpiComm& group(const std::vector<std::string>& names) const;
  const MpiComm& tp() const { return group({"tp"}); }
  const MpiComm& cp() const { return group({"cp"}); }
  const MpiComm& dp() const { return group({"dp"}); }
  const MpiComm& pp() const { return group({"pp"}); }
  const MpiComm& along(Axis a) const { return group({axis_name(a)}); }
  const MpiComm& model_parallel() const { return group({"tp", "pp"}); }
  // The ranks holding the same dense parameters (dp x cp: they reduce their gradients and
  // share ZeRO's shards), and the same experts (edp x cp).
  const MpiComm& replicas() const { return group({"dp", "cp"}); }
  const MpiComm& expert_replicas() const { return group({"edp", "cp"}); }
  // Expert parallelism (Shape::ep): the dp ranks holding all experts between them, and those
  // holding the same experts (split from dp; both equal dp's ranks when ep = 1 / ep = dp).
  const MpiComm& ep() const { return group({"ep"}); }
  const MpiComm& expert_dp() const { return group({"edp"}); }
  int ep_rank() const { return coord_.dp % shape_.ep; }
  int expert_dp_rank() const { return coord_.dp / shape_.ep; }
  // Null on middle pipeline stages.
  const MpiComm& embedding() const { return embedding_; }
  const MpiComm& node() const { return node_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == shape_.pp - 1; }

  // "dp/pp/tp" coordinates for log prefixes, e.g. "1/0/3".
  std::string coord_string() const;
  // One line describing the layout, for rank 0's banner.
  std::string describe() const;

 private:
  Shape shape_;
  Order order_;
  Coord coord_;
  int rank_ = 0;
  int local_rank_ = 0, local_size_ = 1;
  MpiComm world_, embedding_, node_;
  std::map<std::string, MpiComm> groups_;  // by canonical_group()
};

// Node-local rank and size of `comm` (MPI_Comm_split_type SHARED): usable before Kokkos starts,
// so the GPU can be chosen from it.
struct NodeRank {
  int rank = 0, size = 1;
};
NodeRank node_local_rank(MPI_Comm comm);

// The GPU a rank uses: its node-local rank modulo the visible GPUs (-1 when there are none).
int select_device(int local_rank, int device_count);

}  // namespace meshtrain::mesh
