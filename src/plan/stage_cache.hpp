#pragma once
// The pipeline pieces and per-stage registries of a (model, tp, pp, v) are the same for every
// micro-batch size, ZeRO stage and schedule variant the search tries: built once per process.
// Single-threaded (the planner runs on one rank).
#include <vector>

#include "meshtrain/model/config.hpp"
#include "meshtrain/model/registry.hpp"
#include "meshtrain/plan/layout.hpp"

namespace meshtrain::plan::detail {

// Pieces of the layout's schedule (parallel::partition, balanced), and the registry of pipeline
// stage `stage` (tp rank 0; every tp rank's slice has the same sizes).
const std::vector<model::LayerRange>& cached_pieces(const model::GptConfig& cfg, int seq_len,
                                                    const Layout& l);
const model::ParameterRegistry& cached_registry(const model::GptConfig& cfg, int seq_len,
                                                const Layout& l, int stage);

}  // namespace meshtrain::plan::detail
