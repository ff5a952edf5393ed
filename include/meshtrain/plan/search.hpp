#pragma once
// Layout search: every (dp, pp, tp, ZeRO stage, offload, micro-batch, schedule, virtual chunks,
// sequence parallelism, recompute) the model and the cluster allow for a fixed global batch,
// pruned by memory per device, ranked by predicted step time. Each layout is also placed in the
// seeds' decision table (the field's rules of thumb: "fits on one GPU -> DDP", "doesn't fit ->
// PP, ZeRO or TP", "slow inter-node links -> DP+PP+TP+ZeRO-1", ...), so the table says which
// rule the numbers agree with and where they depart from it.
#include <string>
#include <vector>

#include "meshtrain/model/config.hpp"
#include "meshtrain/plan/calibration.hpp"
#include "meshtrain/plan/cost.hpp"
#include "meshtrain/plan/layout.hpp"
#include "meshtrain/plan/memory.hpp"

namespace meshtrain::plan {

struct SearchOptions {
  Cluster cluster;
  long global_batch = 0;              // sequences per step (every layout trains the same batch)
  std::vector<int> micro_batches{1, 2, 4, 8, 16, 32};
  std::vector<int> zero_stages{0, 1, 2, 3};
  std::vector<int> virtual_chunks{2, 4};  // tried with the interleaved schedule
  bool tp_within_node = true;         // the seeds' (and Megatron's) rule: tp <= GPUs per node
  Precision precision = Precision::bf16;
  // plan.precision=fp8: every layout runs its blocks' linears in FP8 on `precision`'s
  // activations, under this recipe (Layout's fp8 fields, train's fp8.* options).
  bool fp8 = false;
  bool fp8_rowwise = false;
  bool fp8_wgrad_bf16 = false;
  int fp8_first_last_bf16 = 0;
  bool fp8_experts = false;
  std::size_t bucket_bytes = 25u << 20;
  // Layouts needing more micro-batches per step are counted, not evaluated: replaying the
  // schedule and the buffer pools costs time in proportion to the micro-batch count, and a
  // global batch that needs this many (a token count typed as a sequence count) would make the
  // search run for minutes. A larger micro-batch in `micro_batches` reaches them.
  int max_micro_batches = 1024;
};

struct Candidate {
  Layout layout;
  MemoryBreakdown memory;  // the stage with the most device memory
  StepCost cost;
  bool fits = false;
};

// Where the model and cluster sit in the seeds' table, and what it recommends.
struct Scenario {
  bool single_node = true;
  bool fits_one_device = true;       // whole model, micro-batch 1, on one device, plain DDP
  bool largest_layer_fits = true;    // one block's model states and activations
  bool fast_inter_node = false;      // inter-node bus bandwidth >= 1/4 of intra-node
  std::string rule;                  // the row of the seeds' table that applies
};

struct SearchResult {
  Scenario scenario;
  std::vector<Candidate> ranked;     // fitting layouts, fastest first
  long enumerated = 0, invalid = 0, pruned_memory = 0;
  long too_many_micro = 0;  // layouts over SearchOptions::max_micro_batches, not evaluated
};

SearchResult search(const model::GptConfig& cfg, int seq_len, const SearchOptions& opt,
                    const Calibration& cal);

Scenario classify(const model::GptConfig& cfg, int seq_len, const SearchOptions& opt,
                  const Calibration& cal);

// The layout's family in the table's vocabulary ("DDP", "ZeRO-3", "PP+TP", "DP+PP+TP+ZeRO-1").
std::string family(const Layout& l);
// Whether the layout is of a kind the scenario's rule recommends.
bool rule_recommends(const Scenario& s, const Layout& l);
// "agrees", or "differs: <the fastest layout the rule recommends> predicts N % slower
// (<its bottleneck>)" / "differs: no layout the rule recommends fits".
std::string rule_agreement(const SearchResult& r, const Candidate& c);

// The default global batch when none is given: 512 sequences, or one per rank beyond that.
long default_global_batch(int world);

}  // namespace meshtrain::plan
