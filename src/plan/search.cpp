#include "meshtrain/plan/search.hpp"

#include <algorithm>
#include <cstdio>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/timer.hpp"

namespace meshtrain::plan {

namespace {

// Sequences from this length on are also tried with context parallelism (mesh.cp > 1).
constexpr int kContextParallelFrom = 4096;

std::vector<int> divisors(long n) {
  std::vector<int> d;
  for (long i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(static_cast<int>(i));
  return d;
}

MemoryTarget target_of(const Calibration& cal) {
  MemoryTarget t;
  t.device_is_host = cal.device == "cpu";
  t.runtime_bytes = cal.runtime_bytes;
  // A GPU cluster's build is assumed to have cuDNN (the Spack +cuda recipe and the GPU bundle
  // do), so --attn.impl auto takes it.
  t.cudnn_attention = cal.device == "gpu";
  return t;
}

double usable(const SearchOptions& o, const Calibration& cal) {
  return o.cluster.memory_bytes > 0 ? o.cluster.memory_bytes * cal.usable_memory_fraction : 1e300;
}

}  // namespace

long default_global_batch(int world) { return std::max(512, world); }

Scenario classify(const model::GptConfig& cfg, int seq_len, const SearchOptions& opt,
                  const Calibration& cal) {
  Scenario s;
  s.single_node = opt.cluster.world <= opt.cluster.gpus_per_node;
  s.fast_inter_node = cal.inter.busbw_gbs >= 0.25 * cal.intra.busbw_gbs;
  const double cap = usable(opt, cal);
  Layout one;
  one.precision = opt.precision;
  one.bucket_bytes = opt.bucket_bytes;
  s.fits_one_device = peak_memory(cfg, seq_len, one, target_of(cal)).device() <= cap;
  // The largest layer: the model states and activations of a one-block model at micro-batch 1
  // (the embedding included, which for GPT-2 is the largest single tensor).
  model::GptConfig one_block = cfg;
  one_block.n_layer = 1;
  Layout lb = one;
  lb.zero_stage = 0;
  const auto mb = peak_memory(one_block, seq_len, lb, target_of(cal));
  s.largest_layer_fits = mb.model_states() + mb.activations <= cap;
  if (s.single_node) {
    if (s.fits_one_device) s.rule = "single node, fits on one GPU -> DDP (or ZeRO)";
    else if (s.largest_layer_fits)
      s.rule = "single node, doesn't fit on one GPU -> PP, ZeRO or TP (close with NVLink; "
               "otherwise PP fastest)";
    else s.rule = "largest layer doesn't fit on one GPU -> TP (or ZeRO)";
  } else if (s.fits_one_device) {
    s.rule = s.fast_inter_node ? "multi-node, fits on one GPU, fast links -> DDP or ZeRO"
                               : "multi-node, fits on one GPU -> DDP (slow links: mind the "
                                 "all-reduce)";
  } else if (s.fast_inter_node) {
    s.rule = "multi-node, fast inter-node links -> ZeRO, or PP+TP+DP";
  } else {
    s.rule = "multi-node, slow inter-node links, memory tight -> DP+PP+TP+ZeRO-1";
  }
  return s;
}

std::string family(const Layout& l) {
  std::vector<std::string> parts;
  if (l.dp > 1 && (l.pp > 1 || l.tp > 1 || l.cp > 1)) parts.push_back("DP");
  if (l.cp > 1) parts.push_back("CP");
  if (l.pp > 1) parts.push_back("PP");
  if (l.tp > 1) parts.push_back("TP");
  if (l.zero_stage > 0) parts.push_back(cat("ZeRO-", l.zero_stage));
  std::string f;
  for (const auto& p : parts) {
    if (!f.empty()) f.push_back('+');
    f.append(p);
  }
  if (f.empty()) f = l.dp > 1 ? "DDP" : "single GPU";
  if (l.offload) f.append(" (offload)");
  return f;
}

bool rule_recommends(const Scenario& s, const Layout& l) {
  const bool model_parallel = l.pp > 1 || l.tp > 1;
  if (s.fits_one_device) return !model_parallel;                       // DDP or ZeRO
  if (!s.largest_layer_fits) return l.tp > 1 || l.zero_stage == 3;     // TP or ZeRO
  if (s.single_node) return model_parallel || l.zero_stage > 0;        // PP, ZeRO or TP
  if (s.fast_inter_node) return l.zero_stage > 0 || (l.pp > 1 && l.tp > 1);  // ZeRO or 3D
  return l.pp > 1 && l.tp > 1 && l.zero_stage <= 1;                    // DP+PP+TP+ZeRO-1
}

std::string rule_agreement(const SearchResult& r, const Candidate& c) {
  if (rule_recommends(r.scenario, c.layout)) return "agrees";
  for (const Candidate& o : r.ranked) {  // fastest first
    if (!rule_recommends(r.scenario, o.layout)) continue;
    const double slower = 100.0 * (o.cost.step_s / c.cost.step_s - 1.0);
    if (slower <= 0) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "differs: the rule's best, %s, is %.0f%% faster",
                    o.layout.short_name().c_str(), -slower);
      return buf;
    }
    // The part of the step that grows most from this layout to the rule's.
    const StepCost &a = c.cost, &b = o.cost;
    const std::pair<double, const char*> d[] = {
        {b.compute_s - a.compute_s, "compute"},
        {b.tp_comm_s - a.tp_comm_s, "tp communication"},
        {b.pp_bubble_s - a.pp_bubble_s, "pipeline bubble"},
        {b.pp_comm_s - a.pp_comm_s, "pipeline messages"},
        {b.dp_comm_s - a.dp_comm_s, "exposed dp communication"},
        {b.zero3_gather_s - a.zero3_gather_s, "ZeRO-3 gathers"},
        {b.cp_comm_s - a.cp_comm_s, "context-parallel ring"},
        {b.optimizer_s - a.optimizer_s, "optimizer"},
        {b.overhead_s - a.overhead_s, "launch overhead"}};
    const auto* worst = &d[0];
    for (const auto& x : d)
      if (x.first > worst->first) worst = &x;
    char buf[200];
    std::snprintf(buf, sizeof buf, "differs: the rule's best, %s, is %.0f%% slower (more %s)",
                  o.layout.short_name().c_str(), slower, worst->second);
    return buf;
  }
  return "differs: no layout of the rule's kind fits";
}

