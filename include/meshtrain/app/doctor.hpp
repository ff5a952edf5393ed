#pragma once
// `meshtrain doctor RUN_DIR`: reads what a run left in its folder (config.ini and run.json,
// written by `train` before step 1; metrics.jsonl; memory.json, every rank's peak at the end;
// the watchdog's flight_<rank>.json dumps),
// runs the planner's cost and memory models on the run's configuration, and answers in the
// terms of the seeds' troubleshooting table (seed 002):
//   GPU utilisation swinging      -> pipeline bubbles          -> more micro-batches
//   communication > 30 % of step  -> all-reduce inefficiency   -> NCCL_ALGO=Tree, overlap
//   out of memory                 -> tensor-parallel split     -> tensor_parallel_size
//   no speed-up with more GPUs    -> data-parallel comm.       -> gradient compression
//   NaN loss                      -> fp16 overflow             -> loss scaling
// plus the gap between the measured and the predicted step and, after a watchdog abort, the
// rank that never arrived at the hung collective. The analysis (doctor_findings.cpp) is pure:
// RunData in, findings out, so tests feed it runs made to show each finding.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshtrain/app/runtime.hpp"
#include "meshtrain/core/config.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/plan/cost.hpp"
#include "meshtrain/plan/layout.hpp"
#include "meshtrain/plan/memory.hpp"

namespace meshtrain::app {

struct StepRecord {
  std::int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, step_ms = 0, tokens_per_s = 0, mfu = 0;
  double loss_scale = 1, bubble = 0, comm_ms = 0, comm_hidden = 0, tp_comm_ms = 0;
  double a2a_ms = 0;  // MoE token all-to-alls over ep, summed over the blocks (blocking)
  double memory_bytes = 0;
  bool skipped = false, checkpoint = false;
  bool loss_finite = true, grad_finite = true;
};

// One communicator of one rank's flight dump.
struct FlightComm {
  std::string name;
  std::vector<int> world_ranks;
  std::uint64_t issued = 0;
  struct Entry {
    std::uint64_t seq = 0;
    std::string op, state;
    std::size_t bytes = 0;
    int peer = -1;
  };
  std::vector<Entry> entries;
};
struct FlightDump {
  int rank = 0;
  std::string reason;
  std::vector<FlightComm> comms;
};

struct RunData {
  std::string dir;
  // The job (run.json) and the configuration (config.ini).
  int world = 1, ranks_per_node = 1, devices_per_node = 0;
  bool gpu = false;
  model::GptConfig model;
  int seq_len = 0;
  plan::Layout layout;
  bool dp_overlap = true, loss_scaling = false;
  std::string on_nonfinite = "stop";
  std::int64_t steps_planned = 0;
  // metrics.jsonl and memory.json
  std::vector<StepRecord> steps;
  std::vector<std::pair<std::int64_t, double>> val_loss;
  std::vector<double> memory_per_rank;  // bytes, world rank order (empty: the run did not end)
  double memory_capacity = 0;           // of the device (GPU) or of the node's host memory
  // flight_<rank>.json
  std::vector<FlightDump> flights;
};

// What the planner predicts for the run's own layout.
struct Prediction {
  bool valid = false;
  std::string why_not;                        // when not valid
  plan::StepCost cost;
  std::vector<plan::MemoryBreakdown> stages;  // per pipeline stage
  std::string calibration;                    // its file
  bool host_memory = true;                    // CPU calibration: compare total(), else device()
  // The same run at twice the tensor-parallel size (half the dp), for the memory finding.
  bool tp2_valid = false;
  double tp2_peak = 0;
};

struct Finding {
  std::string topic;    // bubble, communication, memory, stability, step time, hung collective
  bool problem = false; // the table's symptom is there
  std::string text;     // the figures
  std::string advice;   // the table's cause and remedy, with meshtrain's options (problems only)
};

// Reads a run folder (ConfigError naming the file for what is missing or malformed).
RunData load_run(const std::string& dir);
// The findings, in the table's order (each one always there, a problem or a clean bill).
std::vector<Finding> diagnose(const RunData& run, const Prediction& p);
// Micro-batches per step that halve the pipeline bubble (pp - 1) / (v m + pp - 1):
// ceil(2 m + (pp - 1) / v), a multiple of pp when v > 1 (the interleaved schedule's rule).
int micro_batches_halving_bubble(int pp, int v, int m);
double bubble_share(int pp, int v, int m);

boost::program_options::options_description doctor_options();
int cmd_doctor(Runtime& rt, const std::vector<std::string>& args);

}  // namespace meshtrain::app
