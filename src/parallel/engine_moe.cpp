// The engine's Mixture-of-Experts state: the routers' figures of a step (moe_metrics) and the
// sigmoid router's expert biases (moe.expert_bias, DeepSeek-V3's auxiliary-loss-free
// balancing): their update after each step and their place in checkpoints.
//
// The bias is replicated: every rank that holds a block (its dp, ep and tp copies) keeps the
// same [E] values, because each update is a function of the step's global load alone. The load
// of a block is summed over tp rank 0 of every dp rank of the stage that holds it (tp ranks
// route the same rows), which is the same total in every layout: the step routes the same
// global batch whatever the layout, one router call per micro-batch. A checkpoint stores each
// block's biases as a dataset of its /state group (<block>mlp.router.expert_bias), so any layout
// restores them. Files written before that kept them as root attributes extra.moe.expert_bias.<l>
// (hexadecimal floats, exact); those still restore.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/parallel/engine.hpp"

namespace meshtrain::parallel {

namespace {

// The /state dataset of block l's biases, named like the block's parameters.
std::string expert_bias_name(const model::ParameterRegistry& reg, int l) {
  return reg.block_prefix(l) + "mlp.router.expert_bias";
}

// The attribute of a file written before the /state group.
std::string legacy_bias_key(int l) { return cat("moe.expert_bias.", l); }

std::vector<float> decode_legacy(const std::string& s, int n, const std::string& key,
                          const std::string& file) {
  std::vector<float> v;
  std::istringstream in(s);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const double x = std::strtod(word.c_str(), &end);
    MESHTRAIN_CONFIG_CHECK(end && *end == '\0' && std::isfinite(x), "checkpoint ", file,
                           ": attribute extra.", key, " holds '", word,
                           "', not a finite number; the file is damaged");
    v.push_back(static_cast<float>(x));
  }
  MESHTRAIN_CONFIG_CHECK(static_cast<int>(v.size()) == n, "checkpoint ", file, ": attribute extra.",
                         key, " holds ", v.size(), " expert biases, the model has ", n,
                         " experts");
  return v;
}

}  // namespace

template <class T>
std::vector<MoeLayerMetrics> Engine<T>::moe_metrics() {
  std::vector<MoeLayerMetrics> out;
  const auto& mc = cfg_.moe;
  if (!mc.enabled()) return out;
  // Per block: calls, aux, z, tokens, dropped, expert seconds, ranks that ran it, load [E];
  // tp rank 0 of each dp rank of the stage holding the block contributes (tp ranks route the
  // same rows).
  const int L = cfg_.n_layer, E = mc.experts, W = 8 + E;
  std::vector<double> v(static_cast<std::size_t>(L) * W, 0.0);
  const auto& st = model_->moe_stats();
  if (ctx_->tp_rank() == 0)
    for (int l = 0; l < L; ++l) {
      const model::MoeLayerStats& s = st[static_cast<std::size_t>(l)];
      if (s.load.empty()) continue;
      double* r = v.data() + static_cast<std::size_t>(l) * W;
      r[0] = s.calls;
      r[1] = s.aux;
      r[2] = s.z;
      r[3] = s.tokens;
      r[4] = s.dropped;
      r[5] = s.expert_seconds;
      r[6] = 1;
      r[7] = s.a2a_seconds;
      for (int e = 0; e < E; ++e) r[8 + e] = s.load[static_cast<std::size_t>(e)];
    }
  world_all_reduce(v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_SUM);
  for (int l = 0; l < L; ++l) {
    if (!mc.is_moe_layer(l)) continue;
    const double* r = v.data() + static_cast<std::size_t>(l) * W;
    MoeLayerMetrics m;
    m.layer = l;
    const double calls = r[0] > 0 ? r[0] : 1;
    m.aux = r[1] / calls;
    m.z = r[2] / calls;
    m.dropped = r[3] > 0 ? r[4] / (r[3] * mc.top_k) : 0;
    m.expert_ms = r[6] > 0 ? 1e3 * r[5] / r[6] : 0;
    m.a2a_ms = r[6] > 0 ? 1e3 * r[7] / r[6] : 0;
    const double* load = r + 8;
    double lo = load[0], hi = load[0], sum = 0, sq = 0;
    for (int e = 0; e < E; ++e) {
      lo = std::min(lo, load[e]);
      hi = std::max(hi, load[e]);
      sum += load[e];
    }
    const double mean = sum / E;
    for (int e = 0; e < E; ++e) sq += (load[e] - mean) * (load[e] - mean);
    m.load_min = lo;
    m.load_max = hi;
    m.load_cv = mean > 0 ? std::sqrt(sq / E) / mean : 0;
    out.push_back(m);
  }
  return out;
}

