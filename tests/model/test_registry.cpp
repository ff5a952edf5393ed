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

namespace {
GptConfig small_llama(int kv, bool tied) {
  GptConfig c = preset("llama-tiny");
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = kv;
  c.n_embd = 16;
  c.head_dim = 8;  // q width 32, not n_embd
  c.intermediate_size = 24;
  c.vocab_size = 50;
  c.vocab_pad = 16;
  c.block_size = 8;
  c.tied_head = tied;
  return c;
}
}  // namespace

TEST_CASE("registry: Llama names, nn.Linear shapes, tied and untied head", "[model][registry]") {
  const auto cfg = small_llama(2, false);
  ParameterRegistry r(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  REQUIRE(r.params().size() == 1 + 9 * 2 + 2);
  REQUIRE(r.embedding_name() == "model.embed_tokens.weight");
  REQUIRE(r.head_weight_name() == "lm_head.weight");
  REQUIRE(r.get("model.embed_tokens.weight").global_shape == std::vector<std::int64_t>{64, 16});
  REQUIRE(r.get("model.layers.1.self_attn.q_proj.weight").global_shape ==
          std::vector<std::int64_t>{32, 16});
  REQUIRE(r.get("model.layers.1.self_attn.k_proj.weight").global_shape ==
          std::vector<std::int64_t>{16, 16});
  REQUIRE(r.get("model.layers.0.self_attn.o_proj.weight").global_shape ==
          std::vector<std::int64_t>{16, 32});
  REQUIRE(r.get("model.layers.0.mlp.down_proj.weight").global_shape ==
          std::vector<std::int64_t>{16, 24});
  REQUIRE(r.get("lm_head.weight").global_shape == std::vector<std::int64_t>{64, 16});
  REQUIRE(r.find("transformer.wpe.weight") == nullptr);  // rotary: no position table
  REQUIRE(r.get("model.norm.weight").init == Init::ones);
  REQUIRE(!r.get("model.layers.0.input_layernorm.weight").decay);
  REQUIRE(r.units()[1].name == "model.layers.0");
  // The head unit holds lm_head; a last stage without the embedding holds no copy of it.
  ParameterRegistry last(cfg, 0, 1, 1, 1, 2, false, true);
  REQUIRE(last.embedding_unit() == -1);
  REQUIRE(last.find("lm_head.weight") != nullptr);
  const auto tied = small_llama(2, true);
  ParameterRegistry last_tied(tied, 0, 1, 1, 1, 2, false, true);
  REQUIRE(last_tied.embedding_unit() == 0);
  REQUIRE(last_tied.find("lm_head.weight") == nullptr);
  REQUIRE(last_tied.head_weight_name() == "model.embed_tokens.weight");
  REQUIRE(!last_tied.counts_in_norm(last_tied.get("model.embed_tokens.weight")));
}

TEST_CASE("registry: Llama kv heads split over tp or replicated", "[model][registry]") {
  for (int kv : {1, 2, 4}) {
    const auto cfg = small_llama(kv, false);
    for (int tp : {1, 2, 4}) {
      INFO("n_kv_head " << kv << " tp " << tp);
      std::vector<ParameterRegistry> ranks;
      for (int t = 0; t < tp; ++t) ranks.emplace_back(cfg, t, tp, 0, 0, cfg.n_layer, true, true);
      for (std::size_t k = 0; k < ranks[0].params().size(); ++k) {
        const ParamInfo& p0 = ranks[0].params()[k];
        std::multiset<std::int64_t> seen;
        for (int t = 0; t < tp; ++t)
          for (std::size_t i = 0; i < ranks[t].params()[k].numel; ++i)
            seen.insert(ranks[t].params()[k].global_index(i, t, tp));
        const std::size_t copies = p0.split == Split::replicated ? tp : 1;
        REQUIRE(seen.size() == static_cast<std::size_t>(p0.global_numel()) * copies);
      }
      const auto& k0 = ranks[0].get("model.layers.0.self_attn.k_proj.weight");
      for (int t = 0; t < tp; ++t) {
        const auto& r = ranks[t];
        if (kv >= tp) {
          REQUIRE(!r.kv_replicated());
          REQUIRE(k0.split == Split::rows);
          REQUIRE(r.local_kv_heads() == kv / tp);
          REQUIRE(r.first_kv_head() == t * kv / tp);
        } else {
          // every rank holds all kv heads and uses the one of its query heads (HF: head j / G)
          REQUIRE(r.kv_replicated());
          REQUIRE(k0.split == Split::replicated);
          REQUIRE(r.local_kv_heads() == 1);
          const int first_query = t * (cfg.n_head / tp), group = cfg.n_head / kv;
          REQUIRE(r.first_kv_head() == first_query / group);
        }
      }
    }
  }
  // 3 kv heads at tp 2: neither split evenly nor shared evenly.
  auto cfg = small_llama(2, false);
  cfg.n_head = 6;
  cfg.n_kv_head = 3;
  REQUIRE_THROWS_WITH(ParameterRegistry(cfg, 0, 2, 0, 0, cfg.n_layer, true, true),
                      mt_test::contains("model.n_kv_head=3"));
}

TEST_CASE("presets: parameter counts of the Llama 3 shapes", "[model][registry]") {
  // Meta's published counts (the models' safetensors index totals / 2 bytes).
  REQUIRE(preset("llama3.1-8b").num_parameters() == 8030261248LL);
  REQUIRE(preset("llama3.2-1b").num_parameters() == 1235814400LL);
  REQUIRE(preset("llama3.1-70b").num_parameters() == 70553706496LL);
  const auto gpt2 = preset("gpt2-124m");
  REQUIRE(gpt2.num_parameters() == 124439808LL);  // unchanged by the block description
  for (const auto& n : preset_names()) REQUIRE_NOTHROW(preset(n).validate());
  REQUIRE(preset("llama-150m").num_parameters() > 140000000LL);
  REQUIRE(preset("llama-150m").num_parameters() < 160000000LL);
}
