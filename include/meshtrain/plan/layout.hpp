#pragma once
// A training layout as the planner sees it: everything that changes memory or step time, with
// the names of the options that `meshtrain train` takes for it (mesh.*, zero.*, pp.*, tp.*,
// train.*, dp.bucket_mb). Pure data, no MPI.
#include <cstddef>
#include <string>

#include "meshtrain/parallel/schedule.hpp"

namespace meshtrain::plan {

enum class Precision { fp32, bf16, fp16 };
Precision parse_precision(const std::string& text);  // ConfigError naming train.precision
const char* precision_name(Precision p);
// Bytes of the compute type of parameters, activations and gradients.
inline std::size_t compute_bytes(Precision p) { return p == Precision::fp32 ? 4 : 2; }

struct Layout {
  int dp = 1, pp = 1, tp = 1;
  int ep = 1;                        // mesh.ep (MoE experts split over ep ranks of dp)
  int cp = 1;                        // mesh.cp (each sequence split over cp ranks)
  bool cp_all_gather = false;        // cp.comm = all_gather (else ring)
  int zero_stage = 0;                // zero.stage
  bool offload = false;              // zero.offload_optimizer = cpu
  int micro_batch = 1;               // train.micro_batch (sequences)
  int n_micro = 1;                   // train.grad_accum: micro-batches per step per dp rank
  parallel::ScheduleKind schedule = parallel::ScheduleKind::one_f_one_b;  // pp.schedule
  int virtual_chunks = 1;            // pp.virtual_chunks
  bool sequence_parallel = false;    // tp.sequence_parallel
  bool recompute = false;            // train.recompute
  bool recompute_mlp_act = false;    // train.recompute_mlp_act (not searched: set by the user)
  Precision precision = Precision::fp32;
  // train.precision=fp8 (the recipe's fields, model/fp8_recipe.hpp): the blocks' linears in FP8
  // on `precision`'s activations. Memory: the FP8 casts' workspace and the inputs kept as FP8
  // transposes. Step time: the FP8 blocks' linear GEMMs at the calibration's FP8 rate
  // (Calibration::fp8_speedup over its bf16 rate) and their casts' memory traffic (cost.cpp,
  // fp8_casts.cpp); the rest as `precision`. `meshtrain plan --plan.precision fp8` searches so.
  bool fp8 = false;
  bool fp8_rowwise = false;         // fp8.recipe = rowwise (else tensorwise)
  bool fp8_wgrad_bf16 = false;      // fp8.wgrad_bf16
  int fp8_first_last_bf16 = 0;      // fp8.first_last_bf16
  bool fp8_experts = false;         // fp8.experts
  std::size_t bucket_bytes = 25u << 20;  // dp.bucket_mb
  int head_chunk_tokens = 0;         // train.head_chunk_tokens (0: auto; not searched)
  bool ckpt_async = false;           // ckpt.async: host staging buffers of the checkpoint

  long world() const { return static_cast<long>(dp) * cp * pp * tp; }
  long global_batch() const { return static_cast<long>(micro_batch) * n_micro * dp; }
  // The schedule the context builds (pp = 1: the trivial one).
  parallel::ScheduleSpec schedule_spec() const;
  // "dp 8 x pp 2 (1f1b) x tp 4 sp, ZeRO-1, mb 2 x 16, recompute, bf16"
  std::string name() const;
  // Compact key for tables: "8x2x4 z1 mb2x16 1f1b sp rc"
  std::string short_name() const;
};

}  // namespace meshtrain::plan
