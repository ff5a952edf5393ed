#pragma once
// What data parallelism needs from a model: its registry (and so its units), its full flat
// buffers (empty where the model did not allocate them: params at ZeRO-3, grads at ZeRO 2/3),
// a way to bind one unit's storage (an empty view keeps the current binding) and which
// gradients its GEMMs overwrite on their first write of a step (null: none; every gradient is
// then zeroed).
#include <functional>

#include "meshtrain/core/view.hpp"
#include "meshtrain/model/grad_first_write.hpp"
#include "meshtrain/model/registry.hpp"

namespace meshtrain::parallel {

template <class T>
struct ModelBuffers {
  const model::ParameterRegistry* registry = nullptr;
  View1<T> params, grads;
  std::function<void(int unit, View1<T> params, View1<T> grads)> bind_unit;
  model::GradFirstWrite* first_write = nullptr;
};

}  // namespace meshtrain::parallel
