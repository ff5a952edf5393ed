#include "meshtrain/parallel/context.hpp"

#include "meshtrain/comm/factory.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/parallel/pipeline_runner.hpp"

namespace meshtrain::parallel {

ParallelContext::ParallelContext(MPI_Comm world, const ParallelConfig& cfg,
                                 const model::GptConfig& model, int seq_len, int n_micro)
    : cfg_(cfg) {
  MESHTRAIN_CONFIG_CHECK(cfg.dp.zero_stage >= 0 && cfg.dp.zero_stage <= 3, "zero.stage=",
                         cfg.dp.zero_stage, " must be 0, 1, 2 or 3");
  MESHTRAIN_CONFIG_CHECK(cfg.virtual_chunks >= 1, "pp.virtual_chunks=", cfg.virtual_chunks,
                         " must be positive");
  MESHTRAIN_CONFIG_CHECK(cfg.virtual_chunks == 1 || cfg.schedule == ScheduleKind::interleaved,
                         "pp.virtual_chunks=", cfg.virtual_chunks,
                         " needs pp.schedule=interleaved");
  mesh_ = std::make_unique<mesh::ProcessMesh>(world, cfg.shape, cfg.order);
  spec_.kind = cfg.shape.pp == 1 ? ScheduleKind::one_f_one_b : cfg.schedule;
  spec_.pp = cfg.shape.pp;
  spec_.n_micro = n_micro;
  spec_.chunks = cfg.virtual_chunks;
  validate(spec_, model.n_layer);
  pieces_ = partition(spec_, model, seq_len, cfg.layers);
  const comm::Backend b = cfg.backend;
  world_ = comm::make_group_communicator(b, mesh_->world().get());
  tp_ = comm::make_group_communicator(b, mesh_->tp().get());
  dp_ = comm::make_group_communicator(b, mesh_->dp().get());
  pp_ = comm::make_group_communicator(b, mesh_->pp().get());
  mp_ = comm::make_group_communicator(b, mesh_->model_parallel().get());
  if (cfg.shape.pp > 1 && mesh_->embedding().get() != MPI_COMM_NULL)
    emb_ = comm::make_group_communicator(b, mesh_->embedding().get());
  ep_ = comm::make_group_communicator(b, mesh_->ep().get());
  if (cfg.shape.ep > 1) edp_ = comm::make_group_communicator(b, mesh_->expert_dp().get());
}

ParallelContext::~ParallelContext() = default;

model::ModelLayout ParallelContext::layout(bool recompute) const {
  model::ModelLayout base;
  base.tp = cfg_.shape.tp > 1 ? tp_.get() : nullptr;
  base.sequence_parallel = cfg_.sequence_parallel && cfg_.shape.tp > 1;
  base.recompute = recompute;
  base.ep = ep_.get();
  base.batch_group = dp_.get();
  base.allocate_params = cfg_.dp.zero_stage < 3;
  base.allocate_grads = cfg_.dp.zero_stage < 2;
  model::ModelLayout l = pipeline_layout(spec_, pieces_, stage(), base);
  if (cfg_.shape.pp == 1) {  // micro-batches run one after another
    l.n_slots = 1;
    l.chunk_slots.clear();
  }
  return l;
}

std::string ParallelContext::describe() const {
  std::string s = cat("dp ", cfg_.shape.dp,
                      cfg_.shape.ep > 1 ? cat(" (ep ", cfg_.shape.ep, " x expert-dp ",
                                              cfg_.shape.dp / cfg_.shape.ep, ")")
                                        : std::string(),
                      " (ZeRO-", cfg_.dp.zero_stage,
                      cfg_.dp.offload ? ", optimizer offloaded to the CPU" : "", ") x pp ",
                      cfg_.shape.pp);
  if (cfg_.shape.pp > 1)
    s += cat(" (", schedule_name(spec_.kind), ", ", spec_.n_micro, " micro-batches",
             spec_.chunks > 1 ? cat(", ", spec_.chunks, " virtual chunks") : std::string(),
             ", blocks ", to_string(pieces_), ", analytic bubble ",
             static_cast<int>(100 * analytic_bubble(spec_) + 0.5), "%)");
  s += cat(" x tp ", cfg_.shape.tp,
           cfg_.sequence_parallel && cfg_.shape.tp > 1 ? " (sequence parallel)" : "",
           ", order ", cfg_.order.str());
  return s;
}

std::string layout_advice(const ParallelConfig& cfg, int n_micro) {
  if (cfg.shape.pp > 1 && cfg.dp.zero_stage >= 2 && cfg.shape.dp > 1)
    return cat("zero.stage=", cfg.dp.zero_stage, " with mesh.pp=", cfg.shape.pp,
               " reduce-scatters gradients", cfg.dp.zero_stage == 3 ? " and gathers parameters" : "",
               " for every one of the ", n_micro,
               " micro-batches: it works, but ZeRO-1 is what pipelines want (the seeds' "
               "guidance; Megatron and DeepSpeed pair PP with ZeRO-1)");
  return {};
}

}  // namespace meshtrain::parallel
