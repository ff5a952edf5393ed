#pragma once
// Which transformer blocks each pipeline piece (virtual stage) holds. Pieces are contiguous:
// piece k = virtual stage k holds blocks [first, last); piece 0 also runs the embedding, the
// last piece the final LayerNorm, LM head and loss. Rank r's chunk c is piece c * pp + r.
#include <string>
#include <vector>

#include "meshtrain/model/config.hpp"
#include "meshtrain/model/registry.hpp"
#include "meshtrain/parallel/schedule.hpp"

namespace meshtrain::parallel {

using model::LayerRange;  // blocks [first, last)
inline int blocks(const LayerRange& r) { return r.last - r.first; }

// Forward FLOPs per token of the parts of the model that a piece may hold. Backward is about
// twice forward for every part, so forward alone ranks the pieces the same way.
struct PieceCostModel {
  double block = 0;      // one transformer block: 24 C^2 (QKV, projection, MLP) + 4 T C (QK^T, AV)
  double embedding = 0;  // token + position lookup and add: 2 C (memory-bound, small)
  double head = 0;       // LM head 2 C Vp (the tied wte as a GEMM); the loss is O(Vp)
};
PieceCostModel cost_model(const model::GptConfig& cfg, int seq_len);

// Cost of each piece under the model.
std::vector<double> piece_costs(const std::vector<LayerRange>& pieces, const PieceCostModel& c);

// n_layer blocks in n_pieces contiguous pieces of at least one block each, minimising the cost
// of the most expensive piece (the pipeline runs at the pace of its slowest stage); among the
// splits that reach that minimum, the one with the smallest sum of squared piece costs (the
// most even). Exact dynamic programme, O(n_pieces n_layer^2). ConfigError when
// n_pieces > n_layer.
std::vector<LayerRange> balanced_partition(int n_layer, int n_pieces, const PieceCostModel& c);

// An explicit split: comma-separated block counts ("4,4,3,1"), one per piece in virtual-stage
// order, each >= 1, summing to n_layer. ConfigError naming pp.layers otherwise.
std::vector<LayerRange> parse_layer_split(const std::string& text, int n_layer, int n_pieces);

// The pieces of a pipeline: validate(spec, n_layer), then the explicit split when `layers` is
// not empty, the balanced one otherwise.
std::vector<LayerRange> partition(const ScheduleSpec& spec, const model::GptConfig& cfg,
                                  int seq_len, const std::string& layers = "");

// Rank `stage`'s chunks in chunk order: pieces stage, pp + stage, 2 pp + stage, ...
std::vector<LayerRange> stage_chunks(const std::vector<LayerRange>& pieces, int pp, int stage);

std::string to_string(const std::vector<LayerRange>& pieces);  // "[0,4) [4,8) ..."

}  // namespace meshtrain::parallel
