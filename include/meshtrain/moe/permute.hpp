#pragma once
// Token permutation for MoE (issue 20): dispatch gathers each token's row once per choice so
// that every expert's rows are contiguous (expert 0's first, then expert 1's, ...; within an
// expert in (token, choice) order, so the order is a function of the choices alone), and
// combine brings the expert outputs back, each token's row the router-weighted sum of its
// choices' rows. Both are gathers: every output element is written by one thread, in a fixed
// order, so the results are deterministic and need no atomics (a scatter-add in combine's
// backward direction would). A dropped choice (expert -1) has no row and adds nothing.
//
// Shapes: N tokens, k choices each, H features, E experts, M = kept choices (rows).
//
// Rows are of T (float, double, or a 16-bit type in mixed precision); the router's combine
// weights and their gradients are of weight_t<T>: fp32 for 16-bit rows (the router runs in
// fp32, and its weights are not rounded to 16 bits), T itself otherwise. The sums over a
// token's choices and the weight products are in weight_t<T>, rounded to T once when stored.
#include <cstdint>
#include <type_traits>
#include <vector>

#include "meshtrain/core/view.hpp"

namespace meshtrain::moe {

template <class T>
struct WeightType {
  using type = float;
};
template <>
struct WeightType<double> {
  using type = double;
};
template <class T>
using weight_t = typename WeightType<std::remove_cv_t<T>>::type;

struct DispatchPlan {
  int tokens = 0, top_k = 0, experts = 0;
  std::int64_t rows = 0;                 // M
  View1<int> position;                   // [N k] row of each choice, -1 where dropped
  View1<int> choice_of_row;              // [M] the choice t k + j a row holds
  std::vector<std::int64_t> counts;      // [E] rows per expert (host: GEMM and message sizes)
  std::vector<std::int64_t> offsets;     // [E + 1] first row of each expert, then M
};

// From RouterState::expert [N k]. One team per expert (cost O(E N k); a histogram sort is the
// large-E form, docs/moe.md). Copies the counts to the host (the caller needs them there).
void plan_dispatch(const ExecSpace& exec, View1<const int> expert, int N, int k, int E,
                   DispatchPlan& plan);

// xp [M, H]: row p = x [token of p].
template <class T>
void dispatch_forward(const ExecSpace& exec, const DispatchPlan& plan, View1<const T> x,
                      View1<T> xp, int H);

// dx [N, H] (overwritten) = sum over the token's kept choices of dxp [row].
template <class T>
void dispatch_backward(const ExecSpace& exec, const DispatchPlan& plan, View1<const T> dxp,
                       View1<T> dx, int H);

// y [N, H] (overwritten) = sum over the token's kept choices j of weight [t k + j] ye [row].
template <class T>
void combine_forward(const ExecSpace& exec, const DispatchPlan& plan, View1<const T> ye,
                     View1<const weight_t<T>> weight, View1<T> y, int H);

// dye [M, H] (overwritten) = weight [choice] dy [token];
// dweight [N k] (overwritten) = <dy [token], ye [row]>, 0 for dropped choices.
template <class T>
void combine_backward(const ExecSpace& exec, const DispatchPlan& plan, View1<const T> dy,
                      View1<const T> ye, View1<const weight_t<T>> weight, View1<T> dye,
                      View1<weight_t<T>> dweight, int H);

}  // namespace meshtrain::moe
