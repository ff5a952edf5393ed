// Memory per rank (memory.hpp): the sum of what each owner of memory states it allocates,
// beside its constructor — the model (model_footprint), ZeRO's shards (zero_shard_bytes,
// zero_staging_bytes), DpPolicy's pools and the pipeline's message pool (replayed:
// pools.hpp), the optimizer (sharded_adamw_footprint), the kernels' scratch
// (kernels::scratch_bytes), the engine's batch buffers and its checkpoint staging
// (parallel::ownership). Nothing here restates a size.
#include "meshtrain/plan/memory.hpp"

#include <algorithm>
#include <cstdio>

#include "meshtrain/core/error.hpp"
#include "meshtrain/kernels/workspace.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/model/registry.hpp"
#include "meshtrain/optim/sharded_adamw.hpp"
#include "meshtrain/parallel/checkpoint_staging.hpp"
#include "meshtrain/parallel/dp_policy.hpp"
#include "meshtrain/parallel/message_flow.hpp"
#include "meshtrain/parallel/partition.hpp"
#include "meshtrain/parallel/pipeline_runner.hpp"
#include "meshtrain/parallel/zero_partition.hpp"
#include "meshtrain/parallel/zero_shards.hpp"
#include "pools.hpp"
#include "stage_cache.hpp"

