#include "meshtrain/mesh/rank_math.hpp"

#include <algorithm>
#include <sstream>

#include "meshtrain/core/error.hpp"

namespace meshtrain::mesh {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::tp: return "tp";
    case Axis::dp: return "dp";
    case Axis::pp: return "pp";
  }
  return "?";
}

Order Order::parse(const std::string& text) {
  Order o;
  std::vector<std::string> parts;
  std::stringstream ss(text);
  for (std::string tok; std::getline(ss, tok, '-');) parts.push_back(tok);
  auto bad = [&] {
    return ConfigError(cat("mesh.order='", text,
                           "' is not an order of the axes tp, dp, pp separated by '-' "
                           "(fastest-varying first, e.g. tp-dp-pp)"));
  };
  if (parts.size() != 3) throw bad();
  bool seen[3] = {false, false, false};
  for (int i = 0; i < 3; ++i) {
    Axis a;
    if (parts[i] == "tp") a = Axis::tp;
    else if (parts[i] == "dp") a = Axis::dp;
    else if (parts[i] == "pp") a = Axis::pp;
    else throw bad();
    if (seen[static_cast<int>(a)]) throw bad();
    seen[static_cast<int>(a)] = true;
    o.axes[i] = a;
  }
  return o;
}

std::string Order::str() const {
  return cat(axis_name(axes[0]), "-", axis_name(axes[1]), "-", axis_name(axes[2]));
}

void validate(const Shape& s, int world_size) {
  for (Axis a : {Axis::dp, Axis::pp, Axis::tp}) {
    if (s.size(a) <= 0)
      throw ConfigError(cat("mesh.", axis_name(a), "=", s.size(a), " must be a positive integer"));
  }
  if (s.world() != world_size) {
    throw ConfigError(cat("mesh.dp x mesh.pp x mesh.tp = ", s.dp, " x ", s.pp, " x ", s.tp, " = ",
                          s.world(), " but the job has ", world_size,
                          " ranks; change the sizes or the rank count (mesh.dp = 0 derives dp)"));
  }
  if (s.ep <= 0 || s.dp % s.ep != 0)
    throw ConfigError(cat("mesh.ep=", s.ep, " must be a positive divisor of mesh.dp=", s.dp,
                          " (expert parallelism is carved out of data parallelism: mesh.ep x "
                          "mesh.tp x mesh.pp = ", static_cast<long>(s.ep) * s.tp * s.pp,
                          " must divide the ", world_size, " ranks)"));
}

namespace {
// Stride of each axis given the order (fastest first).
int stride(Axis a, const Shape& s, const Order& o) {
  int st = 1;
  for (Axis b : o.axes) {
    if (b == a) return st;
    st *= s.size(b);
  }
  return st;
}
}  // namespace

Coord coord_of(int rank, const Shape& s, const Order& o) {
  Coord c;
  int r = rank;
  for (Axis a : o.axes) {
    c.at(a) = r % s.size(a);
    r /= s.size(a);
  }
  return c;
}

int rank_of(const Coord& c, const Shape& s, const Order& o) {
  int r = 0;
  for (Axis a : {Axis::tp, Axis::dp, Axis::pp}) r += c.at(a) * stride(a, s, o);
  return r;
}

std::vector<int> group_along(int rank, Axis axis, const Shape& s, const Order& o) {
  Coord c = coord_of(rank, s, o);
  std::vector<int> g;
  for (int i = 0; i < s.size(axis); ++i) {
    c.at(axis) = i;
    g.push_back(rank_of(c, s, o));
  }
  return g;
}

int group_index(int rank, Axis axis, const Shape& s, const Order& o) {
  Coord c = coord_of(rank, s, o);
  c.at(axis) = 0;
  return rank_of(c, s, o);  // the group's lowest-coordinate member identifies it uniquely
}

std::vector<int> model_parallel_group(int rank, const Shape& s, const Order& o) {
  Coord c = coord_of(rank, s, o);
  std::vector<int> g;
  for (int p = 0; p < s.pp; ++p)
    for (int t = 0; t < s.tp; ++t) g.push_back(rank_of(Coord{c.dp, p, t}, s, o));
  std::sort(g.begin(), g.end());
  return g;
}

std::vector<int> embedding_group(int rank, const Shape& s, const Order& o) {
  Coord c = coord_of(rank, s, o);
  if (c.pp != 0 && c.pp != s.pp - 1) return {};
  std::vector<int> g{rank_of(Coord{c.dp, 0, c.tp}, s, o)};
  if (s.pp > 1) g.push_back(rank_of(Coord{c.dp, s.pp - 1, c.tp}, s, o));
  return g;
}

}  // namespace meshtrain::mesh
