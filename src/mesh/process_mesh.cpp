#include "meshtrain/mesh/process_mesh.hpp"

#include <utility>

#include "meshtrain/core/error.hpp"

namespace meshtrain::mesh {

ProcessMesh::ProcessMesh(MPI_Comm parent, const Shape& shape, const Order& order)
    : shape_(shape), order_(order) {
  int world_size = 0;
  MESHTRAIN_MPI_CHECK(MPI_Comm_size(parent, &world_size));
  validate(shape_, world_size);  // same inputs on every rank: every rank throws, none hangs

  world_ = MpiComm::duplicate(parent);
  MESHTRAIN_MPI_CHECK(MPI_Comm_set_errhandler(world_.get(), MPI_ERRORS_RETURN));
  rank_ = world_.rank();
  coord_ = coord_of(rank_, shape_, order_);

  // One split per axis: colour = the group's identity, key = the coordinate along the axis, so
  // the sub-communicator rank equals the axis coordinate.
  for (Axis a : {Axis::tp, Axis::dp, Axis::pp}) {
    MpiComm c = MpiComm::split(world_.get(), group_index(rank_, a, shape_, order_), coord_.at(a));
    (a == Axis::tp ? tp_ : a == Axis::dp ? dp_ : pp_) = std::move(c);
  }
  // Model-parallel group: everyone with my dp coordinate; key orders by (pp, tp).
  mp_ = MpiComm::split(world_.get(), coord_.dp, coord_.pp * shape_.tp + coord_.tp);
  // Embedding group: first and last stage; middle stages get MPI_COMM_NULL.
  const bool in_embedding = coord_.pp == 0 || coord_.pp == shape_.pp - 1;
  const int emb_color = in_embedding ? coord_.dp * shape_.tp + coord_.tp : MPI_UNDEFINED;
  embedding_ = MpiComm::split(world_.get(), emb_color, coord_.pp);
  // Expert parallelism inside dp: ep groups of consecutive dp ranks, expert-dp across them.
  ep_ = MpiComm::split(dp_.get(), coord_.dp / shape_.ep, coord_.dp % shape_.ep);
  edp_ = MpiComm::split(dp_.get(), coord_.dp % shape_.ep, coord_.dp / shape_.ep);

  // Names for the flight recorder and the watchdog's messages (comm/flight_recorder.hpp).
  const std::pair<const MpiComm*, const char*> names[] = {
      {&world_, "world"}, {&tp_, "tp"}, {&dp_, "dp"}, {&pp_, "pp"}, {&mp_, "model_parallel"},
      {&embedding_, "embedding"}, {&ep_, "ep"}, {&edp_, "expert_dp"}};
  for (const auto& [c, name] : names)
    if (c->get() != MPI_COMM_NULL) MESHTRAIN_MPI_CHECK(MPI_Comm_set_name(c->get(), name));

  MPI_Comm node;
  MESHTRAIN_MPI_CHECK(
      MPI_Comm_split_type(world_.get(), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  node_ = MpiComm(node);
  local_rank_ = node_.rank();
  local_size_ = node_.size();
}

std::string ProcessMesh::coord_string() const {
  return cat(coord_.dp, "/", coord_.pp, "/", coord_.tp);
}

std::string ProcessMesh::describe() const {
  return cat("mesh: world ", size(), " = dp ", shape_.dp,
             shape_.ep > 1 ? cat(" (ep ", shape_.ep, " x expert-dp ", shape_.dp / shape_.ep, ")")
                           : std::string(),
             " x pp ", shape_.pp, " x tp ", shape_.tp, ", order ", order_.str(), ", ", local_size_, " rank(s) on this node");
}

NodeRank node_local_rank(MPI_Comm comm) {
  int rank = 0;
  MESHTRAIN_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm node;
  MESHTRAIN_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  MpiComm owned(node);
  return NodeRank{owned.rank(), owned.size()};
}

int select_device(int local_rank, int device_count) {
  if (device_count <= 0) return -1;
  return local_rank % device_count;
}

}  // namespace meshtrain::mesh