namespace meshtrain::plan {

std::string layout_error(const model::GptConfig& cfg, int seq_len, const Layout& l) {
  try {
    cfg.validate();
    MESHTRAIN_CONFIG_CHECK(l.dp >= 1 && l.pp >= 1 && l.tp >= 1, "mesh.dp/pp/tp = ", l.dp, "/",
                           l.pp, "/", l.tp, " must be positive");
    MESHTRAIN_CONFIG_CHECK(l.zero_stage >= 0 && l.zero_stage <= 3, "zero.stage=", l.zero_stage,
                           " must be 0, 1, 2 or 3");
    MESHTRAIN_CONFIG_CHECK(l.ep >= 1 && l.dp % l.ep == 0, "mesh.ep=", l.ep,
                           " must divide mesh.dp=", l.dp);
    MESHTRAIN_CONFIG_CHECK(l.ep == 1 || (cfg.moe.enabled() && cfg.moe.experts % l.ep == 0),
                           "mesh.ep=", l.ep, " needs moe.experts divisible by it");
    MESHTRAIN_CONFIG_CHECK(l.micro_batch >= 1, "train.micro_batch=", l.micro_batch,
                           " must be positive");
    MESHTRAIN_CONFIG_CHECK(seq_len >= 1 && seq_len <= cfg.block_size, "train.seq_len=", seq_len,
                           " must be in [1, model.block_size=", cfg.block_size, "]");
    MESHTRAIN_CONFIG_CHECK(l.cp >= 1 && (l.cp == 1 || seq_len % (2 * l.cp) == 0),
                           "train.seq_len=", seq_len, " must be divisible by 2 x mesh.cp = ",
                           2 * l.cp);
    MESHTRAIN_CONFIG_CHECK(
        !(l.sequence_parallel && l.tp > 1) ||
            (static_cast<long>(l.micro_batch) * (seq_len / l.cp)) % l.tp == 0,
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
  // A rank holds seq_len / cp rows of each sequence (context parallelism).
  const int Tl = seq_len / l.cp;
  const std::size_t P = l.tp, N = static_cast<std::size_t>(l.micro_batch) * Tl;
  const std::size_t C = cfg.n_embd;
  const bool sp = l.sequence_parallel && P > 1;
  const std::size_t Nl = sp ? N / P : N;

  std::vector<MemoryBreakdown> out;
  for (int s = 0; s < l.pp; ++s) {
    MemoryBreakdown m;
    m.stage = s;
    // The model layout ParallelContext gives this stage (tp is a size here, not a group).
    model::ModelLayout ml = parallel::pipeline_layout(spec, pieces, s);
    ml.sequence_parallel = sp;
    ml.recompute = l.recompute;
    ml.recompute_mlp_act = l.recompute_mlp_act;
    ml.head_chunk_rows = l.head_chunk_tokens;
    ml.fp8.enabled = l.fp8;  // the FP8 casts' workspace (model_footprint's scratch)
    ml.fp8.scaling = l.fp8_rowwise ? kernels::Fp8Scaling::rowwise : kernels::Fp8Scaling::tensorwise;
    ml.fp8.wgrad_bf16 = l.fp8_wgrad_bf16;
    ml.fp8.first_last_bf16 = l.fp8_first_last_bf16;
    ml.fp8.experts = l.fp8_experts;
    if (l.pp == 1) {  // micro-batches run one after another
      ml.n_slots = 1;
      ml.chunk_slots.clear();
    }
    const model::ParameterRegistry& reg = detail::cached_registry(cfg, seq_len, l, s);
    const std::size_t n = reg.size();
    m.registry_elems = n;
    for (const auto& p : reg.params()) m.psi += static_cast<double>(p.numel);
    m.slots = ml.n_slots;

    // ---- model states: the model's flat buffers or ZeRO's shards, and the optimizer ----
    parallel::DpOptions dopt;
    dopt.zero_stage = l.zero_stage;
    dopt.bucket_bytes = l.bucket_bytes;
    // Gradients reduce, and ZeRO shards, over the replicas: dp x cp ranks.
    const parallel::DpLayout dpl = parallel::make_dp_layout(reg, E, dopt, l.dp * l.cp, l.ep);
    const parallel::ZeroPartition& part = dpl.partition;
    // The model allocates what ZeRO does not shard (model::ModelLayout's allocate_*).
    const parallel::ShardBytes shards = parallel::zero_shard_bytes(part, l.zero_stage, E);
    m.params = static_cast<double>(l.zero_stage < 3 ? n * E : shards.params);
    m.grads = static_cast<double>(l.zero_stage < 2 ? n * E : shards.grads);
    const parallel::ZeroPartition whole(n, 1);
    const parallel::ZeroPartition& opart = l.zero_stage >= 1 ? part : whole;
    const int orank = 0;  // every rank's shard has the same size; its range count is rank 0's
    const auto of = optim::sharded_adamw_footprint(
        opart.shard_size(),
        parallel::shard_ranges(reg, opart, orank, l.zero_stage >= 1 || l.ep == 1).size(),
        l.offload ? optim::StatePlacement::host : optim::StatePlacement::device, E);
    m.optimizer = static_cast<double>(of.device_state);
    m.host_optimizer = static_cast<double>(of.host_state);
    m.host_other += static_cast<double>(of.host_staging);
    // Asynchronous checkpoints stage the rank's partition (dp rank 0's size; the others differ
    // by at most one element per range).
    if (l.ckpt_async) {
      parallel::OwnershipInputs in;
      in.n = n;
      in.zero_stage = l.zero_stage;
      in.shard_size = opart.shard_size();
      in.replicas = {0, l.dp};
      in.ep = l.ep;
      in.expert_replicas = {0, l.dp / l.ep};
      m.host_ckpt =
          static_cast<double>(parallel::checkpoint_staging_bytes(parallel::ownership(in)));
    }

    // ---- the model's activations, head and scratch ----
    ml.cp_comm = l.cp_all_gather ? model::CpComm::all_gather : model::CpComm::ring;
    const model::ModelFootprint mf = model::model_footprint(cfg, l.micro_batch, Tl, ml, l.tp, E,
                                                            l.cp);
    m.activations = mf.activations;
    m.head = mf.head;
    m.scratch = mf.scratch;

    // ---- communication buffers: DpPolicy's pools, ZeRO 1/2 staging, pipeline messages ----
    const auto pools = detail::replay_zero_pools(reg, dpl.plan, spec, s, ml.chunks);
    m.comm_buffers += static_cast<double>((pools.grad_elems + pools.param_elems) * E);
    m.comm_buffers += static_cast<double>(parallel::zero_staging_bytes(part, l.zero_stage, E));
    if (l.pp > 1)
      m.comm_buffers +=
          static_cast<double>(parallel::predicted_message_buffers(
                                  spec, s, parallel::post_policy_for(!t.device_is_host)) *
                              Nl * C * E);

    // ---- workspace: the step's data, the kernels' scratch, the optimizer's scalars ----
    // parallel::StepBatches: the targets on the stage that holds the head (the tokens' slots
    // are the embedding chunk's activations); on the host what the data layer writes into.
    const bool embeds = s == 0, heads = s == l.pp - 1;
    m.workspace = heads ? static_cast<double>(N * 4) : 0.0;
    double host_batch = 0;
    if (l.cp > 1)  // whole sequences and this rank's rows of the parts read
      host_batch = static_cast<double>(2 * N * 4 * l.cp + ((embeds ? 1 : 0) + (heads ? 1 : 0)) * N * 4);
    else if (embeds || heads)  // the mirrors (the device buffers in a host build), the unread part
      host_batch = static_cast<double>(((t.device_is_host ? 0 : (embeds ? 1 : 0) + (heads ? 1 : 0)) +
                                        (embeds && heads ? 0 : 1)) * N * 4);
    (t.device_is_host ? m.workspace : m.host_other) += host_batch;
    kernels::ScratchShape ks;
    ks.rows = N;
    ks.seq_len = static_cast<std::size_t>(Tl);
    ks.channels = C;
    ks.widest_out = std::max(C, 4 * C / P);
    ks.embeds = s == 0;
    const int hs = cfg.head_size();
    ks.cudnn_attention = t.cudnn_attention && !t.device_is_host && E == 2 && (hs == 64 || hs == 128);
    ks.deterministic_attention = t.deterministic_attention;
    ks.batch = static_cast<std::size_t>(l.micro_batch);
    ks.heads = static_cast<std::size_t>(cfg.n_head) / P;
    ks.head_dim = static_cast<std::size_t>(hs);
    ks.attention_blocks = l.cp > 1;
    ks.kv_heads = std::max<std::size_t>(1, static_cast<std::size_t>(cfg.kv_heads()) / P);
    m.workspace += static_cast<double>(kernels::scratch_bytes(ks, E, t.device_is_host));
    m.workspace += static_cast<double>(of.device_other);
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
