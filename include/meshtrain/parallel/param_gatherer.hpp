#pragma once
// ZeRO-3 parameter gathers (Rajbhandari et al. 2020, stage 3; FSDP's unit-by-unit gathers):
// carries out DpPolicy's parameter effects. A unit's parameters live only as shards; the policy
// asks for a unit to be all-gathered into a pool buffer, bound to the model, prefetched ahead
// of the walk and released behind it.
#include <cstddef>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/parallel/comm_stats.hpp"
#include "meshtrain/parallel/dp_policy.hpp"
#include "meshtrain/parallel/model_buffers.hpp"
#include "meshtrain/parallel/zero_shards.hpp"

namespace meshtrain::parallel {

template <class T>
class ParamGatherer final : public GatherEffects {
 public:
  ParamGatherer(const DpPlan& plan, ModelBuffers<T> model, ZeroShards<T>& shards,
                comm::Communicator& replicas);
  ~ParamGatherer() override;
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  bool test_gather(int u) override;
  void wait_gather(int u) override;
  void start_gather(int u, int buffer, std::size_t elems, bool grown) override;
  void bind_params(int u, int buffer) override;
  void unbind_params(int u) override;

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }
  // DpPolicy's param_pool() in bytes (what the planner predicts by replaying the policy).
  std::size_t pool_bytes() const;

 private:
  struct Op {
    comm::Request req;
    double t_launch = 0;
  };
  const DpPlan& plan_;
  ModelBuffers<T> model_;
  ZeroShards<T>& shards_;
  comm::Communicator& replicas_;
  Timer clock_;
  std::vector<Op> ops_;            // one per unit
  std::vector<View1<T>> pool_;     // by BufferPlan id
  std::vector<View1<T>> bound_;    // per unit: the gathered copy the model reads (empty: none)
  CommStats stats_;
};

}  // namespace meshtrain::parallel
