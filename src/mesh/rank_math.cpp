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
    case Axis::cp: return "cp";
  }
  return "?";
}

Order Order::parse(const std::string& text) {
  Order o;
  o.axes.clear();
  std::vector<std::string> parts;
  std::stringstream ss(text);
  for (std::string tok; std::getline(ss, tok, '-');) parts.push_back(tok);
  auto bad = [&] {
    return ConfigError(cat("mesh.order='", text,
                           "' is not an order of the axes tp, dp, pp (and cp, optionally) "
                           "separated by '-' (fastest-varying first, e.g. tp-dp-pp or "
                           "tp-cp-dp-pp)"));
  };
  if (parts.size() != 3 && parts.size() != 4) throw bad();
  bool seen[4] = {false, false, false, false};
  for (const std::string& p : parts) {
    Axis a;
    if (p == "tp") a = Axis::tp;
    else if (p == "dp") a = Axis::dp;
    else if (p == "pp") a = Axis::pp;
    else if (p == "cp") a = Axis::cp;
    else throw bad();
    if (seen[static_cast<int>(a)]) throw bad();
    seen[static_cast<int>(a)] = true;
    o.axes.push_back(a);
  }
  if (!seen[static_cast<int>(Axis::tp)] || !seen[static_cast<int>(Axis::dp)] ||
      !seen[static_cast<int>(Axis::pp)])
    throw bad();
  return o;
}

std::string Order::str() const {
  std::string s;
  for (Axis a : axes) s += (s.empty() ? "" : "-") + std::string(axis_name(a));
  return s;
}

std::array<Axis, 4> Order::full() const {
  std::array<Axis, 4> f{};
  std::size_t n = 0;
  const bool has_cp = std::find(axes.begin(), axes.end(), Axis::cp) != axes.end();
  for (Axis a : axes) {
    f[n++] = a;
    if (a == Axis::tp && !has_cp) f[n++] = Axis::cp;
  }
  return f;
}

void validate(const Shape& s, int world_size) {
  for (Axis a : {Axis::dp, Axis::pp, Axis::tp, Axis::cp}) {
    if (s.size(a) <= 0)
      throw ConfigError(cat("mesh.", axis_name(a), "=", s.size(a), " must be a positive integer"));
  }
  if (s.world() != world_size) {
    if (s.cp == 1)
      throw ConfigError(cat("mesh.dp x mesh.pp x mesh.tp = ", s.dp, " x ", s.pp, " x ", s.tp,
                            " = ", s.world(), " but the job has ", world_size,
                            " ranks; change the sizes or the rank count (mesh.dp = 0 derives dp)"));
    throw ConfigError(cat("mesh.dp x mesh.cp x mesh.pp x mesh.tp = ", s.dp, " x ", s.cp, " x ",
                          s.pp, " x ", s.tp, " = ", s.world(), " but the job has ", world_size,
                          " ranks; change the sizes or the rank count (mesh.dp = 0 derives dp)"));
  }
  if (s.ep <= 0 || s.dp % s.ep != 0)
    throw ConfigError(cat("mesh.ep=", s.ep, " must be a positive divisor of mesh.dp=", s.dp,
                          " (expert parallelism is carved out of data parallelism: mesh.ep x "
                          "mesh.tp x mesh.pp = ", static_cast<long>(s.ep) * s.tp * s.pp,
                          " must divide the ", world_size, " ranks)"));
}

std::vector<MeshAxis> mesh_axes(const Shape& s, const Order& o) {
  std::vector<MeshAxis> out;
  for (Axis a : o.full()) {
    if (a == Axis::dp) {
      out.push_back({"ep", s.ep});
      out.push_back({"edp", s.dp / s.ep});
    } else {
      out.push_back({axis_name(a), s.size(a)});
    }
  }
  return out;
}

namespace {

// Per atomic axis (mesh_axes order): its coordinate in `rank`.
std::vector<int> atomic_coords(int rank, const std::vector<MeshAxis>& axes) {
  std::vector<int> c(axes.size());
  for (std::size_t i = 0; i < axes.size(); ++i) {
    c[i] = rank % axes[i].size;
    rank /= axes[i].size;
  }
  return c;
}

int atomic_rank(const std::vector<int>& c, const std::vector<MeshAxis>& axes) {
  int r = 0, stride = 1;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    r += c[i] * stride;
    stride *= axes[i].size;
  }
  return r;
}

