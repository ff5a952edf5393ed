#pragma once
// Everything a rank needs to train under a (dp, cp, pp, tp) layout: the process mesh, one
// communicator per group of axes it builds (rank_math.hpp; groups spanning the same ranks share
// one), the embedding group for the tied wte, the pipeline schedule and partition, the ZeRO
// options, and the model layout this rank holds. Built once per run, collectively over the
// world.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/mesh/process_mesh.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/parallel/dp_options.hpp"
#include "meshtrain/parallel/partition.hpp"
#include "meshtrain/parallel/schedule.hpp"

namespace meshtrain::parallel {

struct ParallelConfig {
  mesh::Shape shape;
  mesh::Order order;
  comm::Backend backend = comm::default_backend();  // NCCL for device memory when built
  bool sequence_parallel = false;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int virtual_chunks = 1;
  std::string layers;  // explicit split (pp.layers), empty: balanced
  DpOptions dp;
  model::CpComm cp_comm = model::CpComm::ring;  // cp.comm: how attention crosses mesh.cp
};

class ParallelContext {
 public:
  // Collective over `world`. n_micro: micro-batches per step on each dp rank. Throws
  // ConfigError (identically on every rank) for layouts the model or schedule cannot take.
  ParallelContext(MPI_Comm world, const ParallelConfig& cfg, const model::GptConfig& model,
                  int seq_len, int n_micro);
  ~ParallelContext();

  const ParallelConfig& config() const { return cfg_; }
  const mesh::ProcessMesh& mesh() const { return *mesh_; }
  const ScheduleSpec& schedule() const { return spec_; }
  const std::vector<LayerRange>& pieces() const { return pieces_; }
  int dp_rank() const { return mesh_->coord().dp; }
  int dp_size() const { return mesh_->shape().dp; }
  int stage() const { return mesh_->coord().pp; }
  int cp_rank() const { return mesh_->coord().cp; }
  int cp_size() const { return mesh_->shape().cp; }
  int tp_rank() const { return mesh_->coord().tp; }
  bool first_stage() const { return mesh_->is_first_stage(); }
  bool last_stage() const { return mesh_->is_last_stage(); }

  comm::Communicator& world() const { return *world_; }
  // The communicator of the group spanned by the named axes (ProcessMesh::group).
  comm::Communicator& group(const std::vector<std::string>& names) const;
  comm::Communicator& tp() const { return group({"tp"}); }
  comm::Communicator& cp() const { return group({"cp"}); }
  comm::Communicator& dp() const { return group({"dp"}); }
  comm::Communicator& pp() const { return group({"pp"}); }
  comm::Communicator& model_parallel() const { return group({"tp", "pp"}); }
  comm::Communicator* embedding() const { return emb_.get(); }  // null when pp = 1 or a middle stage
  // The ranks holding the same dense parameters (dp x cp): they reduce their gradients, share
  // ZeRO's shards and split the checkpoint's writes. With cp = 1, the dp group.
  comm::Communicator& replicas() const { return group({"dp", "cp"}); }
  // Expert parallelism (mesh.ep, carved out of dp): the group whose ranks hold all experts
  // between them, the expert-data-parallel group (the same experts; dp itself when ep = 1), and
  // the ranks holding the same experts (edp x cp).
  comm::Communicator& ep() const { return group({"ep"}); }
  comm::Communicator& expert_dp() const { return group({"edp"}); }
  comm::Communicator& expert_replicas() const { return group({"edp", "cp"}); }
  int ep_size() const { return mesh_->shape().ep; }
  int ep_rank() const { return mesh_->ep_rank(); }

  // The model layout of this rank (chunks, embedding/head, slots, tp); recompute as given.
  model::ModelLayout layout(bool recompute) const;
  // One line for the banner: "dp 2 x pp 2 (1f1b, 4 micro-batches, blocks [0,2) [2,4)) x tp 2 ...".
  std::string describe() const;

 private:
  ParallelConfig cfg_;
  int seq_len_ = 0;
  std::unique_ptr<mesh::ProcessMesh> mesh_;
  ScheduleSpec spec_;
  std::vector<LayerRange> pieces_;
  std::unique_ptr<comm::Communicator> world_, emb_;
  std::map<MPI_Comm, std::unique_ptr<comm::Communicator>> groups_;  // by the mesh's communicator
};

// Which combinations of ZeRO and pipelining are allowed, and why (the configuration check):
// warnings for ZeRO-2/3 with pp > 1 (reduce-scatter per micro-batch and gathers per micro-batch
// multiply the dp traffic by n_micro); empty when there is nothing to say.
std::string layout_advice(const ParallelConfig& cfg, int n_micro);

}  // namespace meshtrain::parallel
