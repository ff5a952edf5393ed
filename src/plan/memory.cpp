// Memory per rank (memory.hpp). Every term names the allocation it stands for; the sizes are the
// expressions of the allocating code (GptT's constructor, GradSync, ShardedAdamW, the trainer),
// in the same integer arithmetic, so that for meshtrain the prediction is exact up to the
// allocator's own rounding.
#include "meshtrain/plan/memory.hpp"

#include <algorithm>
#include <cstdio>

#include "meshtrain/core/error.hpp"
#include "meshtrain/model/registry.hpp"
#include "meshtrain/parallel/partition.hpp"
#include "meshtrain/parallel/zero_partition.hpp"
#include "pools.hpp"
#include "stage_cache.hpp"

namespace meshtrain::plan {

namespace {

// Attention on host memory works on 64 query rows at a time (src/kernels/attention_host.cpp):
// a 64 x T score block forward, two of them backward.
constexpr std::size_t kAttentionBlock = 64;
// GPU scratch of the kernels: cuBLASLt's workspace (kernels/gemm_lt.cpp) and the most blocks
// of the CUDA LayerNorm backward, each with 2C float partial sums (kernels/layernorm_cuda.cpp).
constexpr std::size_t kCublasLtWorkspace = std::size_t(32) << 20;
constexpr std::size_t kLayerNormBlocks = 4 * 132;

// model::BlockActivations<T>: what one block keeps for backward for one micro-batch.
double block_activation_bytes(std::size_t B, std::size_t T, std::size_t N, std::size_t Nl,
                              std::size_t C, std::size_t NHl, std::size_t tp, std::size_t E) {
  const std::size_t compute = N * C             // ln1 (gathered under SP)
                              + N * 3 * C / tp  // qkv
                              + N * C / tp      // atty
                              + Nl * C          // res2
                              + N * C           // ln2
                              + N * 4 * C / tp * 2;  // fch, fch_gelu
  const std::size_t stats = 4 * Nl + B * NHl * T;  // ln1/ln2 mean and rstd, attention lse
  return static_cast<double>(compute * E + stats * 4);
}

}  // namespace

std::string layout_error(const model::GptConfig& cfg, int seq_len, const Layout& l) {
  try {
    cfg.validate();
    MESHTRAIN_CONFIG_CHECK(l.dp >= 1 && l.pp >= 1 && l.tp >= 1, "mesh.dp/pp/tp = ", l.dp, "/",
                           l.pp, "/", l.tp, " must be positive");
    MESHTRAIN_CONFIG_CHECK(l.zero_stage >= 0 && l.zero_stage <= 3, "zero.stage=", l.zero_stage,
                           " must be 0, 1, 2 or 3");
    MESHTRAIN_CONFIG_CHECK(l.micro_batch >= 1, "train.micro_batch=", l.micro_batch,
                           " must be positive");
    MESHTRAIN_CONFIG_CHECK(seq_len >= 1 && seq_len <= cfg.block_size, "train.seq_len=", seq_len,
                           " must be in [1, model.block_size=", cfg.block_size, "]");
    MESHTRAIN_CONFIG_CHECK(
        !(l.sequence_parallel && l.tp > 1) ||
            (static_cast<long>(l.micro_batch) * seq_len) % l.tp == 0,
        "tp.sequence_parallel: micro_batch x seq_len must be divisible by mesh.tp=", l.tp);
    parallel::validate(l.schedule_spec(), cfg.n_layer);
    // The registry checks tp against heads, widths and the padded vocabulary.
    detail::cached_registry(cfg, seq_len, l, 0);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return {};
}

std::vector<MemoryBreakdown> memory_per_stage(const model::GptConfig& cfg, int seq_len,
                                              const Layout& l, const MemoryTarget& t) {
  const std::string err = layout_error(cfg, seq_len, l);
  if (!err.empty()) throw ConfigError(err);
  const auto spec = l.schedule_spec();
  const auto& pieces = detail::cached_pieces(cfg, seq_len, l);
  const std::size_t E = compute_bytes(l.precision);
  const std::size_t P = l.tp, B = l.micro_batch, T = seq_len, C = cfg.n_embd;
  const std::size_t N = B * T;
  const bool sp = l.sequence_parallel && P > 1;
  const std::size_t Nl = sp ? N / P : N;
  const std::size_t NHl = cfg.n_head / P, Vl = cfg.padded_vocab() / P;
  const bool par = l.parallel_path();

  std::vector<MemoryBreakdown> out;
  for (int s = 0; s < l.pp; ++s) {
    MemoryBreakdown m;
    m.stage = s;
    const auto chunks = parallel::stage_chunks(pieces, l.pp, s);
    const bool embed = s == 0, head = s == l.pp - 1;
    const model::ParameterRegistry& reg = detail::cached_registry(cfg, seq_len, l, s);
    const std::size_t n = reg.size();
    m.registry_elems = n;
    for (const auto& p : reg.params()) m.psi += static_cast<double>(p.numel);

    // ---- model states: GradSync's partition and ShardedAdamW (or AdamW on one rank) ----
    const auto buckets = parallel::plan_buckets(reg.units(), E, l.bucket_bytes, l.zero_stage == 3);
    std::vector<parallel::FlatRange> groups;
    for (const auto& b : buckets) groups.push_back(b.range);
    const parallel::ZeroPartition part(groups, l.dp);
    const std::size_t shard = part.shard_size();
    m.params = static_cast<double>((l.zero_stage < 3 ? n : shard) * E);
    m.grads = static_cast<double>((l.zero_stage < 2 ? n : shard) * E);
    if (!par) {  // optim::AdamWT over the registry: m, v (and the fp32 master for 16-bit)
      m.optimizer = static_cast<double>(n * 4 * (E == 4 ? 2 : 3));
    } else {
      const std::size_t S =
          l.zero_stage >= 1 ? shard : parallel::ZeroPartition(n, 1).shard_size();
      const bool master = E != 4 || l.offload;
      if (l.offload) {
        m.host_optimizer = static_cast<double>(S * 4 * 3);
        m.host_other += static_cast<double>(S * E * (E == 4 ? 1 : 2));  // grads down, copy up
      } else {
        m.optimizer = static_cast<double>(S * 4 * (master ? 3 : 2));
      }
    }

    // ---- activations: GptT's slots ----
    m.slots = l.pp == 1 ? 1 : parallel::slots_needed(spec, s);
    const std::vector<int> chunk_slots =
        l.pp == 1 ? std::vector<int>(chunks.size(), 1) : parallel::chunk_slots_needed(spec, s);
    const double block = block_activation_bytes(B, T, N, Nl, C, NHl, P, E);
    if (l.recompute) m.activations += block;  // one shared set, recomputed per block
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      const bool c_embed = c == 0 && embed, c_head = c + 1 == chunks.size() && head;
      const std::size_t nblocks = static_cast<std::size_t>(chunks[c].last - chunks[c].first);
      double per_slot = static_cast<double>(Nl * C * E);            // chunk input
      if (c_embed) per_slot += static_cast<double>(N * 4);          // tokens
      per_slot += static_cast<double>(nblocks * Nl * C * E);        // block outputs
      if (!l.recompute) per_slot += nblocks * block;                // saved tensors
      if (c_head) per_slot += static_cast<double>(Nl * C * E);      // d(last block output)
      m.activations += per_slot * chunk_slots[c];
    }

    // ---- head, backward and tp scratch (GptT's constructor) ----
    if (head) {
      m.head = static_cast<double>(N * C * E + 2 * Nl * 4 + N * Vl * E + N * 4 + N * 4);
      if (P > 1) m.head += static_cast<double>(N * 4 + 2 * N * 4);  // vocab-parallel CE
    }
    // dres, dln, dqkv, datty, dfch (the GELU derivative is a GEMM epilogue: no separate
    // gradient of the GELU output)
    m.scratch = static_cast<double>(
        (Nl * C + N * C + N * 3 * C / P + N * C / P + N * 4 * C / P) * E);
    // row-parallel partial sums and their reduced local rows (before the residual add)
    if (P > 1) m.scratch += static_cast<double>((N * C + Nl * C) * E);
    if (sp) m.scratch += static_cast<double>((Nl * C + N * C + Nl * C + 2 * C) * E);

    // ---- communication buffers ----
    if (par && l.zero_stage >= 2) {
      const auto pools = detail::replay_zero_pools(reg, buckets, part, l.dp, l.zero_stage, spec,
                                                   s, chunks);
      m.comm_buffers += static_cast<double>((pools.grad_elems + pools.param_elems) * E);
    }
    if (par && (l.zero_stage == 1 || l.zero_stage == 2) && l.dp > 1) {
      std::size_t max_piece = 0;
      for (const auto& g : part.groups()) max_piece = std::max(max_piece, g.piece);
      m.comm_buffers += static_cast<double>(max_piece * (1 + l.dp) * E);  // gather staging
    }
    if (l.pp > 1)
      m.comm_buffers +=
          static_cast<double>(detail::replay_pipeline_buffers(spec, s) * Nl * C * E);

    // ---- workspace: batches, kernel scratch, scalars ----
    const std::size_t batches = 2 * N * 4 * (l.pp > 1 && par ? 1 + l.n_micro : 1);
    m.workspace = static_cast<double>(batches);
    if (!t.device_is_host) m.host_other += static_cast<double>(2 * N * 4);  // host mirrors
    if (t.device_is_host) {
      m.workspace += static_cast<double>(2 * kAttentionBlock * T * E);  // backward score blocks
    } else {
      // cuBLASLt (kernels/gemm_lt.cpp): its workspace and the bias-gradient scratch of the
      // widest linear; the CUDA LayerNorm backward's per-block partial sums (at most
      // kLayerNormBlocks blocks, kernels/layernorm_cuda.cpp).
      const std::size_t oc = std::max(C, 4 * C / P);
      m.workspace += static_cast<double>(kCublasLtWorkspace + oc * E);
      m.workspace += static_cast<double>(kLayerNormBlocks * 2 * C * 4);
      // embedding backward (16-bit and fp32 models): sort keys and per-piece fp32 partials
      if (embed) m.workspace += static_cast<double>(N * 8 + N * C * 4);
    }
    // Loss sum and the optimizer's norm, sum of squares and clip scale: rank-0 Views, which
    // Kokkos allocates in 8 bytes.
    m.workspace += 4 * 8;
    m.runtime = t.runtime_bytes;
    out.push_back(m);
  }
  return out;
}

MemoryBreakdown peak_memory(const model::GptConfig& cfg, int seq_len, const Layout& l,
                            const MemoryTarget& t) {
  const auto all = memory_per_stage(cfg, seq_len, l, t);
  MemoryBreakdown best = all.front();
  for (const auto& m : all)
    if (m.device() > best.device()) best = m;
  return best;
}

std::string format_bytes(double b) {
  char buf[32];
  if (b >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  return buf;
}

}  // namespace meshtrain::plan
