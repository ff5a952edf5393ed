#pragma once
// Grouped-query attention (Ainslie et al. 2023) on attention kernels that take one key-value
// head per query head: the NKV key-value heads of a packed projection are repeated for the
// G = NH / NKV query heads of each group (HF's repeat_kv: query head j reads kv head j / G), and
// backward sums the repeated heads' gradients back onto their kv head.
//
// compact: [N, (NH + 2 NKV) HS] rows [q (NH heads) | k (NKV) | v (NKV)], as the q/k/v
//          projections and the rotary kernel write it.
// full:    [N, 3 NH HS] rows [q | k | v] of NH heads each, the attention kernels' layout.
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

// full = compact with k and v heads repeated (overwrites).
template <class T>
void expand_kv_heads(const ExecSpace& exec, View1<T> full, View1<const T> compact, int N, int NH,
                     int NKV, int HS);

// dcompact = the gradient of compact from dfull (overwrites): q copied, each kv head the sum of
// its G repeats, added in query-head order (deterministic), in the accumulation type.
template <class T>
void reduce_kv_heads(const ExecSpace& exec, View1<T> dcompact, View1<const T> dfull, int N,
                     int NH, int NKV, int HS);

}  // namespace meshtrain::kernels
