#pragma once
// Memory preflight of `meshtrain train` (issue 36): before the model, the optimizer and the data
// are allocated, each rank compares the planner's prediction for its pipeline stage of the run's
// layout (plan::memory_per_stage: what every owner states it allocates, held to the CPU build's
// allocations by test_plan_memory) with the memory it has: on GPU builds the device's free
// memory shared by the ranks on that device (and the node's host memory for the host parts),
// on CPU builds the node's MemAvailable shared by the ranks on the node. A run that cannot fit
// ends within seconds with exit 2 (`train.memory_check error`, the default), naming the
// predicted GiB by part, the available GiB and the rank, and what would fit instead: a smaller
// micro-batch, activation recomputation, a ZeRO stage, more tensor or pipeline parallelism —
// each found by running the same memory model on that layout. `warn` prints the same and goes
// on; `off` skips the check.
#include <mpi.h>

#include <string>
#include <vector>

#include "meshtrain/app/runtime.hpp"
#include "meshtrain/core/config.hpp"
#include "meshtrain/mesh/process_mesh.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/plan/memory.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::app {

enum class MemoryCheck { off, warn, error };
MemoryCheck parse_memory_check(const std::string& text);  // ConfigError naming the option

// The memory one rank may use, in bytes, and where the figures come from.
struct MemoryAvailable {
  bool device_is_host = true;     // CPU build: one figure (host) for everything
  double device = 0, host = 0;
  std::string device_source, host_source;  // "MemAvailable 22.17 GiB / 4 ranks on the node"
};

// What this rank has: host = the node's MemAvailable / node.size; on GPU builds device = the
// free memory of this rank's device / the ranks of the node that share it. The environment
// variable MESHTRAIN_MEMORY_AVAILABLE_GIB replaces the measured figure before it is divided:
// the node's host memory on CPU builds, the device's free memory on GPU builds (tests pretend a
// smaller machine with it). ConfigError for a malformed value.
MemoryAvailable memory_available(const mesh::NodeRank& node, int device, int device_count);

// Whether a prediction fits what a rank has (every part of every stage: `stages`).
bool fits(const std::vector<plan::MemoryBreakdown>& stages, const MemoryAvailable& a);

// The report of one rank whose stage `m` does not fit: the numbers by part, what is available
// and where that figure comes from, and what would fit (the alternatives below). Pure.
std::string memory_refusal(const model::GptConfig& cfg, int seq_len, const plan::Layout& l,
                           const plan::MemoryTarget& t, const plan::MemoryBreakdown& m,
                           const MemoryAvailable& a);

// Layouts of the same job (world size, global batch) that fit, each as the options that give it
// and its predicted peak per rank: the largest smaller micro-batch (more accumulation), train.
// recompute, the lowest larger ZeRO stage, optimizer offload (GPU builds), the smallest larger
// tp and pp; when no single change fits, the combination with the fewest changes that does, or
// what the smallest combination would still need. Pure.
std::vector<std::string> what_would_fit(const model::GptConfig& cfg, int seq_len,
                                        const plan::Layout& l, const plan::MemoryTarget& t,
                                        const MemoryAvailable& a);

// Collective over `world`: runs the check on every rank for its own `stage` and agrees on the
// outcome (core/agree.hpp): mode error throws the lowest failing rank's report as an agreed
// ConfigError on every rank; warn prints it once; off does nothing. Logs the prediction.
void check_memory(MPI_Comm world, MemoryCheck mode, const model::GptConfig& cfg, int seq_len,
                  const plan::Layout& l, const plan::MemoryTarget& t, int stage,
                  const MemoryAvailable& a);

// The planner's layout of a `train` run (the engine's options, the trainer's accumulation and
// checkpoint staging).
plan::Layout train_layout(const train::TrainConfig& tc, const parallel::EngineOptions& eo,
                          const std::string& precision);

// `meshtrain train`'s check (train.memory_check): this rank's stage under the mesh order, the
// memory of this build's target (cuDNN attention where it would run), what the rank has.
void check_train_memory(const Runtime& rt, const boost::program_options::variables_map& vm,
                        const model::GptConfig& mc, const train::TrainConfig& tc,
                        const parallel::EngineOptions& eo, const std::string& precision);

}  // namespace meshtrain::app
