#pragma once
#include <vector>

#include "meshtrain/mesh/rank_math.hpp"

namespace mt_test {
// Every (dp, pp, tp) with dp * pp * tp == world.
inline std::vector<meshtrain::mesh::Shape> factorisations(int world) {
  std::vector<meshtrain::mesh::Shape> out;
  for (int dp = 1; dp <= world; ++dp)
    for (int pp = 1; pp <= world; ++pp)
      if (world % (dp * pp) == 0) out.push_back({dp, pp, world / (dp * pp)});
  return out;
}
}  // namespace mt_test
