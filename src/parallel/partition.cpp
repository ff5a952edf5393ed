#include "meshtrain/parallel/partition.hpp"

#include <algorithm>
#include <cctype>
#include <limits>
#include <sstream>

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

PieceCostModel cost_model(const model::GptConfig& cfg, int seq_len) {
  // A block: 2 FLOPs per weight and token (q/k/v, output projection, the MLP's two or three
  // matrices) plus causal attention's 4 T Q (GPT-2: 24 C^2 + 4 T C).
  const double C = cfg.n_embd, T = seq_len, Vp = cfg.padded_vocab(), I = cfg.mlp_width();
  const double HS = cfg.head_size(), Q = cfg.n_head * HS, KV = cfg.kv_heads() * HS;
  const double mlp = (cfg.mlp == model::Mlp::swiglu ? 3.0 : 2.0) * C * I;
  return {2.0 * (C * (Q + 2 * KV) + Q * C + mlp) + 4.0 * T * Q, 2.0 * C, 2.0 * C * Vp};
}

namespace {
double cost_of(int k, int n_pieces, int blocks, const PieceCostModel& c) {
  double x = blocks * c.block;
  if (k == 0) x += c.embedding;
  if (k == n_pieces - 1) x += c.head;
  return x;
}
}  // namespace

std::vector<double> piece_costs(const std::vector<LayerRange>& pieces, const PieceCostModel& c) {
  std::vector<double> out;
  const int n = static_cast<int>(pieces.size());
  for (int k = 0; k < n; ++k)
    out.push_back(cost_of(k, n, blocks(pieces[static_cast<std::size_t>(k)]), c));
  return out;
}

std::vector<LayerRange> balanced_partition(int n_layer, int n_pieces, const PieceCostModel& c) {
  MESHTRAIN_CONFIG_CHECK(n_pieces >= 1 && n_pieces <= n_layer, "cannot split model.n_layer=",
                         n_layer, " blocks into ", n_pieces,
                         " pipeline pieces of at least one block each");
  const int L = n_layer, P = n_pieces;
  constexpr double inf = std::numeric_limits<double>::infinity();
  // table[k][j]: best value for the first j blocks in k pieces; from[k][j]: where piece k-1
  // starts in that best split.
  auto table = [&] {
    return std::vector<std::vector<double>>(static_cast<std::size_t>(P + 1),
                                            std::vector<double>(static_cast<std::size_t>(L + 1),
                                                                inf));
  };
  std::vector<std::vector<int>> from(static_cast<std::size_t>(P + 1),
                                     std::vector<int>(static_cast<std::size_t>(L + 1), -1));
  // Pass 1: the smallest achievable maximum piece cost. Pass 2: with every piece at most that,
  // the smallest sum of squares (a tie-break towards even pieces that keeps the optimum).
  auto solve = [&](bool minmax, double cap) {
    for (auto& row : from) std::fill(row.begin(), row.end(), -1);
    auto best = table();
    best[0][0] = 0;
    for (int k = 1; k <= P; ++k)
      for (int j = k; j <= L - (P - k); ++j)
        for (int i = k - 1; i < j; ++i) {
          const double prev = best[static_cast<std::size_t>(k - 1)][static_cast<std::size_t>(i)];
          if (prev == inf) continue;
          const double x = cost_of(k - 1, P, j - i, c);
          if (x > cap) continue;
          const double v = minmax ? std::max(prev, x) : prev + x * x;
          double& cur = best[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)];
          if (v < cur) {
            cur = v;
            from[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)] = i;
          }
        }
    return best[static_cast<std::size_t>(P)][static_cast<std::size_t>(L)];
  };
  const double max_cost = solve(true, inf);
  solve(false, max_cost * (1.0 + 1e-12));
  std::vector<LayerRange> out(static_cast<std::size_t>(P));
  for (int k = P, j = L; k > 0; --k) {
    const int i = from[static_cast<std::size_t>(k)][static_cast<std::size_t>(j)];
    out[static_cast<std::size_t>(k - 1)] = {i, j};
    j = i;
  }
  return out;
}

std::vector<LayerRange> parse_layer_split(const std::string& text, int n_layer, int n_pieces) {
  auto bad = [&](const std::string& why) {
    return ConfigError(cat("pp.layers='", text, "': ", why));
  };
  std::vector<int> counts;
  std::stringstream ss(text);
  for (std::string tok; std::getline(ss, tok, ',');) {
    auto space = [](unsigned char ch) { return std::isspace(ch) != 0; };
    tok.erase(std::remove_if(tok.begin(), tok.end(), space), tok.end());
    std::size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (tok.empty() || used != tok.size())
      throw bad(cat("'", tok, "' is not a block count (expected comma-separated integers such as "
                              "4,4,3,1)"));
    if (n < 1) throw bad(cat("every pipeline stage needs at least one block, got ", n));
    counts.push_back(n);
  }
  if (static_cast<int>(counts.size()) != n_pieces)
    throw bad(cat(counts.size(), " block counts for ", n_pieces,
                  " pipeline stages (mesh.pp x pp.virtual_chunks)"));
  int sum = 0;
  for (int n : counts) sum += n;
  if (sum != n_layer) throw bad(cat("the counts sum to ", sum, ", not model.n_layer=", n_layer));
  std::vector<LayerRange> out;
  int first = 0;
  for (int n : counts) {
    out.push_back({first, first + n});
    first += n;
  }
  return out;
}

std::vector<LayerRange> partition(const ScheduleSpec& spec, const model::GptConfig& cfg,
                                  int seq_len, const std::string& layers) {
  validate(spec, cfg.n_layer);
  if (!layers.empty()) return parse_layer_split(layers, cfg.n_layer, spec.n_pieces());
  if (spec.kind == ScheduleKind::interleaved && spec.chunks > 1) {
    // Megatron's interleaving: every virtual stage the same number of blocks (validate()
    // checked divisibility), so the chunks of a rank are equally long.
    std::vector<LayerRange> even;
    const int per = cfg.n_layer / spec.n_pieces();
    for (int k = 0; k < spec.n_pieces(); ++k) even.push_back(LayerRange{k * per, (k + 1) * per});
    return even;
  }
  return balanced_partition(cfg.n_layer, spec.n_pieces(), cost_model(cfg, seq_len));
}

std::vector<LayerRange> stage_chunks(const std::vector<LayerRange>& pieces, int pp, int stage) {
  MESHTRAIN_CHECK(pp >= 1 && stage >= 0 && stage < pp &&
                      static_cast<int>(pieces.size()) % pp == 0,
                  "stage_chunks: ", pieces.size(), " pieces, pp=", pp, ", stage ", stage);
  std::vector<LayerRange> out;
  for (std::size_t k = static_cast<std::size_t>(stage); k < pieces.size();
       k += static_cast<std::size_t>(pp))
    out.push_back(pieces[k]);
  return out;
}

std::string to_string(const std::vector<LayerRange>& pieces) {
  std::string s;
  for (const LayerRange& r : pieces) s += cat(s.empty() ? "" : " ", "[", r.first, ",", r.last, ")");
  return s;
}

}  // namespace meshtrain::parallel
