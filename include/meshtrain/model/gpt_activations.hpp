#pragma once
// Saved activations of one transformer block for one micro-batch (N = B*T rows).
#include "meshtrain/core/view.hpp"

namespace meshtrain::model {

struct BlockActivations {
  View1<float> ln1, ln1_mean, ln1_rstd;  // [N,C], [N], [N]
  View1<float> qkv;                      // [N,3C]
  View1<float> atty, lse;                // [N,C], [B,NH,T]
  View1<float> attproj, res2;            // [N,C]
  View1<float> ln2, ln2_mean, ln2_rstd;  // [N,C], [N], [N]
  View1<float> fch, fch_gelu;            // [N,4C]
  View1<float> fcproj;                   // [N,C]

  BlockActivations(int B, int T, int C, int NH);
  std::size_t bytes() const;
};

}  // namespace meshtrain::model
