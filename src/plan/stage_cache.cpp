#include "stage_cache.hpp"

#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "meshtrain/parallel/partition.hpp"

namespace meshtrain::plan::detail {

namespace {

using ModelKey = std::string;
ModelKey model_key(const model::GptConfig& c) { return c.key(); }

}  // namespace

const std::vector<model::LayerRange>& cached_pieces(const model::GptConfig& cfg, int seq_len,
                                                    const Layout& l) {
  // The balanced split depends on the piece count and the cost model's seq_len only.
  static std::map<std::tuple<ModelKey, int, int>, std::vector<model::LayerRange>> cache;
  const parallel::ScheduleSpec spec = l.schedule_spec();
  const auto key = std::make_tuple(model_key(cfg), seq_len, spec.n_pieces());
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, parallel::partition(spec, cfg, seq_len)).first;
  return it->second;
}

const model::ParameterRegistry& cached_registry(const model::GptConfig& cfg, int seq_len,
                                                const Layout& l, int stage) {
  static std::map<std::tuple<ModelKey, int, int, int, int, int, int>,
                  std::unique_ptr<model::ParameterRegistry>>
      cache;
  const auto key =
      std::make_tuple(model_key(cfg), seq_len, l.tp, l.pp, l.virtual_chunks, stage, l.ep);
  auto it = cache.find(key);
  if (it == cache.end()) {
    const auto& pieces = cached_pieces(cfg, seq_len, l);
    auto reg = std::make_unique<model::ParameterRegistry>(
        cfg, 0, l.tp, stage, parallel::stage_chunks(pieces, l.pp, stage), stage == 0,
        stage == l.pp - 1, 0, l.ep);  // MoE: ep rank 0's experts (every ep rank holds as many)
    it = cache.emplace(key, std::move(reg)).first;
  }
  return *it->second;
}

}  // namespace meshtrain::plan::detail
