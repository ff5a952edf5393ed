#pragma once
// The MoE router (issue 20): logits = x @ w_router, then either
//   softmax: p = softmax(logits); choose the top k of p; weights = p of the chosen, divided by
//            their sum when k > 1 (Mixtral / Megatron-Core's default; with k = 1 the weight is p
//            itself, as in Switch, so the router still gets a gradient through it), or
//   sigmoid: s = sigmoid(logits); choose the top k of s + bias, where the per-expert bias only
//            chooses (DeepSeek-V3's auxiliary-loss-free balancing: it carries no gradient and
//            is moved after each step from the global load, update_expert_bias); weights = s of
//            the chosen, divided by their sum when k > 1.
// Ties choose the lower expert index, so a choice is a function of the scores alone.
//
// Losses over the tokens of `group` (the ranks that split one sequence set between them; the
// per-expert sums are all-reduced there, so the values do not depend on how the tokens are
// split):
//   aux (Switch load balancing, Megatron-Core's normalisation for top-k):
//       L_aux = aux_loss_coeff * E / (T^2 k) * sum_e count_e * sum_t P_te
//     count_e: (token, choice) pairs routed to e before capacity drops (a constant, no
//     gradient), T: tokens in the group, P: the softmax probabilities (softmax mode) or the
//     per-token normalised sigmoid scores s_te / sum_e' s_te' (sigmoid mode, DeepSeek-V3's
//     sequence-wise form).
//   z (ST-MoE router z-loss):  L_z = z_loss_coeff / T * sum_t logsumexp(logits_t)^2
// Their exact gradients reach the logits in router_backward.
//
// Capacity (capacity_factor > 0): expert e keeps at most C = ceil(capacity_factor * N * k / E)
// of this call's N tokens' choices; the rest are dropped lowest router probability first (p, or
// s in sigmoid mode; equal values drop the later token), so the result is deterministic.
// A dropped choice has expert -1 (RouterState::expert) and weight 0; the weights of the others
// are not renormalised (Megatron-Core's token-drop behaviour). capacity_factor = 0: dropless.
//
// All arithmetic is in T (float in training, double in the gradient checks): the router runs
// in fp32 even when the rest of the model is bf16 (the caller converts x).
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::moe {

enum class RouterScore { softmax, sigmoid };
RouterScore parse_router_score(const std::string& s);  // "softmax" | "sigmoid"; ConfigError

struct RouterConfig {
  int experts = 8;                          // moe.experts (E)
  int top_k = 2;                            // moe.top_k (k)
  RouterScore score = RouterScore::softmax; // moe.router_score
  double aux_loss_coeff = 0.0;              // moe.aux_loss_coeff
  double z_loss_coeff = 0.0;                // moe.z_loss_coeff
  double capacity_factor = 0.0;             // moe.capacity_factor; 0 = dropless
  // ConfigError naming the option when a value is out of range.
  void validate() const;
};

// Values over the whole group (identical on its ranks), and this rank's share of the counts
// (what metrics add up over ranks).
struct RouterStats {
  double aux_loss = 0;            // L_aux (already multiplied by aux_loss_coeff)
  double z_loss = 0;              // L_z (already multiplied by z_loss_coeff)
  double tokens = 0;              // T
  std::vector<double> load;       // count_e, before capacity drops
  double dropped = 0;             // choices dropped by the capacity
  double local_tokens = 0;        // N
  std::vector<double> local_load;
  double local_dropped = 0;
};

// What the forward pass leaves for the dispatch, the combine and router_backward.
template <class T>
struct RouterState {
  int tokens = 0;                 // N (this rank's)
  View1<T> logits;                // [N, E]
  View1<T> scores;                // [N, E] softmax p or sigmoid s
  View1<int> choice;              // [N, k] chosen expert
  View1<int> expert;              // [N, k] where each choice goes: its expert, -1 if dropped
  View1<T> chosen_score;          // [N, k] p (or s) of each choice, dropped ones included
  View1<T> weight;                // [N, k] combine weights (0 where dropped)
  View1<double> global_load;      // [E] count_e over the group (device copy for the backward)
  View1<T> dlogits;               // [N, E] scratch of router_backward
  RouterStats stats;
};

// x [N, H], w_router [H, E] (out = x @ w, the project's linear layout), expert_bias [E] (sigmoid
// mode only; empty for none). Collective over `group` (one all-reduce of 2E + 3 doubles).
template <class T>
void router_forward(const ExecSpace& exec, const RouterConfig& cfg, View1<const T> x,
                    View1<const T> w_router, View1<const T> expert_bias, int N, int H,
                    comm::Communicator& group, RouterState<T>& state);

// From dweight [N, k] (dL/d of the combine weights; may be empty when no expert output depends
// on them) and the losses' own gradients (each scaled by loss_scale = dL/dL_aux = dL/dL_z):
//   dx [N, H] += dlogits @ w_router^T   (skipped when dx is empty)
//   dw_router [H, E] += x^T @ dlogits
// Local: the group's sums were kept by the forward pass.
template <class T>
void router_backward(const ExecSpace& exec, const RouterConfig& cfg, RouterState<T>& state,
                     View1<const T> dweight, View1<const T> x, View1<const T> w_router,
                     View1<T> dx, View1<T> dw_router, int H, double loss_scale = 1.0);

// DeepSeek-V3's bias update after a step: bias_e += rate * sign(mean load - load_e), from the
// group's load of the step (RouterStats::load); every rank of the group applies the same update.
template <class T>
void update_expert_bias(const ExecSpace& exec, View1<T> bias, const std::vector<double>& load,
                        double rate);

}  // namespace meshtrain::moe
