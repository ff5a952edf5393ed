#pragma once
// Saved activations of one transformer block for one micro-batch (N = B*T rows).
#include "meshtrain/core/view.hpp"

namespace meshtrain::model {

// Views of one transformer block's parameters (or gradients) in the flat buffer, looked up in
// the registry once when the model is built, not by name on every forward and backward.
template <class T>
struct BlockTensors {
  View1<T> ln_1_w, ln_1_b, c_attn_w, c_attn_b, attn_proj_w, attn_proj_b;
  View1<T> ln_2_w, ln_2_b, c_fc_w, c_fc_b, mlp_proj_w, mlp_proj_b;
};

template <class T>
struct BlockActivations {
  View1<T> ln1;                         // [N,C]
  View1<float> ln1_mean, ln1_rstd;      // [N], [N]
  View1<T> qkv;                         // [N,3C]
  View1<T> atty;                        // [N,C]
  View1<float> lse;                     // [B,NH,T]
  View1<T> attproj, res2;               // [N,C]
  View1<T> ln2;                         // [N,C]
  View1<float> ln2_mean, ln2_rstd;      // [N], [N]
  View1<T> fch, fch_gelu;               // [N,4C]
  View1<T> fcproj;                      // [N,C]

  BlockActivations(int B, int Tlen, int C, int NH);
  std::size_t bytes() const;
};

}  // namespace meshtrain::model
