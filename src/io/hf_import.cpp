#include "meshtrain/io/hf_import.hpp"

#include <algorithm>
#include <vector>

#include "meshtrain/core/error.hpp"
#include "meshtrain/io/hf_mixtral.hpp"
#include "meshtrain/io/safetensors_sharded.hpp"

namespace meshtrain::io {

namespace {

// This rank's slice of parameter p (registry layout, fp32) from the folder.
void read_slice(const ShardedSafetensorsReader& f, const std::string& name,
                const model::ParamInfo& p, int tp_rank, std::int64_t rows, float* dst) {
  using model::Split;
  const bool matrix = p.global_shape.size() == 2;
  const std::int64_t lrows = p.local_shape[0], lcols = matrix ? p.local_shape[1] : 1;
  switch (p.split) {
    case Split::replicated:
      f.read_rows(name, 0, rows, SliceType::f32, dst);
      return;
    case Split::rows: {  // vocabulary rows beyond the real ones stay zero
      const std::int64_t r0 = tp_rank * lrows, r1 = std::min(r0 + lrows, rows);
      if (r0 < r1) f.read_rows(name, r0, r1, SliceType::f32, dst);
      return;
    }
    case Split::cols: {
      const std::int64_t n = matrix ? lcols : lrows, c0 = tp_rank * n;
      if (matrix) f.read_cols(name, c0, c0 + n, SliceType::f32, dst);
      else f.read_rows(name, c0, c0 + n, SliceType::f32, dst);  // a vector's elements
      return;
    }
    case Split::qkv_cols: {  // each of q, k, v split by heads: three column ranges
      const std::int64_t part = (matrix ? lcols : lrows) / 3;
      const std::int64_t whole = (matrix ? p.global_shape[1] : p.global_shape[0]) / 3;
      for (int which = 0; which < 3; ++which) {
        const std::int64_t c0 = which * whole + tp_rank * part;
        if (!matrix) {
          f.read_rows(name, c0, c0 + part, SliceType::f32, dst + which * part);
          continue;
        }
        const std::vector<float> v = f.read_cols_f32(name, c0, c0 + part);
        for (std::int64_t r = 0; r < lrows; ++r)
          std::copy(v.begin() + r * part, v.begin() + (r + 1) * part,
                    dst + r * lcols + which * part);
      }
      return;
    }
  }
}

// A Mixtral MoE parameter (whole on every tp rank; only this ep rank's experts are in the
// registry, so a rank reads its own experts and no other): the hub form's tensors when the
// folder has them, else transformers 5's fused form (a slab per expert), each read whole and
// transposed into its columns of the registry tensor.
void read_mixtral(const ShardedSafetensorsReader& f, const std::string& dir,
                  const model::ParameterRegistry& reg, const model::ParamInfo& p, float* dst) {
  std::vector<HfPart> parts = hf_parts(reg, p);
  const std::vector<HfPart> fused = hf_fused_parts(reg, p);
  if (!f.has(parts.front().name) && f.has(fused.front().name)) parts = fused;
  for (const HfPart& h : parts)
    if (!f.has(h.name))
      throw ConfigError(cat(dir, " has no tensor ", h.name, " (nor the fused ",
                            fused.front().name, " that transformers 5 holds) for meshtrain's ",
                            p.name, " (check config.json's num_local_experts, "
                            "num_hidden_layers against the weights)"));
  const std::int64_t R = p.global_shape[0], C = p.global_shape[1];
  for (const HfPart& h : parts) {
    f.expect(h.name, h.shape);
    const std::int64_t n = h.shape[h.shape.size() - 2];  // the HF rows: registry columns
    const std::int64_t slab = h.slab < 0 ? 0 : h.slab;
    const std::vector<float> v = h.slab < 0 ? f.read_rows_f32(h.name, 0, n)
                                            : f.read_rows_f32(h.name, slab, slab + 1);
    hf_to_registry_cols(v.data(), R, C, h.col0, n, dst);
  }
}

}  // namespace

template <class T>
void import_hf_slices(const model::ParameterRegistry& reg, const std::string& dir, View1<T> out) {
  MESHTRAIN_CHECK(out.span() >= reg.size(), "import_hf_slices: buffer of ", out.span(),
                  " elements, the registry needs ", reg.size());
  const model::GptConfig& cfg = reg.config();
  ShardedSafetensorsReader f(dir);
  std::vector<float> host(reg.size(), 0.0f);
  const std::string prefix = "transformer.";
  for (const auto& p : reg.params()) {
    if (!cfg.is_gpt2() && cfg.moe.is_moe_layer(p.layer) && hf_parts(reg, p).front().transpose) {
      read_mixtral(f, dir, reg, p, host.data() + p.offset);
      continue;
    }
    std::string name = p.name;
    // GPT-2 folders name the transformer's tensors with or without the prefix.
    if (cfg.is_gpt2() && !f.has(name) && name.rfind(prefix, 0) == 0 &&
        f.has(name.substr(prefix.size())))
      name = name.substr(prefix.size());
    if (!f.has(name))
      throw ConfigError(cat(dir, " has no tensor ", p.name,
                            cfg.is_gpt2() ? " (nor without 'transformer.')" : "",
                            " (check config.json against the weights)"));
    std::vector<std::int64_t> want = p.global_shape;
    const bool vocab_rows = p.name == reg.embedding_name() || p.name == reg.head_weight_name();
    if (vocab_rows) want[0] = cfg.vocab_size;  // HF holds the real vocabulary rows only
    f.expect(name, want);
    read_slice(f, name, p, reg.tp_rank(), want[0], host.data() + p.offset);
  }
  auto h = Kokkos::create_mirror_view(out);
  for (std::size_t i = 0; i < host.size(); ++i) h(i) = static_cast<T>(host[i]);
  Kokkos::deep_copy(out, h);
}

template void import_hf_slices<float>(const model::ParameterRegistry&, const std::string&,
                                      View1<float>);
#if MESHTRAIN_HAVE_BF16
template void import_hf_slices<bf16>(const model::ParameterRegistry&, const std::string&,
                                     View1<bf16>);
template void import_hf_slices<fp16>(const model::ParameterRegistry&, const std::string&,
                                     View1<fp16>);
#endif

}  // namespace meshtrain::io
