#pragma once
// What the cost model knows about a machine: achieved GEMM and attention throughput at the
// model's shapes, the effective bandwidth of the memory-bound kernels, and an alpha-beta model
// of collectives per link class. `meshtrain bench` measures it on the machine it runs on and
// writes it as JSON; `meshtrain plan --plan.validate` refines its scale factors from real steps.
// inputs/plan/ ships one measured file (the CPU build machine) and one derived from documented
// figures (H200, `measured: false`).
//
// Bandwidths count bytes read plus bytes written, with the byte counts of cost.cpp's kernel
// list, so that bench and cost model use the same definition. Collective time on a link class:
//   t = alpha + factor x bytes / busbw,
// factor = 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter; bytes of the full
// buffer), 1 (point-to-point): nccl-tests' bus bandwidth, so a measured busbw plugs in directly.
#include <string>
#include <vector>

namespace meshtrain::plan {

struct LinkClass {
  double alpha_us = 10;      // latency of one collective
  double busbw_gbs = 100;    // bus bandwidth (nccl-tests definition)
  bool measured = false;
  std::string note;
};

struct GemmPoint {
  double m = 0, n = 0, k = 0;  // row-major C[m, n] += A[m, k] B[k, n]
  double tflops = 0;           // achieved
  double flops() const { return 2.0 * m * n * k; }
  double intensity() const;  // FLOPs per element of A, B and C
};

struct Calibration {
  std::string machine = "unknown";
  std::string source;          // how the figures were obtained
  std::string date;
  std::string notes;
  bool measured = false;       // false: derived from documented figures, not measured here
  std::string device = "cpu";  // "cpu" (device memory is host memory) or "gpu"
  std::string precision = "fp32";  // precision the compute figures were taken in
  double peak_tflops = 0;      // per device, for MFU
  // Per-rank slowdown when k ranks of one node compute at once, as (k, slowdown) points with
  // slowdown(1) = 1: shared memory bandwidth and caches, and on a CPU with fewer cores than
  // ranks the time-sharing. GPUs: none (each rank has its own device).
  std::vector<std::pair<double, double>> rank_slowdown{{1, 1}};
  std::vector<GemmPoint> gemm; // achieved TFLOP/s at measured shapes (gemm_tflops)
  double attention_fwd_tflops = 1, attention_bwd_tflops = 1;  // causal FLOPs
  // FP8 GEMMs (train.precision=fp8: the blocks' linears) as their speedup over the bf16 GEMM of
  // the same shape, for tensorwise and rowwise scaling ("fp8_gemm_speedup" in the file). 0 (a
  // file without it): the device's default, default_fp8_speedup.
  double fp8_speedup_tensorwise = 0, fp8_speedup_rowwise = 0;
  double memory_gbs = 10;      // a large copy (read + write)
  // Effective bandwidth of memory-bound kernels (cost.cpp's byte counts).
  double elementwise_gbs = 10, gelu_gbs = 10, layernorm_gbs = 10, cross_entropy_gbs = 10;
  double adamw_gbs = 10, host_adamw_gbs = 10;  // device AdamW; the host step of offload
  double pcie_gbs = 10;        // host <-> device copies (offload); the CPU build: memory copies
  double kernel_overhead_us = 0;   // per kernel launch
  double step_overhead_ms = 0;     // per step: batch filling, host bookkeeping
  double dp_overlap = 1;       // share of the DP reduction that can hide behind backward (NCCL:
                               // 1; MPI progresses only inside MPI calls)
  double runtime_bytes = 0;    // memory per rank outside the layout (CUDA context, workspaces)
  double probe_alone_s = 0;    // app::probe_machine's single-rank time when this was measured
  double device_memory_gib = 0;  // per device (0: not limited), the default of plan.memory_gib
  double usable_memory_fraction = 0.95;  // of the device memory the layouts may fill
  LinkClass intra, inter;      // within a node, across nodes
  // Multiplicative corrections learnt by --plan.validate (1 = none).
  double scale_compute = 1, scale_comm = 1;
  int validated_layouts = 0;

  // Achieved TFLOP/s of a GEMM of this shape, from the measured points nearest to it in size
  // and arithmetic intensity (inverse-distance weighting in log space).
  double gemm_tflops(double m, double n, double k) const;
  // The speedup of FP8 GEMMs over gemm_tflops at the same shape: the file's, else the default.
  double fp8_speedup(bool rowwise) const;
  // Achieved TFLOP/s of an FP8 GEMM of this shape: fp8_speedup x gemm_tflops.
  double fp8_gemm_tflops(double m, double n, double k, bool rowwise) const {
    return fp8_speedup(rowwise) * gemm_tflops(m, n, k);
  }
  // rank_slowdown at `busy` ranks: linear between points (and beyond the last, along the last
  // segment), 1 below the first.
  double slowdown(double busy) const;
};

// The FP8 GEMM speedup a calibration without one assumes (calibration.cpp says where the figures
// come from): GPUs, the ratio measured on an H100; the CPU build emulates FP8 GEMMs with fp32
// ones, 1.
double default_fp8_speedup(const std::string& device, bool rowwise);

// ConfigError naming the file and the field on a bad document.
Calibration load_calibration(const std::string& path);
Calibration parse_calibration(const std::string& json_text, const std::string& what);
std::string to_json(const Calibration& c);
void save_calibration(const std::string& path, const Calibration& c);

}  // namespace meshtrain::plan
