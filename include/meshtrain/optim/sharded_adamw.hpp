#pragma once
// AdamW over a shard of the flat parameter buffer (ZeRO stages 1-3; stage 0 is the shard that
// is the whole buffer), with the optimizer state either on the device or in host memory (CPU
// offload, ZeRO-Offload).
//
// The shard is a list of pieces, each a contiguous run of the model's flat buffer stored
// contiguously in the shard buffers (parallel/zero_partition.hpp). fp32 master weights, m and v
// are allocated for the shard only. The gradients and parameters the step reads and writes are
// either the model's full buffers (indexed by flat offset) or shard buffers (indexed by shard
// offset); `Index` says which.
//
// The step is split in two so that this layer needs no communicator: local_sumsq() is this
// rank's part of the squared global norm; the caller sums it over the groups that split the
// gradients (data-parallel when sharded, model-parallel always), then apply() clips and updates.
// The update arithmetic is the one of kernels::adamw_update, on the device or in a host loop.
#include <cstdint>
#include <vector>

#include "meshtrain/core/view.hpp"
#include "meshtrain/optim/adamw.hpp"

namespace meshtrain::optim {

// A contiguous run of the flat buffer stored contiguously in the shard.
struct ShardPiece {
  std::size_t flat = 0, shard = 0, length = 0;
};
// Parameter elements of one kind inside a piece.
struct ShardRange {
  std::size_t flat = 0, shard = 0, length = 0;
  bool decay = false;    // AdamW weight decay applies
  bool counted = true;   // counts in the global gradient norm on this rank
};

enum class Index { flat, shard };
// The fp32 state of the shard (checkpoints): master weights (only where has_master()), Adam's
// first and second moments.
enum class StateKind { master, exp_avg, exp_avg_sq };
enum class StatePlacement { device, host };

// What ShardedAdamWT allocates for a shard of `shard_size` elements with `n_ranges` ranges and
// compute elements of `elem_bytes`, predicted without building it (the planner): the fp32
// state (master where needed, m, v) on the device or the host, the host staging of the
// offloaded step, and the device tables and scalars of the step.
struct OptimizerFootprint {
  std::size_t device_state = 0, host_state = 0, host_staging = 0, device_other = 0;
};
OptimizerFootprint sharded_adamw_footprint(std::size_t shard_size, std::size_t n_ranges,
                                           StatePlacement placement, std::size_t elem_bytes);

template <class T>
class ShardedAdamWT {
 public:
  // host_threads: threads of the offloaded step (0: the hardware's on GPU builds, whose host
  // cores are otherwise idle; 1 on host builds, whose cores run the model).
  ShardedAdamWT(std::vector<ShardPiece> pieces, std::vector<ShardRange> ranges,
                std::size_t shard_size, const AdamWConfig& cfg, StatePlacement placement,
                ExecSpace exec = ExecSpace{}, int host_threads = 0);

  // Whether the step keeps its own fp32 master weights: for 16-bit T, and with offload (the
  // host cannot update device parameters). Otherwise the fp32 parameters are the master.
  bool has_master() const { return has_master_; }
  // master = float(params) over the shard. Call once after the parameters are initialised.
  void init_master(View1<const T> params, Index where);

  // This rank's sum of squares of the counted gradient elements (device scalar). With offload it
  // first copies the shard's gradients to the host, where apply() reads them.
  Scalar<float> local_sumsq(View1<const T> grads, Index where);
  // Clip with the reduced sum of squares (in the scalar local_sumsq returned, now reduced) and
  // update the shard; writes the updated parameters into `params`. As AdamWT::step otherwise.
  bool apply(View1<T> params, Index params_where, View1<const T> grads, Index grads_where,
             std::int64_t step, float loss_scale = 1.0f, bool check_finite = false);

  Scalar<float> grad_norm() const { return norm_; }
  const AdamWConfig& config() const { return cfg_; }
  StatePlacement placement() const { return placement_; }
  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  const std::vector<ShardRange>& ranges() const { return ranges_; }
  std::size_t shard_size() const { return shard_size_; }

  // Copies of one state buffer over the whole shard (shard order, shard_size() elements) to and
  // from host memory, wherever the state lives. Fences the instance.
  void get_state(StateKind which, HostView1<float> out) const;
  // Elements [shard_offset, shard_offset + out.extent(0)) of one state buffer (a checkpoint's
  // partition of it). Fences the instance.
  void get_state(StateKind which, std::size_t shard_offset, HostView1<float> out) const;
  void set_state(StateKind which, HostView1<const float> in);

  // Bytes actually allocated: fp32 master + m + v on the device or host, host staging buffers.
  struct Bytes {
    std::size_t device_state = 0, host_state = 0, host_staging = 0;
  };
  Bytes bytes() const;
  // Offload: seconds of the last step in gradients down (with the host sum of squares), the
  // host update, and parameters up.
  struct OffloadSeconds {
    double down = 0, update = 0, up = 0;
  };
  const OffloadSeconds& offload_seconds() const { return offload_s_; }
  int host_threads() const { return host_threads_; }
 private:
  static std::size_t at(const ShardRange& r, Index w) { return w == Index::flat ? r.flat : r.shard; }
  static std::size_t at(const ShardPiece& p, Index w) { return w == Index::flat ? p.flat : p.shard; }
  void apply_host(View1<T> params, Index params_where, const kernels::AdamWHyper& h);
  // Whether params and grads at these indices line up with the shard (ZeRO-0 on the whole
  // buffer, ZeRO-3 on shards), so that one launch updates every range.
  bool one_launch(Index params_where, Index grads_where) const;

  std::vector<ShardPiece> pieces_;
  std::vector<ShardRange> ranges_;
  std::size_t shard_size_;
  AdamWConfig cfg_;
  StatePlacement placement_;
  ExecSpace exec_;
  bool has_master_;
  View1<float> master_, m_, v_;           // device placement
  HostView1<float> hmaster_, hm_, hv_;    // host placement
  HostView1<T> hgrads_, hcopy_;           // host placement: gradients down, 16-bit copy up
  Scalar<float> sumsq_, norm_, scale_;
  View1<std::int64_t> range_begin_;  // device placement: first shard element of each range
  View1<float> range_decay_;
  std::size_t range_end_ = 0;        // end of the last range
  int host_threads_ = 1;
  OffloadSeconds offload_s_;
};

}  // namespace meshtrain::optim
