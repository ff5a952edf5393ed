#pragma once
// The expert-parallel MoE layer (issue 20), as one forward and one backward function over the
// building blocks: router -> dispatch (permute.hpp) -> counts all-to-all -> token all-to-all
// -> regroup by local expert -> expert MLP as grouped GEMMs (grouped_gemm.hpp; GELU or SwiGLU)
// -> the reverse path -> combine with the router weights. The E experts are split over the ep
// group in blocks: rank r holds experts [r E/ep, (r+1) E/ep). Every rank of the group takes
// part in every exchange, also one whose experts receive no token or that routes none.
//
// y is the MoE output only (no residual, no shared expert). The router weight is replicated
// over the ep group and each rank's gradient covers its own tokens (the dp reduction sums it);
// an expert's weight gradient covers every token routed to it from the whole ep group.
#include <cstdint>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/view.hpp"
#include "meshtrain/moe/grouped_gemm.hpp"
#include "meshtrain/moe/permute.hpp"
#include "meshtrain/moe/router.hpp"

namespace meshtrain::moe {

enum class ExpertActivation { gelu, swiglu };

struct MoeLayerConfig {
  RouterConfig router;
  int hidden = 0;                               // H (model.n_embd)
  int ffn = 0;                                  // I, each expert's intermediate size
  ExpertActivation activation = ExpertActivation::gelu;
  ExpertFp8 fp8;  // the experts' GEMMs in FP8 (grouped_gemm.hpp); off: the model's type
  // ConfigError naming the option (also: moe.experts not divisible by the ep size).
  void validate(int ep) const;
  int in_width() const { return activation == ExpertActivation::swiglu ? 2 * ffn : ffn; }
};

// One ep rank's parameters, in the project's linear layout (out = inp @ weight).
template <class T>
struct MoeParams {
  View1<const T> router;  // [H, E]
  View1<const T> bias;    // [E] expert bias of the sigmoid router (empty: none)
  View1<const T> w_in;    // [E_local, H, in_width]: GELU's up projection, or SwiGLU's
                          // [gate | up] packed per row (kernels/swiglu.hpp)
  View1<const T> w_out;   // [E_local, I, H]
  // Elements from one local expert's w_in (w_out) to the next's; 0: packed (H in_width, I H).
  std::size_t in_stride = 0, out_stride = 0;
};

// Gradients, accumulated into (+=) like every other weight gradient.
template <class T>
struct MoeGrads {
  View1<T> router;        // [H, E]
  View1<T> w_in;          // [E_local, H, in_width]
  View1<T> w_out;         // [E_local, I, H]
  // (strides: those of MoeParams)
};

// What the forward pass keeps for the backward pass.
template <class T>
struct MoeLayerState {
  RouterState<T> router;
  DispatchPlan plan;
  std::vector<std::size_t> send_rows, recv_rows;  // [ep] rows to / from each ep rank
  std::vector<std::int64_t> chunk_rows;           // [ep, E_local] rows from rank s for expert j
  std::vector<std::int64_t> expert_offsets;       // [E_local + 1] rows of each local expert
  View1<std::int64_t> source_major, expert_major; // [ep E_local] chunk starts in either order
  View1<std::int64_t> chunk_count;                // [ep E_local]
  View1<T> xp, xr, xe;    // dispatched rows: local order [M, H], received [R, H], by expert
  View1<T> h, act;        // expert pre-activation [R, in_width] and activation [R, I]
  View1<T> ye, yr, yp;    // expert outputs by expert [R, H], to send back, received [M, H]
  double a2a_seconds = 0; // host time in the all-to-alls so far (forward and backward)
};

// x [N, H] -> y [N, H] (overwritten). `ep` partitions the experts; `router_group` is the group
// whose tokens the router's losses and load cover (router.hpp). Collective over both. The whole
// layer (router included, in T) exists for float and double; a 16-bit model runs its router in
// fp32 and calls the experts' half below (model/moe_block.cpp).
template <class T>
void moe_forward(const ExecSpace& exec, const MoeLayerConfig& cfg, const MoeParams<T>& p,
                 View1<const T> x, int N, comm::Communicator& ep,
                 comm::Communicator& router_group, MoeLayerState<T>& st, View1<T> y);

// The experts' half of moe_forward, for choices made elsewhere (the model's fp64 router, or
// the fp32 router of a 16-bit model): expert [N k] (RouterState::expert: -1 where dropped) and
// the combine weights [N k] in weight_t<T> (fp32 for 16-bit rows, permute.hpp).
// Fills st except st.router. Collective over `ep`. Instantiated for float, double and (where
// they exist) the 16-bit types, whose rows cross the all-to-alls as 16-bit.
template <class T>
void moe_experts_forward(const ExecSpace& exec, const MoeLayerConfig& cfg, const MoeParams<T>& p,
                         View1<const int> expert, View1<const weight_t<T>> weight,
                         View1<const T> x, int N, comm::Communicator& ep, MoeLayerState<T>& st,
                         View1<T> y);

// Its backward: dx [N, H] (overwritten) through the experts and the dispatch only (the router's
// part is router_backward's), dweight [N k] (overwritten) = dL/d(combine weights), and the
// expert weight gradients g.w_in, g.w_out (accumulated; g.router is not touched).
template <class T>
void moe_experts_backward(const ExecSpace& exec, const MoeLayerConfig& cfg, const MoeParams<T>& p,
                          MoeLayerState<T>& st, View1<const weight_t<T>> weight,
                          View1<const T> dy, comm::Communicator& ep, View1<T> dx,
                          View1<weight_t<T>> dweight, const MoeGrads<T>& g);

// dy [N, H] -> dx [N, H] (overwritten) and the gradients (accumulated); the router's losses
// enter with weight loss_scale (router_backward). Collective over `ep` (the same as forward's).
template <class T>
void moe_backward(const ExecSpace& exec, const MoeLayerConfig& cfg, const MoeParams<T>& p,
                  MoeLayerState<T>& st, View1<const T> x, View1<const T> dy,
                  comm::Communicator& ep, View1<T> dx, const MoeGrads<T>& g,
                  double loss_scale = 1.0);

}  // namespace meshtrain::moe
