#include "meshtrain/model/hook_order.hpp"

namespace meshtrain::model {

std::vector<HookCall> forward_hooks(const ParameterRegistry& reg,
                                    const std::vector<LayerRange>& chunks, int c) {
  std::vector<HookCall> out;
  const int eu = reg.embedding_unit(), hu = reg.head_unit();
  const int last = static_cast<int>(chunks.size()) - 1;
  auto add = [&](HookEvent e, int u) { out.push_back(HookCall{e, u}); };
  if (c == 0 && reg.has_embedding() && eu >= 0) add(HookEvent::before_forward, eu);
  for (int l = chunks[c].first; l < chunks[c].last; ++l) {
    add(HookEvent::before_forward, reg.unit_of_layer(l));
    // An MoE block's experts (the next unit) are needed with its router.
    if (reg.expert_unit_of_layer(l) >= 0) add(HookEvent::before_forward, reg.expert_unit_of_layer(l));
  }
  if (c == last && reg.has_head() && hu >= 0) {
    // The LM head reads the tied wte, and its backward (fused into the forward) writes both. An
    // untied head's weight is in the head unit.
    const int te = reg.tied_head() ? eu : -1;
    add(HookEvent::before_forward, hu);
    if (te >= 0) add(HookEvent::before_forward, te);
    add(HookEvent::before_backward, hu);
    if (te >= 0) add(HookEvent::before_backward, te);
    add(HookEvent::after_backward, hu);
    // A last stage without the embedding holds a tied copy, complete after the head.
    if (te >= 0 && !reg.has_embedding()) add(HookEvent::after_backward, te);
  }
  return out;
}

std::vector<HookCall> backward_hooks(const ParameterRegistry& reg,
                                     const std::vector<LayerRange>& chunks, int c) {
  std::vector<HookCall> out;
  for (int l = chunks[c].last - 1; l >= chunks[c].first; --l) {
    // An MoE block: its experts (the later unit) first, so that backward walks units downwards.
    const int eu = reg.expert_unit_of_layer(l);
    if (eu >= 0) out.push_back(HookCall{HookEvent::before_backward, eu});
    out.push_back(HookCall{HookEvent::before_backward, reg.unit_of_layer(l)});
    if (eu >= 0) out.push_back(HookCall{HookEvent::after_backward, eu});
    out.push_back(HookCall{HookEvent::after_backward, reg.unit_of_layer(l)});
  }
  const int eu = reg.embedding_unit();
  if (c == 0 && reg.has_embedding() && eu >= 0) {
    out.push_back(HookCall{HookEvent::before_backward, eu});
    out.push_back(HookCall{HookEvent::after_backward, eu});
  }
  return out;
}

}  // namespace meshtrain::model
