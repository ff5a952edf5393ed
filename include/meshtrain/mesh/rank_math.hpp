#pragma once
// Rank <-> coordinate math of the process mesh, as pure functions (unit-tested without MPI).
// world = dp x cp x pp x tp. The order string lists the axes fastest-varying first: with the
// default "tp-dp-pp", ranks 0..tp-1 form one tensor-parallel group, so TP peers are neighbours
// on a node; cp (context parallelism), where the order does not name it, comes right after tp
// (Megatron-Core's RankGenerator order "tp-cp-ep-dp-pp").
//
// Groups are asked for by axis names (Megatron-Core's RankGenerator, TorchTitan's DeviceMesh):
// a group is every rank that differs from this one only along the named axes. The atomic axes
// are tp, cp, pp and the two halves of dp: ep (expert parallelism, carved out of dp as in
// Megatron-Core: the dp ranks d with the same d / ep form one expert-parallel group, ep rank
// d % ep, holding all experts between them) and edp (expert data parallel, d / ep: the dp ranks
// holding the same experts, which reduce their gradients). "dp" names both.
#include <array>
#include <string>
#include <vector>

namespace meshtrain::mesh {

enum class Axis { tp = 0, dp = 1, pp = 2, cp = 3 };

const char* axis_name(Axis a);

// The sizes. ep does not enter world(): it splits dp.
struct Shape {
  int dp = 1, pp = 1, tp = 1;
  int ep = 1;
  int cp = 1;
  int size(Axis a) const {
    return a == Axis::tp ? tp : a == Axis::dp ? dp : a == Axis::pp ? pp : cp;
  }
  long world() const { return static_cast<long>(dp) * pp * tp * cp; }
};

struct Coord {
  int dp = 0, pp = 0, tp = 0;
  int cp = 0;
  int& at(Axis a) { return a == Axis::tp ? tp : a == Axis::dp ? dp : a == Axis::pp ? pp : cp; }
  int at(Axis a) const { return a == Axis::tp ? tp : a == Axis::dp ? dp : a == Axis::pp ? pp : cp; }
  bool operator==(const Coord&) const = default;
};

// Axes fastest-varying first: tp, dp and pp once each, cp at most once.
struct Order {
  std::vector<Axis> axes{Axis::tp, Axis::dp, Axis::pp};
  static Order parse(const std::string& text);  // throws ConfigError naming mesh.order
  std::string str() const;
  // All four axes in rank order: cp right after tp where the text leaves it out.
  std::array<Axis, 4> full() const;
};

// Checks sizes against the world size; throws ConfigError with the option names.
void validate(const Shape& shape, int world_size);

Coord coord_of(int rank, const Shape& shape, const Order& order);
int rank_of(const Coord& c, const Shape& shape, const Order& order);

// ---- groups by axis names ----

// An atomic axis of the mesh and its size.
struct MeshAxis {
  std::string name;  // "ep", "edp", "tp", "cp" or "pp"
  int size;
};
// The atomic axes in rank order, fastest first (ep right before edp, where dp stands).
std::vector<MeshAxis> mesh_axes(const Shape& shape, const Order& order);

// The group of `rank` spanned by `names` ("tp", "cp", "pp", "dp", "ep", "edp"): its members
// ordered by `key`, which linearises the named axes' coordinates with the first name fastest
// ("dp" = ep + ep_size * edp), so a sub-communicator's rank is the key; `color` identifies the
// group (the rank of its first member): the arguments of MPI_Comm_split.
struct Group {
  std::vector<int> members;
  int color = 0;
  int key = 0;
};
Group group_of(int rank, const std::vector<std::string>& names, const Shape& shape,
               const Order& order);
// The atomic axes of size > 1 among `names`, sorted and joined with '+' ("" for a group of one
// rank): two name lists with the same canonical form span the same ranks.
std::string canonical_group(const std::vector<std::string>& names, const Shape& shape);

// The ranks of the group along `axis` that contains `rank`, in axis-coordinate order.
std::vector<int> group_along(int rank, Axis axis, const Shape& shape, const Order& order);

// Index of the group along `axis` that holds `rank` (the other coordinates, linearised): the
// colour for MPI_Comm_split.
int group_index(int rank, Axis axis, const Shape& shape, const Order& order);

// Ranks of the model-parallel group (same dp and cp coordinates: all tp x pp peers), sorted.
std::vector<int> model_parallel_group(int rank, const Shape& shape, const Order& order);

// Ranks of the embedding group (first and last pipeline stage with the same dp, cp, tp), or
// just the rank itself when pp == 1. Empty for middle stages.
std::vector<int> embedding_group(int rank, const Shape& shape, const Order& order);

}  // namespace meshtrain::mesh