std::size_t index_of(const std::vector<MeshAxis>& axes, const std::string& name) {
  for (std::size_t i = 0; i < axes.size(); ++i)
    if (axes[i].name == name) return i;
  throw Error(cat("mesh: no axis '", name, "' (axes: tp, cp, pp, dp = ep x edp)"));
}

// The named axes as atomic axis indices, first name fastest ("dp" = ep then edp).
std::vector<std::size_t> atomic_names(const std::vector<std::string>& names,
                                      const std::vector<MeshAxis>& axes) {
  std::vector<std::size_t> out;
  for (const std::string& n : names) {
    if (n == "dp") {
      out.push_back(index_of(axes, "ep"));
      out.push_back(index_of(axes, "edp"));
    } else {
      out.push_back(index_of(axes, n));
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i)
    for (std::size_t j = i + 1; j < out.size(); ++j)
      if (out[i] == out[j]) throw Error(cat("mesh: axis '", axes[out[i]].name, "' named twice"));
  return out;
}

}  // namespace

Group group_of(int rank, const std::vector<std::string>& names, const Shape& s, const Order& o) {
  const std::vector<MeshAxis> axes = mesh_axes(s, o);
  const std::vector<std::size_t> named = atomic_names(names, axes);
  std::vector<int> c = atomic_coords(rank, axes);
  Group g;
  int stride = 1;
  for (std::size_t k = 0; k < named.size(); ++k) {
    g.key += c[named[k]] * stride;
    stride *= axes[named[k]].size;
  }
  for (std::size_t n : named) c[n] = 0;
  g.color = atomic_rank(c, axes);
  // Members by key: key k's coordinates along the named axes, first name fastest.
  g.members.resize(static_cast<std::size_t>(stride));
  for (int k = 0; k < stride; ++k) {
    int rest = k;
    for (std::size_t n : named) {
      c[n] = rest % axes[n].size;
      rest /= axes[n].size;
    }
    g.members[static_cast<std::size_t>(k)] = atomic_rank(c, axes);
  }
  return g;
}

std::string canonical_group(const std::vector<std::string>& names, const Shape& s) {
  const std::vector<MeshAxis> axes = mesh_axes(s, Order{});
  std::vector<std::string> kept;
  for (std::size_t n : atomic_names(names, axes))
    if (axes[n].size > 1) kept.push_back(axes[n].name);
  std::sort(kept.begin(), kept.end());
  std::string out;
  for (const std::string& k : kept) out += (out.empty() ? "" : "+") + k;
  return out;
}

Coord coord_of(int rank, const Shape& s, const Order& o) {
  const std::vector<MeshAxis> axes = mesh_axes(s, o);
  const std::vector<int> c = atomic_coords(rank, axes);
  Coord out;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const std::string& n = axes[i].name;
    if (n == "tp") out.tp = c[i];
    else if (n == "pp") out.pp = c[i];
    else if (n == "cp") out.cp = c[i];
    else if (n == "ep") out.dp += c[i];
    else out.dp += c[i] * s.ep;  // edp
  }
  return out;
}

int rank_of(const Coord& co, const Shape& s, const Order& o) {
  const std::vector<MeshAxis> axes = mesh_axes(s, o);
  std::vector<int> c(axes.size());
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const std::string& n = axes[i].name;
    c[i] = n == "tp" ? co.tp : n == "pp" ? co.pp : n == "cp" ? co.cp
         : n == "ep" ? co.dp % s.ep : co.dp / s.ep;
  }
  return atomic_rank(c, axes);
}

std::vector<int> group_along(int rank, Axis axis, const Shape& s, const Order& o) {
  return group_of(rank, {axis_name(axis)}, s, o).members;
}

int group_index(int rank, Axis axis, const Shape& s, const Order& o) {
  return group_of(rank, {axis_name(axis)}, s, o).color;
}

std::vector<int> model_parallel_group(int rank, const Shape& s, const Order& o) {
  std::vector<int> g = group_of(rank, {"tp", "pp"}, s, o).members;
  std::sort(g.begin(), g.end());
  return g;
}

std::vector<int> embedding_group(int rank, const Shape& s, const Order& o) {
  Coord c = coord_of(rank, s, o);
  if (c.pp != 0 && c.pp != s.pp - 1) return {};
  c.pp = 0;
  std::vector<int> g{rank_of(c, s, o)};
  c.pp = s.pp - 1;
  if (s.pp > 1) g.push_back(rank_of(c, s, o));
  return g;
}

}  // namespace meshtrain::mesh
