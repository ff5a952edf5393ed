// The engine: construction (the parallelisms applied in turn), initialisation, the step and
// evaluation. Checkpoints are in engine_checkpoint.cpp, the MoE routers' figures and expert
// biases in engine_moe.cpp.
#include "meshtrain/parallel/engine.hpp"

#include <algorithm>
#include <cmath>

#include "meshtrain/core/profile.hpp"
#include "meshtrain/comm/flight_recorder.hpp"
#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/core/signals.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/io/hf_import.hpp"
#include "meshtrain/parallel/grad_sync.hpp"
#include "meshtrain/parallel/loss_holder.hpp"
#include "meshtrain/parallel/model_transfer.hpp"
#include "meshtrain/parallel/pipeline_runner.hpp"
#include "meshtrain/parallel/zero_optimizer.hpp"

namespace meshtrain::parallel {

template <class T>
Engine<T>::Engine(MPI_Comm world, const model::GptConfig& cfg, const EngineOptions& opt,
                  ExecSpace exec)
    : cfg_(cfg), opt_(opt) {
  MESHTRAIN_CONFIG_CHECK(opt_.micro_batch > 0, "train.micro_batch=", opt_.micro_batch,
                         " must be positive");
  MESHTRAIN_CONFIG_CHECK(opt_.n_micro > 0, "train.grad_accum=", opt_.n_micro,
                         " must be positive");
  // The attention kernels read their backend choice process-wide (one engine per process).
  kernels::set_attention_options(opt_.attention);
  // Mixture of Experts: experts split over mesh.ep (carved out of dp), in every precision (the
  // router in fp32 or fp64, the expert rows in T: model/moe_block.cpp).
  const int ep = opt_.parallel.shape.ep;
  MESHTRAIN_CONFIG_CHECK(ep == 1 || cfg_.moe.enabled(), "mesh.ep=", ep,
                         " needs a Mixture-of-Experts model (moe.experts > 0)");
  MESHTRAIN_CONFIG_CHECK(!cfg_.moe.enabled() || cfg_.moe.experts % ep == 0, "moe.experts=",
                         cfg_.moe.experts, " is not divisible by mesh.ep=", ep);
  // 1. the mesh and its groups, the schedule and the pipeline pieces
  ctx_ = std::make_unique<ParallelContext>(world, opt_.parallel, cfg_, opt_.seq_len, opt_.n_micro);
  // 2. this rank's slice of the model: its stage's chunks, split over tp inside the model
  model::ModelLayout layout = ctx_->layout(opt_.recompute);
  layout.recompute_mlp_act = opt_.recompute_mlp_act;
  layout.fp8 = opt_.fp8;
  layout.head_chunk_rows = opt_.head_chunk_tokens;
  // (with context parallelism the model holds seq_len / cp rows of each sequence)
  model_ = std::make_unique<model::GptT<T>>(cfg_, opt_.micro_batch, local_seq_len(), layout, exec);
  // 3. data parallelism and ZeRO as the model's hooks
  // over the ranks holding the same parameters, dp x cp (MoE experts over those holding the
  // same experts, expert-dp x cp)
  sync_ = std::make_unique<GradSync<T>>(model_buffers(*model_), ctx_->replicas(), opt_.parallel.dp,
                                        exec, ctx_->ep_size() > 1 ? &ctx_->expert_replicas() : nullptr,
                                        &ctx_->ep());
  model_->set_hooks(sync_.get());
  // The runner drives the hooks without a call between micro-batches: ZeRO 0/1 reduce a bucket
  // once its units have completed every micro-batch's backward.
  sync_->set_micro_batches(opt_.n_micro);
  // A tied head: the last stage's copy of the embedding and the first stage's are one
  // parameter, summed over the embedding group (an untied head has no copy).
  if (ctx_->config().shape.pp > 1 && cfg_.tied_head)
    sync_->set_embedding_group(ctx_->embedding());
  // 4. the optimizer over what ZeRO leaves this rank
  zopt_ = std::make_unique<ZeroOptimizer<T>>(*sync_, opt_.adamw, &ctx_->model_parallel(), exec);
  // 5. the schedule's executor
  runner_ = std::make_unique<PipelineRunner<T>>(*model_, ctx_->pp(), ctx_->schedule(),
                                                ctx_->stage());
  // 6. the step's data: the part of each micro-batch this stage reads, uploaded once (the
  // tokens where it embeds, one slot per activation slot of that chunk; the targets where it
  // holds the head), under context parallelism this rank's rows of each sequence
  StepBatches::Shape data;
  data.micro_batch = opt_.micro_batch;
  data.seq_len = opt_.seq_len;
  if (local_seq_len() != opt_.seq_len) data.positions = model_->layout().positions;
  data.tokens = model_->layout().has_embedding;
  data.targets = model_->layout().has_head;
  data.token_slots = chunk_slots_needed(ctx_->schedule(), ctx_->stage()).front();
  batches_ = std::make_unique<StepBatches>(data, model_->exec());
}

template <class T>
Engine<T>::~Engine() {
  if (model_) model_->set_hooks(nullptr);
}

// ---- initialisation ----

template <class T>
void Engine<T>::init_parameters(std::uint64_t seed) {
  // ZeRO-3 keeps no full parameter buffer: initialise a temporary one and scatter it.
  View1<T> full = model_->params();
  if (full.span() == 0) full = zeros<T>("init.params", model_->registry().size());
  model_->init_parameters_into(seed, full);
  sync_->scatter_params(full);
  zopt_->init_master();
}

template <class T>
void Engine<T>::import_hf(const std::string& dir) {
  // Each rank reads its own stage's tp slices (io/hf_import.hpp); ranks read different tensors,
  // so a failure on one is agreed before the scatter's collectives.
  View1<T> full = model_->params();
  if (full.span() == 0) full = zeros<T>("init.params", model_->registry().size());
  meshtrain::agree(ctx_->mesh().world().get(), cat("model.init_from '", dir, "'"),
        [&] { io::import_hf_slices(model_->registry(), dir, full); });
  sync_->scatter_params(full);
  zopt_->init_master();
}

template <class T>
void Engine<T>::parameters_ready() {
  MESHTRAIN_CHECK(model_->params().span() > 0,
                  "Engine::parameters_ready: ZeRO-3 holds no full parameter buffer to write into; "
                  "use init_parameters or import_hf");
  zopt_->init_master();
}

// ---- the step ----

template <class T>
StepComm Engine<T>::forward_backward(const BatchSource& batch, float grad_scale) {
  model_->reset_loss_sum();
  model_->reset_moe_stats();
  sync_->reset_stats();
  sync_->begin_step();
  const double tp0 = model_->tp_comm_seconds();
  // Micro-batch m of dp rank r is sequences [(m dp + r) B, ...) of the global batch, a function
  // of (seed, step) only (invariant 3): the m-th micro-batches of all dp ranks together are the
  // global batch's m-th block of dp B sequences whatever dp is (the MoE router's balancing group
  // under moe.aux_loss_scope=global). The first stage reads its tokens, the last its targets.
  const int dp = ctx_->dp_size(), r = ctx_->dp_rank(), B = opt_.micro_batch;
  batches_->begin(batch, [=](int micro) { return (micro * dp + r) * B; });
  const auto st = runner_->step([&](int micro) { return batches_->get(micro); }, grad_scale);
  batches_->end();
  // Waits for the buckets; with pp > 1 also sums the tied wte gradient of the first and last
  // stage over the embedding group, which keeps the two copies identical after the update.
  sync_->finish();
  StepComm c;
  const auto& pc = ctx_->config();
  c.pipelined = pc.shape.pp > 1;
  c.reported = ctx_->mesh().size() > 1 || pc.dp.zero_stage > 0 || pc.dp.offload;
  c.bubble = st.bubble();
  const auto gs = sync_->grad_stats();
  c.dp_comm_ms = gs.total_seconds * 1e3;
  c.dp_hidden = gs.hidden_fraction();
  c.tp_comm_ms = (model_->tp_comm_seconds() - tp0) * 1e3;
  return c;
}

template <class T>
bool Engine<T>::optimizer_step(std::int64_t step, float loss_scale, bool check_finite) {
  const prof::Range r("optimizer");
  const bool applied = zopt_->step(step, loss_scale, check_finite);
  // A skipped step (non-finite gradients) leaves the routing state as it leaves the weights.
  if (applied) update_expert_bias();
  return applied;
}

template <class T>
double Engine<T>::loss_over_world(LossBatches batches) {
  float loss_sum = 0;
  Kokkos::deep_copy(loss_sum, model_->loss_sum());
  double total = holds_loss(ctx_->mesh().coord(), ctx_->config().shape.pp, batches) ? loss_sum
                                                                                    : 0.0;
  world_all_reduce(&total, 1, MPI_DOUBLE, MPI_SUM);
  return total;
}

template <class T>
float Engine<T>::global_loss_sum() {
  return static_cast<float>(loss_over_world(LossBatches::per_dp_rank));
}

template <class T>
float Engine<T>::grad_norm() const {
  float norm = 0;
  Kokkos::deep_copy(norm, zopt_->grad_norm());
  return norm;
}

template <class T>
float Engine<T>::evaluate(const BatchSource& batch, int batches) {
  model_->reset_loss_sum();
  // The forward-only schedule from the step's builder, executed by the step's runner (its
  // messages, slots and buffers): each micro-batch through the virtual stages in order, so the
  // last stage adds the losses in the order one rank does. Every dp rank evaluates the same
  // batches.
  const int B = opt_.micro_batch;
  batches_->begin(batch, [=](int b) { return b * B; });
  if (batches > 0) runner_->forward_only(batches, [&](int b) { return batches_->get(b); });
  batches_->end();
  const double total = loss_over_world(LossBatches::same_on_dp);
  const std::size_t per_batch = static_cast<std::size_t>(opt_.micro_batch) * opt_.seq_len;
  return static_cast<float>(total) / static_cast<float>(per_batch * batches);
}

template <class T>
void Engine<T>::fence() const {
  model_->exec().fence();
}

// ---- the whole model ----

template <class T>
View1<const T> Engine<T>::full_parameters(View1<T> out) {
  if (model_->params().span() > 0) return model_->params();
  sync_->gather_params(out);
  return out;
}

template <class T>
std::unique_ptr<model::Gpt> Engine<T>::gather_to_rank0() {
  View1<T> tmp;
  if (model_->params().span() == 0) tmp = alloc<T>("export.params", model_->registry().size());
  return parallel::gather_to_rank0(*ctx_, *model_, full_parameters(tmp));
}

// ---- agreement and facts ----

template <class T>
void Engine<T>::world_all_reduce(void* buf, int count, MPI_Datatype type, MPI_Op op) const {
  const MPI_Comm world = ctx_->mesh().world().get();
  if (!host_recorder_) host_recorder_ = std::make_unique<comm::FlightRecorder>(world, "world.host");
  int size = 0;
  MESHTRAIN_MPI_CHECK(MPI_Type_size(type, &size));
  const prof::Range r([&] {
    return cat("all_reduce world.host ", prof::bytes_label(static_cast<std::size_t>(count) * size));
  });
  const std::uint64_t seq = host_recorder_->begin(
      comm::OpKind::all_reduce, static_cast<std::size_t>(count) * static_cast<std::size_t>(size),
      -1);
  MESHTRAIN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, count, type, op, world));
  host_recorder_->complete(seq);
}