template <class T>
void Engine<T>::update_expert_bias() {
  const auto& mc = cfg_.moe;
  if (!mc.enabled() || !mc.expert_bias) return;
  const int L = cfg_.n_layer, E = mc.experts;
  std::vector<double> load(static_cast<std::size_t>(L) * E, 0.0);
  const auto& st = model_->moe_stats();
  if (ctx_->tp_rank() == 0)
    for (int l = 0; l < L; ++l) {
      const auto& s = st[static_cast<std::size_t>(l)].load;
      for (std::size_t e = 0; e < s.size(); ++e) load[static_cast<std::size_t>(l) * E + e] = s[e];
    }
  // Integer counts: the sum is exact in any order, so every rank computes the same update.
  world_all_reduce(load.data(), static_cast<int>(load.size()), MPI_DOUBLE, MPI_SUM);
  for (int l = 0; l < L; ++l) {
    if (model_->expert_bias(l).span() == 0) continue;  // not held here
    const auto first = load.begin() + static_cast<std::ptrdiff_t>(l) * E;
    model_->update_expert_bias(l, std::vector<double>(first, first + E), mc.expert_bias_rate);
  }
}

template <class T>
void Engine<T>::save_expert_bias(io::CheckpointAttributes& attrs) {
  const auto& mc = cfg_.moe;
  if (!mc.enabled() || !mc.expert_bias) return;
  const auto bias_name = [this](int l) { return expert_bias_name(model_->registry(), l); };
  const int L = cfg_.n_layer, E = mc.experts;
  // Each stage's dp rank 0, tp rank 0 contributes its blocks; rank 0 writes the attributes.
  std::vector<double> all(static_cast<std::size_t>(L) * E, 0.0);
  if (ctx_->dp_rank() == 0 && ctx_->tp_rank() == 0)
    for (int l = 0; l < L; ++l) {
      View1<float> b = model_->expert_bias(l);
      if (b.span() == 0) continue;
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, b);
      for (int e = 0; e < E; ++e) all[static_cast<std::size_t>(l) * E + e] = h(e);
    }
  world_all_reduce(all.data(), static_cast<int>(all.size()), MPI_DOUBLE, MPI_SUM);
  for (int l = 0; l < L; ++l) {
    if (!mc.is_moe_layer(l)) continue;
    std::vector<float> v(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) v[static_cast<std::size_t>(e)] =
        static_cast<float>(all[static_cast<std::size_t>(l) * E + e]);
    attrs.state[bias_name(l)] = std::move(v);
  }
}

template <class T>
void Engine<T>::restore_expert_bias(const io::CheckpointAttributes& attrs) {
  const auto& mc = cfg_.moe;
  if (!mc.enabled()) return;
  const auto bias_name = [this](int l) { return expert_bias_name(model_->registry(), l); };
  // Block 0 is always an MoE block.
  const bool saved = attrs.state.count(bias_name(0)) > 0 ||
                     attrs.extra.count(legacy_bias_key(0)) > 0;
  if (!mc.expert_bias) {
    if (saved)
      logging::warn("checkpoint ", attrs.path, " holds expert biases (moe.expert_bias); this run "
                    "routes without them (moe.expert_bias is off)");
    return;
  }
  // Every rank checks every block's biases, so a damaged one fails on all ranks alike.
  const int E = mc.experts;
  for (int l = 0; l < cfg_.n_layer; ++l) {
    if (!mc.is_moe_layer(l)) continue;
    std::vector<float> v(static_cast<std::size_t>(E), 0.0f);
    // A checkpoint saved without moe.expert_bias: the biases start from zero here.
    if (const auto it = attrs.state.find(bias_name(l)); it != attrs.state.end()) {
      MESHTRAIN_CONFIG_CHECK(static_cast<int>(it->second.size()) == E, "checkpoint ", attrs.path,
                             ": /state/", it->first, " holds ", it->second.size(),
                             " expert biases, the model has ", E, " experts");
      v = it->second;
    } else if (const auto old = attrs.extra.find(legacy_bias_key(l)); old != attrs.extra.end()) {
      v = decode_legacy(old->second, E, old->first, attrs.path);
    }
    View1<float> b = model_->expert_bias(l);
    if (b.span() == 0) continue;  // not held here
    HostView1<float> h("meshtrain::expert_bias.host", static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) h(e) = v[static_cast<std::size_t>(e)];
    Kokkos::deep_copy(b, h);
  }
  if (!saved)
    logging::info("checkpoint ", attrs.path, " holds no expert biases: moe.expert_bias starts "
                  "them at zero");
}

#define MESHTRAIN_ENGINE_MOE(T)                                                      \
  template std::vector<MoeLayerMetrics> Engine<T>::moe_metrics();                   \
  template void Engine<T>::update_expert_bias();                                    \
  template void Engine<T>::save_expert_bias(io::CheckpointAttributes&);            \
  template void Engine<T>::restore_expert_bias(const io::CheckpointAttributes&);
MESHTRAIN_ENGINE_MOE(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_ENGINE_MOE(bf16)
MESHTRAIN_ENGINE_MOE(fp16)
#endif
#undef MESHTRAIN_ENGINE_MOE

}  // namespace meshtrain::parallel
