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

  // The groups, one split each: colour = the group's identity, key = the linear index of the
  // named coordinates, so a sub-communicator's rank is, for one axis, the axis coordinate. The
  // first name of each list names the communicator (the flight recorder and the watchdog's
  // messages, comm/flight_recorder.hpp); lists spanning the same ranks share it.
  const std::pair<std::vector<std::string>, const char*> groups[] = {
      {{"tp"}, "tp"},          {{"cp"}, "cp"},
      {{"dp"}, "dp"},          {{"pp"}, "pp"},
      {{"tp", "pp"}, "model_parallel"},
      {{"ep"}, "ep"},          {{"edp"}, "expert_dp"},
      {{"dp", "cp"}, "dp+cp"}, {{"edp", "cp"}, "expert_dp+cp"}};
  for (const auto& [names, name] : groups) {
    const std::string key = canonical_group(names, shape_);
    if (groups_.count(key)) continue;
    const Group g = group_of(rank_, names, shape_, order_);
    MpiComm c = MpiComm::split(world_.get(), g.color, g.key);
    MESHTRAIN_MPI_CHECK(MPI_Comm_set_name(c.get(), name));
    groups_.emplace(key, std::move(c));
  }
  // Embedding group: first and last stage; middle stages get MPI_COMM_NULL.
  const bool in_embedding = coord_.pp == 0 || coord_.pp == shape_.pp - 1;
  int emb_color = MPI_UNDEFINED;
  if (in_embedding) {
    Coord first = coord_;
    first.pp = 0;
    emb_color = rank_of(first, shape_, order_);
  }
  embedding_ = MpiComm::split(world_.get(), emb_color, coord_.pp);
  MESHTRAIN_MPI_CHECK(MPI_Comm_set_name(world_.get(), "world"));
  if (!embedding_.is_null()) MESHTRAIN_MPI_CHECK(MPI_Comm_set_name(embedding_.get(), "embedding"));

  MPI_Comm node;
  MESHTRAIN_MPI_CHECK(
      MPI_Comm_split_type(world_.get(), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  node_ = MpiComm(node);
  local_rank_ = node_.rank();
  local_size_ = node_.size();
}

const MpiComm& ProcessMesh::group(const std::vector<std::string>& names) const {
  const auto it = groups_.find(canonical_group(names, shape_));
  if (it == groups_.end()) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    throw Error(cat("ProcessMesh: no group of the axes {", list, "} was built"));
  }
  return it->second;
}

std::string ProcessMesh::coord_string() const {
  return cat(coord_.dp, "/", coord_.pp, "/", coord_.tp);
}

std::string ProcessMesh::describe() const {
  return cat("mesh: world ", size(), " = dp ", shape_.dp,
             shape_.ep > 1 ? cat(" (ep ", shape_.ep, " x expert-dp ", shape_.dp / shape_.ep, ")")
                           : std::string(),
             shape_.cp > 1 ? cat(" x cp ", shape_.cp) : std::string(), " x pp ", shape_.pp,
             " x tp ", shape_.tp, ", order ", order_.str(), ", ", local_size_,
             " rank(s) on this node");
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
