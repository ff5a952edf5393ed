#pragma once
// The order in which GptT calls its LayerHooks in a training forward and backward of one chunk,
// as a pure function of the registry: what data parallelism reacts to, stated next to the model
// so that the planner can replay DpPolicy over it without running the model
// (tests/model/test_hook_order.cpp holds GptT to it).
#include <vector>

#include "meshtrain/model/registry.hpp"

namespace meshtrain::model {

enum class HookEvent { before_forward, before_backward, after_backward };

struct HookCall {
  HookEvent event;
  int unit;
  bool operator==(const HookCall&) const = default;
};

// Training forward of chunk c of `chunks` (the chunks the registry's rank holds). The head chunk
// runs the head's backward inside its forward: its hooks are part of the forward.
std::vector<HookCall> forward_hooks(const ParameterRegistry& reg,
                                    const std::vector<LayerRange>& chunks, int c);
// Backward of chunk c.
std::vector<HookCall> backward_hooks(const ParameterRegistry& reg,
                                     const std::vector<LayerRange>& chunks, int c);

}  // namespace meshtrain::model
