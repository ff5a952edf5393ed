// The parameter registry: names, shapes, offsets, and the local -> global index map of every
// tensor-parallel split (the union over tp ranks must cover each global tensor exactly once).
#include <set>
#include <vector>

#include "harness.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/model/registry.hpp"

using namespace meshtrain;
using namespace meshtrain::model;

namespace {
GptConfig small() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  c.vocab_size = 50;
  c.vocab_pad = 16;  // padded 64: divisible by tp 1, 2, 4
  c.block_size = 8;
  return c;
}
}  // namespace

TEST_CASE("registry: HF names, shapes, aligned non-overlapping offsets", "[model][registry]") {
  const auto cfg = small();
  ParameterRegistry r(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  REQUIRE(r.params().size() == 2 + 12 * 2 + 2);
  REQUIRE(r.get("transformer.wte.weight").global_shape == std::vector<std::int64_t>{64, 16});
  REQUIRE(r.get("transformer.h.1.attn.c_attn.weight").global_shape ==
          std::vector<std::int64_t>{16, 48});
  REQUIRE(r.get("transformer.h.0.mlp.c_proj.weight").global_shape ==
          std::vector<std::int64_t>{64, 16});
  REQUIRE_THROWS_AS(r.get("transformer.h.2.ln_1.weight"), Error);
  std::size_t end = 0;
  for (const auto& p : r.params()) {
    REQUIRE(p.offset % ParameterRegistry::kAlign == 0);
    REQUIRE(p.offset >= end);
    end = p.offset + p.numel;
    REQUIRE(p.decay == (p.global_shape.size() == 2));  // 2-D weights and embeddings decay
  }
  REQUIRE(r.size() == end);
}

TEST_CASE("registry: tensor-parallel slices cover every global element once", "[model][registry]") {
  const auto cfg = small();
  for (int tp : {1, 2, 4}) {
    std::vector<ParameterRegistry> ranks;
    for (int t = 0; t < tp; ++t) ranks.emplace_back(cfg, t, tp, 0, 0, cfg.n_layer, true, true);
    for (std::size_t k = 0; k < ranks[0].params().size(); ++k) {
      const ParamInfo& p0 = ranks[0].params()[k];
      INFO(p0.name << " tp=" << tp << " split " << split_name(p0.split));
      std::multiset<std::int64_t> seen;
      for (int t = 0; t < tp; ++t) {
        const ParamInfo& p = ranks[t].params()[k];
        REQUIRE(p.name == p0.name);
        for (std::size_t i = 0; i < p.numel; ++i) seen.insert(p.global_index(i, t, tp));
      }
      const std::int64_t n = p0.global_numel();
      const std::size_t copies = p0.split == Split::replicated ? tp : 1;
      REQUIRE(seen.size() == static_cast<std::size_t>(n) * copies);
      for (std::int64_t g = 0; g < n; ++g) REQUIRE(seen.count(g) == copies);
    }
    // qkv: the first local column of rank t's k part is global column C + t * C / tp.
    const auto& qkv = ranks[tp - 1].get("transformer.h.0.attn.c_attn.weight");
    const std::int64_t lcols = qkv.local_shape[1], part = lcols / 3;
    REQUIRE(qkv.global_index(part, tp - 1, tp) == 16 + (tp - 1) * (16 / tp));
  }
  // tp must divide the split dimension: a clear error naming the tensor.
  try {
    ParameterRegistry bad(cfg, 0, 3, 0, 0, cfg.n_layer, true, true);
    FAIL("tp=3 accepted");
  } catch (const ConfigError& e) {
    REQUIRE(std::string(e.what()).find("mesh.tp=3") != std::string::npos);
  }
}