template <class T>
bool Engine<T>::any_rank(bool flag) const {
  int any = flag ? 1 : 0;
  max_over_ranks(&any, 1);
  return any != 0;
}

template <class T>
void Engine<T>::max_over_ranks(int* flags, int n) const {
  world_all_reduce(flags, n, MPI_INT, MPI_MAX);
}

template <class T>
bool Engine<T>::loss_finite_here() const {
  float loss_sum = 0;
  Kokkos::deep_copy(loss_sum, model_->loss_sum());
  return std::isfinite(loss_sum);
}

template <class T>
int Engine<T>::world_size() const {
  return ctx_->mesh().size();
}
template <class T>
int Engine<T>::world_rank() const {
  return ctx_->mesh().rank();
}
template <class T>
int Engine<T>::global_batch() const {
  return opt_.micro_batch * opt_.n_micro * ctx_->dp_size();
}
template <class T>
std::int64_t Engine<T>::tokens_per_step() const {
  return static_cast<std::int64_t>(global_batch()) * opt_.seq_len;
}
template <class T>
std::string Engine<T>::describe() const {
  return ctx_->describe();
}
template <class T>
std::string Engine<T>::advice() const {
  return layout_advice(ctx_->config(), opt_.n_micro);
}

template class Engine<float>;
#if MESHTRAIN_HAVE_BF16
template class Engine<bf16>;
template class Engine<fp16>;
#endif

}  // namespace meshtrain::parallel
