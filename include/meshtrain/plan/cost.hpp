#pragma once
// Step time of a layout from a calibration (calibration.hpp). Per micro-batch and pipeline
// stage: the GEMMs of the stage's blocks, embedding and head (achieved TFLOP/s at their FLOPs;
// the FP8 blocks' linears at the FP8 rate, plus their casts as memory traffic),
// attention (causal FLOPs at the measured rate), the memory-bound kernels (bytes at their
// effective bandwidth), kernel launch overhead, and the tensor-parallel collectives (the
// column-parallel input-gradient reduction hides behind the weight-gradient GEMM, as in the
// model). Per step: the pipeline at the pace of its slowest stage plus the analytic bubble
// ((pp - 1) / v stage-times, Narayanan et al. 2021) and point-to-point messages on the fill and
// drain path; the DP reduction overlapped with the last micro-batch's backward bucket by bucket
// (the last bucket is exposed; ZeRO 2/3 reduce-scatter every micro-batch); ZeRO-3 gathers
// prefetched one unit ahead; the ZeRO 1/2 parameter all-gather, the gradient norm and AdamW
// (on the host with offload, plus the copies) after it. Ranks of a node slow each other down by the calibration's measured per-rank slowdown at the
// number of ranks busy on average (shared memory bandwidth; time-sharing when a CPU has fewer
// cores than ranks).
#include <string>

#include "meshtrain/model/config.hpp"
#include "meshtrain/plan/calibration.hpp"
#include "meshtrain/plan/layout.hpp"

namespace meshtrain::plan {

struct Cluster {
  int world = 1;
  int gpus_per_node = 8;         // ranks per node
  double memory_bytes = 0;       // per device; 0: unlimited
};

// Bytes read plus written per element by the memory-bound kernels, forward and backward: the
// definitions `meshtrain bench` converts its timings with.
struct KernelBytes {
  static double gelu_fwd(double e) { return 2 * e; }        // read x, write y
  static double gelu_bwd(double e) { return 3 * e; }        // read x, dy; write dx
  static double layernorm_fwd(double e) { return 2 * e; }   // read x, write y (+ stats per row)
  static double layernorm_bwd(double e) { return 4 * e; }   // read dy, x; read-modify-write dx
  static double cross_entropy(double e) { return 2 * e; }   // read logits, write their gradient
  static double residual(double e) { return 3 * e; }        // read a, b; write out
  static double bias_fwd(double e) { return e; }            // broadcast into out (write)
  static double bias_bwd(double e) { return e; }            // read dout (column sums)
  // AdamW per parameter: read p, g, m, v (and the fp32 master), write p, m, v (and the master).
  static double adamw(double e, bool master) { return 3 * e + 16 + (master ? 8 : 0); }
};

struct StepCost {
  double step_s = 0;
  double compute_s = 0;      // forward + backward (+ recompute) of the slowest stage, all
                             // micro-batches: GEMMs + attention + memory-bound kernels + FP8
                             // casts
  double gemm_s = 0, attention_s = 0, membound_s = 0;
  double fp8_gemm_s = 0;     // of gemm_s, the GEMMs at the FP8 rate (train.precision=fp8)
  double fp8_cast_s = 0;     // the FP8 casts (their memory traffic at the elementwise bandwidth)
  double tp_comm_s = 0;      // exposed tensor-parallel communication
  double pp_bubble_s = 0;    // pipeline fill and drain of the slowest stage
  double pp_comm_s = 0;      // exposed point-to-point messages
  double dp_comm_s = 0;      // exposed gradient reduction + ZeRO 1/2 parameter all-gather
  double dp_comm_total_s = 0;  // all of it, hidden or not
  double zero3_gather_s = 0; // exposed ZeRO-3 parameter gathers
  double moe_a2a_s = 0;      // MoE token all-to-alls over ep (blocking: all exposed)
  double cp_comm_s = 0;      // exposed context-parallel traffic (the ring's keys and values
                             // beyond the block computation they overlap; all_gather: all)
  double cp_comm_total_s = 0;  // all of it
  double optimizer_s = 0;    // norm, clipping, AdamW (+ offload copies)
  double overhead_s = 0;     // per-step fixed costs, kernel launches
  double contention = 1;     // > 1: ranks of a node slow each other down
  double tokens_per_s = 0;
  double mfu = 0;            // model FLOPs (6N + 12 L C T per token) / (world x peak)
  std::string bottleneck;    // the largest exposed part
};

StepCost step_cost(const model::GptConfig& cfg, int seq_len, const Layout& l,
                   const Cluster& cluster, const Calibration& cal);

// Whether the groups of an axis cross nodes under the default order (tp-dp-pp, tp fastest;
// cp right after tp).
struct Placement {
  bool tp_inter = false, dp_inter = false, pp_inter = false, cp_inter = false;
};
Placement placement(const Layout& l, int gpus_per_node);

}  // namespace meshtrain::plan