SearchResult search(const model::GptConfig& cfg, int seq_len, const SearchOptions& opt,
                    const Calibration& cal) {
  SearchResult r;
  const int W = opt.cluster.world, G = std::max(opt.cluster.gpus_per_node, 1);
  const long GB = opt.global_batch > 0 ? opt.global_batch : default_global_batch(W);
  const double cap = usable(opt, cal);
  const MemoryTarget tgt = target_of(cal);
  r.scenario = classify(cfg, seq_len, opt, cal);
  const Timer clock;
  double reported = 0;
  auto consider = [&](const Layout& l) -> const Candidate* {
    ++r.enumerated;
    if (clock.seconds() > reported + 1.0) {  // a long search says it is alive, every second
      reported = clock.seconds();
      logging::info("plan: ", r.enumerated, " layouts considered, ", r.ranked.size(), " fit so far (",
                    static_cast<int>(reported), " s)");
    }
    if (!layout_error(cfg, seq_len, l).empty()) {
      ++r.invalid;
      return nullptr;
    }
    Candidate c;
    c.layout = l;
    c.memory = peak_memory(cfg, seq_len, l, tgt);
    c.fits = c.memory.device() <= cap;
    if (!c.fits) {
      ++r.pruned_memory;
      return nullptr;
    }
    c.cost = step_cost(cfg, seq_len, l, opt.cluster, cal);
    r.ranked.push_back(c);
    return &r.ranked.back();
  };
  // Context parallelism splits sequences: worth its ring traffic only for long ones, whose
  // attention (quadratic in the length) hides it and whose activations need the memory.
  const bool long_sequences = seq_len >= kContextParallelFrom;
  for (int tp : divisors(W)) {
    if (opt.tp_within_node && (tp > G || G % tp != 0)) continue;
    for (int pp : divisors(W / tp)) {
      if (pp > cfg.n_layer) continue;
      for (int cp : divisors(W / (tp * pp))) {
      if (cp > 1 && (!long_sequences || seq_len % (2 * cp) != 0)) continue;
      const int dp = W / (tp * pp * cp);
      if (GB % dp != 0) continue;
      // MoE: every ep dividing dp and the experts (1 for a dense model).
      std::vector<int> eps{1};
      if (cfg.moe.enabled())
        for (int e : divisors(dp))
          if (e > 1 && cfg.moe.experts % e == 0) eps.push_back(e);
      for (int ep : eps)
      for (int mb : opt.micro_batches) {
        if ((GB / dp) % mb != 0) continue;
        if (GB / dp / mb > opt.max_micro_batches) {
          ++r.too_many_micro;
          continue;
        }
        const int n_micro = static_cast<int>(GB / dp / mb);
        std::vector<std::pair<parallel::ScheduleKind, int>> scheds;
        if (pp == 1) scheds.push_back({parallel::ScheduleKind::one_f_one_b, 1});
        else {
          scheds.push_back({parallel::ScheduleKind::one_f_one_b, 1});
          scheds.push_back({parallel::ScheduleKind::gpipe, 1});
          for (int v : opt.virtual_chunks) scheds.push_back({parallel::ScheduleKind::interleaved, v});
        }
        for (auto [kind, v] : scheds)
          for (int zero : opt.zero_stages) {
            // Nothing to shard over: ZeRO shards over the replicas, dp x cp (cp ranks hold one
            // model each, as dp ranks do).
            if (dp * cp == 1 && zero > 0) continue;
            for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
              Layout l;
              l.dp = dp;
              l.pp = pp;
              l.tp = tp;
              l.ep = ep;
              l.cp = cp;
              l.zero_stage = zero;
              l.micro_batch = mb;
              l.n_micro = n_micro;
              l.schedule = kind;
              l.virtual_chunks = v;
              l.sequence_parallel = sp == 1;
              l.precision = opt.precision;
              l.fp8 = opt.fp8;
              l.fp8_rowwise = opt.fp8_rowwise;
              l.fp8_wgrad_bf16 = opt.fp8_wgrad_bf16;
              l.fp8_first_last_bf16 = opt.fp8_first_last_bf16;
              l.fp8_experts = opt.fp8_experts;
              l.bucket_bytes = opt.bucket_bytes;
              // Recompute and offload only buy memory: tried when the plain layout does not fit.
              const std::size_t before = r.ranked.size();
              const long pruned = r.pruned_memory;
              consider(l);
              if (r.ranked.size() > before || r.pruned_memory == pruned) continue;
              Layout rc = l;
              rc.recompute = true;
              const long pruned_rc = r.pruned_memory;
              consider(rc);
              if (r.pruned_memory == pruned_rc) continue;
              Layout off = l;
              off.offload = true;
              if (consider(off)) continue;
              off.recompute = true;
              consider(off);
            }
          }
      }
      }
    }
  }
  std::stable_sort(r.ranked.begin(), r.ranked.end(), [](const Candidate& a, const Candidate& b) {
    if (a.cost.step_s != b.cost.step_s) return a.cost.step_s < b.cost.step_s;
    return a.memory.device() < b.memory.device();
  });
  return r;
}

}  // namespace meshtrain::plan
