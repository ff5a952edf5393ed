#pragma once
// Memory per rank of a layout, from the same objects and formulas the training code allocates
// with, so that for meshtrain itself it is a prediction of what the allocator will see, not an
// estimate of a generic transformer:
//  - model states from the real ParameterRegistry of the rank's pipeline chunks and tp slice,
//    with DP buckets (parallel::plan_buckets) and ZeRO shards (parallel::ZeroPartition) as
//    GradSync builds them;
//  - activations per in-flight micro-batch: the views of GptT's constructor (BlockActivations,
//    chunk inputs and block outputs per slot, recompute's single shared set), times the slots
//    the schedule needs (parallel::slots_needed);
//  - head scratch (logits of the local vocabulary slice, LayerNorm, losses), backward and
//    tensor/sequence-parallel scratch;
//  - communication buffers: the bucket pools of ZeRO 2/3 and the ZeRO-3 gather pool (replaying
//    GradSync's acquire/release sequence), ZeRO 1/2 parameter staging, the pipeline runner's
//    message buffers (replaying its schedule);
//  - workspace of the kernels (attention score blocks on the host, column-sum partials on GPUs),
//    the trainer's batch buffers, and a runtime overhead (CUDA context, library workspaces) that
//    comes from the calibration;
//  - with asynchronous checkpoints, the host buffers a save is staged in
//    (parallel::ownership).
// Stages differ (embedding, head, tied wte copy); tp and dp ranks of one stage do not.
#include <cstddef>
#include <string>
#include <vector>

#include "meshtrain/model/config.hpp"
#include "meshtrain/plan/layout.hpp"

namespace meshtrain::plan {

struct MemoryTarget {
  bool device_is_host = true;  // CPU build: "device" memory is host memory (no mirrors)
  double runtime_bytes = 0;    // per rank: CUDA context, cuBLAS/NCCL workspaces (calibration)
  // GPU runs take cuDNN's fused attention where it applies (--attn.impl auto on a cuDNN build,
  // 16-bit, head size 64 or 128); its backward keeps a buffer the planner counts.
  bool cudnn_attention = false;
  bool deterministic_attention = false;
};

// Bytes per rank of one pipeline stage.
struct MemoryBreakdown {
  int stage = 0;
  double params = 0, grads = 0;      // compute-type buffers (full or ZeRO shards)
  double optimizer = 0;              // fp32 master (where kept) + Adam m, v on the device
  double activations = 0;            // kept for backward: slots x (chunk inputs, block outputs,
                                     // per-block saved tensors), tokens, head's d(input)
  double head = 0;                   // logits [N, V/tp], final LayerNorm, losses, targets
  double scratch = 0;                // backward, tensor- and sequence-parallel scratch
  double comm_buffers = 0;           // bucket / gather pools, staging, pipeline messages
  double workspace = 0;              // kernel workspace, trainer batch buffers, scalars
  double runtime = 0;                // from the calibration
  double host_optimizer = 0;         // offload: fp32 master + m + v in host memory
  double host_other = 0;             // offload staging, host mirrors of batches (GPU builds)
  double host_ckpt = 0;              // ckpt.async: the checkpoint's staging buffers (pinned)
  int slots = 1;                     // activation sets per chunk
  std::size_t registry_elems = 0;    // the stage's flat buffer (elements, padding included)
  double psi = 0;                    // parameters on this rank (registry elements, no padding)

  double model_states() const { return params + grads + optimizer; }
  double device() const {
    return params + grads + optimizer + activations + head + scratch + comm_buffers + workspace +
           runtime;
  }
  double host() const { return host_optimizer + host_other + host_ckpt; }
  // What one process allocates in total (device + host): the CPU build's figure.
  double total() const { return device() + host(); }
};

// Every stage of the layout. ConfigError for layouts the code refuses (tp not dividing heads or
// the padded vocabulary, pp * v > n_layer, ZeRO 2/3 with pp > 1, ...), as ParallelContext would.
std::vector<MemoryBreakdown> memory_per_stage(const model::GptConfig& cfg, int seq_len,
                                              const Layout& l, const MemoryTarget& t = {});
// The stage with the most device memory (ties: the first).
MemoryBreakdown peak_memory(const model::GptConfig& cfg, int seq_len, const Layout& l,
                            const MemoryTarget& t = {});

// Why a layout cannot run at all (empty: it can): the checks of ParallelContext, the model and
// GradSync, without building them.
std::string layout_error(const model::GptConfig& cfg, int seq_len, const Layout& l);

std::string format_bytes(double bytes);  // "1.25 GiB", "312.0 MiB", "48.0 KiB"

}  // namespace meshtrain::plan
