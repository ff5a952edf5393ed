#pragma once
// Rank <-> coordinate math of the process mesh, as pure functions (unit-tested without MPI).
// world = dp x pp x tp. The order string lists the axes fastest-varying first: with the default
// "tp-dp-pp", ranks 0..tp-1 form one tensor-parallel group, so TP peers are neighbours on a node.
#include <array>
#include <string>
#include <vector>

namespace meshtrain::mesh {

enum class Axis { tp = 0, dp = 1, pp = 2 };

const char* axis_name(Axis a);

// ep (expert parallelism, issue 20) is carved out of dp, as in Megatron-Core: the dp ranks
// d with the same d / ep form one expert-parallel group (ep rank d % ep) and hold together all
// experts; the expert-data-parallel group (the dp ranks with the same d % ep, world / (ep tp pp)
// of them) holds the same experts and reduces their gradients. ep does not enter world().
struct Shape {
  int dp = 1, pp = 1, tp = 1;
  int ep = 1;
  int size(Axis a) const { return a == Axis::tp ? tp : a == Axis::dp ? dp : pp; }
  long world() const { return static_cast<long>(dp) * pp * tp; }
};

struct Coord {
  int dp = 0, pp = 0, tp = 0;
  int& at(Axis a) { return a == Axis::tp ? tp : a == Axis::dp ? dp : pp; }
  int at(Axis a) const { return a == Axis::tp ? tp : a == Axis::dp ? dp : pp; }
  bool operator==(const Coord&) const = default;
};

// Axes fastest-varying first.
struct Order {
  std::array<Axis, 3> axes{Axis::tp, Axis::dp, Axis::pp};
  static Order parse(const std::string& text);  // throws ConfigError naming mesh.order
  std::string str() const;
};

// Checks sizes against the world size; throws ConfigError with the option names.
void validate(const Shape& shape, int world_size);

Coord coord_of(int rank, const Shape& shape, const Order& order);
int rank_of(const Coord& c, const Shape& shape, const Order& order);

// The ranks of the group along `axis` that contains `rank`, in axis-coordinate order.
std::vector<int> group_along(int rank, Axis axis, const Shape& shape, const Order& order);

// Index of the group along `axis` that holds `rank` (the other two coordinates, linearised):
// the colour for MPI_Comm_split.
int group_index(int rank, Axis axis, const Shape& shape, const Order& order);

// Ranks of the model-parallel group (same dp coordinate: all tp x pp peers), sorted.
std::vector<int> model_parallel_group(int rank, const Shape& shape, const Order& order);

// Ranks of the embedding group (first and last pipeline stage with the same dp, tp), or just the
// rank itself when pp == 1. Empty for middle stages.
std::vector<int> embedding_group(int rank, const Shape& shape, const Order& order);

}  // namespace meshtrain::mesh
