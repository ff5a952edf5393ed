// Memory preflight (memory_check.hpp): the planner's prediction against what the rank has,
// before anything large is allocated, and what would fit instead.
#include "meshtrain/app/memory_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/memory.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/kernels/attention/attention.hpp"
#include "meshtrain/mesh/rank_math.hpp"

namespace meshtrain::app {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / kGiB);
  return buf;
}

std::string num(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / kGiB);
  return buf;
}

// The environment's replacement of the measured figure, in bytes; negative when unset.
double override_bytes() {
  const char* v = std::getenv("MESHTRAIN_MEMORY_AVAILABLE_GIB");
  if (!v || !*v) return -1;
  char* end = nullptr;
  const double g = std::strtod(v, &end);
  MESHTRAIN_CONFIG_CHECK(end && *end == '\0' && std::isfinite(g) && g > 0,
                         "MESHTRAIN_MEMORY_AVAILABLE_GIB='", v,
                         "' is not a positive number of GiB");
  return g * kGiB;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Every stage of a layout, or nothing when the code would refuse it.
std::vector<plan::MemoryBreakdown> stages_of(const model::GptConfig& cfg, int seq,
                                             const plan::Layout& l, const plan::MemoryTarget& t) {
  if (!plan::layout_error(cfg, seq, l).empty()) return {};
  try {
    return plan::memory_per_stage(cfg, seq, l, t);
  } catch (const ConfigError&) {
    return {};
  }
}

// What a rank of the layout needs at most: device memory on GPU builds, all of it on CPU builds.
double need(const std::vector<plan::MemoryBreakdown>& stages, const MemoryAvailable& a) {
  double n = 0;
  for (const auto& m : stages) n = std::max(n, a.device_is_host ? m.total() : m.device());
  return n;
}

// The options that turn `base` into `l`, as a command line would give them.
std::string options_of(const plan::Layout& base, const plan::Layout& l) {
  std::string s;
  auto add = [&](const std::string& o) { s += (s.empty() ? "" : " ") + o; };
  if (l.dp != base.dp || l.tp != base.tp || l.pp != base.pp) {
    if (l.tp != base.tp) add(cat("--mesh.tp ", l.tp));
    if (l.pp != base.pp) add(cat("--mesh.pp ", l.pp));
    add(cat("--mesh.dp ", l.dp));
  }
  if (l.micro_batch != base.micro_batch) add(cat("--train.micro_batch ", l.micro_batch));
  if (l.n_micro != base.n_micro) add(cat("--train.grad_accum ", l.n_micro));
  if (l.recompute != base.recompute) add("--train.recompute true");
  if (l.zero_stage != base.zero_stage) add(cat("--zero.stage ", l.zero_stage));
  if (l.offload != base.offload) add("--zero.offload_optimizer cpu");
  if (l.ckpt_async != base.ckpt_async) add("--ckpt.async false");
  return s;
}

int changes(const plan::Layout& base, const plan::Layout& l) {
  return (l.micro_batch != base.micro_batch) + (l.recompute != base.recompute) +
         (l.zero_stage != base.zero_stage) + (l.offload != base.offload) +
         (l.tp != base.tp) + (l.pp != base.pp) + (l.ckpt_async != base.ckpt_async);
}

// Model parallelism grown by k = a * b out of dp: tp x a, pp x b, dp / k, k times the
// accumulation (the same global batch).
plan::Layout more_model_parallel(const plan::Layout& l, int a, int b) {
  plan::Layout m = l;
  m.tp = l.tp * a;
  m.pp = l.pp * b;
  m.dp = l.dp / (a * b);
  m.n_micro = l.n_micro * a * b;
  if (m.ep > m.dp || m.dp % m.ep != 0) m.ep = 1;
  if (l.pp == 1 && m.pp > 1) m.schedule = parallel::ScheduleKind::one_f_one_b;
  if (m.dp == 1) m.zero_stage = 0;  // nothing left to shard over
  return m;
}

// A smaller micro-batch with the same global batch.
plan::Layout with_micro_batch(const plan::Layout& l, int mb) {
  plan::Layout m = l;
  m.n_micro = l.n_micro * (l.micro_batch / mb);
  m.micro_batch = mb;
  return m;
}

}  // namespace

MemoryCheck parse_memory_check(const std::string& s) {
  if (s == "error") return MemoryCheck::error;
  if (s == "warn") return MemoryCheck::warn;
  if (s == "off") return MemoryCheck::off;
  throw ConfigError(cat("train.memory_check='", s, "' is not one of error, warn, off"));
}

MemoryAvailable memory_available(const mesh::NodeRank& node, int device, int device_count) {
  MemoryAvailable a;
  const double forced = override_bytes();
  const int on_node = std::max(node.size, 1);
  a.device_is_host = kDeviceIsHost || device < 0 || device_count <= 0;
  const double node_host = a.device_is_host && forced > 0
                               ? forced
                               : static_cast<double>(host_available_bytes());
  a.host = node_host / on_node;
  a.host_source = cat(a.device_is_host && forced > 0 ? "MESHTRAIN_MEMORY_AVAILABLE_GIB "
                                                     : "MemAvailable ",
                      gib(node_host), " / ", on_node, " rank(s) on the node");
  if (!a.device_is_host) {
    // The ranks of this node on the same device (select_device: node-local rank mod devices).
    const int sharing = node.size / device_count + (device < node.size % device_count ? 1 : 0);
    const double free_b = forced > 0 ? forced : static_cast<double>(device_free_bytes());
    a.device = free_b / std::max(sharing, 1);
    a.device_source = cat(forced > 0 ? "MESHTRAIN_MEMORY_AVAILABLE_GIB " : "free ", gib(free_b),
                          " on device ", device, " / ", std::max(sharing, 1), " rank(s)");
  }
  return a;
}

bool fits(const std::vector<plan::MemoryBreakdown>& stages, const MemoryAvailable& a) {
  if (stages.empty()) return false;
  for (const auto& m : stages) {
    if (a.device_is_host ? m.total() > a.host : (m.device() > a.device || m.host() > a.host))
      return false;
  }
  return true;
}

std::vector<std::string> what_would_fit(const model::GptConfig& cfg, int seq,
                                        const plan::Layout& l, const plan::MemoryTarget& t,
                                        const MemoryAvailable& a) {
  std::vector<std::string> out;
  auto report = [&](const plan::Layout& c, const std::vector<plan::MemoryBreakdown>& st) {
    out.push_back(cat(options_of(l, c), " (", gib(need(st, a)), " per rank)"));
  };
  bool any = false;
  // A smaller micro-batch: the largest that fits.
  std::vector<int> mbs = divisors(l.micro_batch);
  mbs.pop_back();
  std::reverse(mbs.begin(), mbs.end());
  for (int mb : mbs) {
    const plan::Layout c = with_micro_batch(l, mb);
    const auto st = stages_of(cfg, seq, c, t);
    if (fits(st, a)) {
      report(c, st);
      any = true;
      break;
    }
  }
  auto single = [&](const plan::Layout& c) {
    const auto st = stages_of(cfg, seq, c, t);
    if (!fits(st, a)) return false;
    report(c, st);
    return any = true;
  };
  if (!l.recompute) {
    plan::Layout c = l;
    c.recompute = true;
    single(c);
  }
  for (int z = l.zero_stage + 1; l.dp > 1 && z <= 3; ++z) {
    plan::Layout c = l;
    c.zero_stage = z;
    if (single(c)) break;
  }
  if (!a.device_is_host && !l.offload) {  // on a CPU the optimizer is in host memory already
    plan::Layout c = l;
    c.offload = true;
    single(c);
  }
  if (l.ckpt_async) {  // synchronous saves need no staging buffers between saves
    plan::Layout c = l;
    c.ckpt_async = false;
    single(c);
  }
  for (int k : divisors(l.dp))  // the least tensor parallelism that fits, then pipeline
    if (k > 1 && single(more_model_parallel(l, k, 1))) break;
  for (int k : divisors(l.dp))
    if (k > 1 && single(more_model_parallel(l, 1, k))) break;
  if (any) return out;

  // No single change: the combination with the fewest changes (then the least memory), or the
  // smallest one when nothing fits.
  std::vector<plan::Layout> mp{l};
  for (int k : divisors(l.dp))
    for (int aa : divisors(k))
      if (k > 1) mp.push_back(more_model_parallel(l, aa, k / aa));
  plan::Layout best, smallest;
  std::vector<plan::MemoryBreakdown> best_st, smallest_st;
  int best_changes = 1 << 20;
  // Each combination of the changes that save most: a micro-batch of 1, recompute, ZeRO-3,
  // offload (GPU builds), synchronous saves; over every split of dp into tp and pp.
  for (const plan::Layout& base : mp)
    for (int mask = 0; mask < 32; ++mask) {
      plan::Layout c = base;
      if (mask & 1) c = with_micro_batch(c, 1);
      if (mask & 2) c.recompute = true;
      if ((mask & 4) && c.dp == 1) continue;
      if (mask & 4) c.zero_stage = 3;
      if ((mask & 8) && a.device_is_host) continue;
      if (mask & 8) c.offload = true;
      if ((mask & 16) && !l.ckpt_async) continue;
      if (mask & 16) c.ckpt_async = false;
      const auto st = stages_of(cfg, seq, c, t);
      if (st.empty()) continue;
      if (smallest_st.empty() || need(st, a) < need(smallest_st, a)) smallest = c, smallest_st = st;
      if (!fits(st, a)) continue;
      const int n = changes(l, c);
      if (n < best_changes || (n == best_changes && need(st, a) < need(best_st, a)))
        best = c, best_st = st, best_changes = n;
    }
  if (!best_st.empty()) {
    // With a micro-batch of 1 in it: the largest micro-batch that still fits.
    if (best.micro_batch != l.micro_batch)
      for (int mb : mbs) {
        if (mb <= 1) break;
        plan::Layout c = best;  // micro-batch 1: mb times fewer micro-batches of mb
        c.micro_batch = mb;
        c.n_micro = best.n_micro / mb;
        const auto st = stages_of(cfg, seq, c, t);
        if (fits(st, a)) {
          best = c, best_st = st;
          break;
        }
      }
    report(best, best_st);
    return out;
  }
  const long ranks = l.world();
  out.push_back(cat("nothing that ", ranks, " rank(s) can run fits: the smallest, ",
                    smallest_st.empty() ? std::string("(none valid)")
                                        : options_of(l, smallest) + ", needs " +
                                              gib(need(smallest_st, a)) + " per rank",
                    "; use more ranks on more nodes, or a smaller model or sequence"));
  return out;
}

std::string memory_refusal(const model::GptConfig& cfg, int seq, const plan::Layout& l,
                           const plan::MemoryTarget& t, const plan::MemoryBreakdown& m,
                           const MemoryAvailable& a) {
  std::string parts =
      cat("parameters ", num(m.params), ", gradients ", num(m.grads), ", optimizer ",
          num(m.optimizer), ", activations ", num(m.activations), " (", m.slots,
          " slot(s)), head ", num(m.head), ", scratch ", num(m.scratch),
          ", communication buffers ", num(m.comm_buffers), ", workspace ", num(m.workspace));
  if (m.runtime > 0) parts += cat(", runtime ", num(m.runtime));
  std::string host;
  if (m.host_optimizer > 0) host += cat(", offloaded optimizer ", num(m.host_optimizer));
  if (m.host_ckpt > 0) host += cat(", checkpoint staging ", num(m.host_ckpt));
  if (m.host_other > 0) host += cat(", other host buffers ", num(m.host_other));
  std::string verdict;
  if (a.device_is_host) {
    verdict = cat("predicted ", gib(m.total()), " per rank (", parts, host, " GiB) > available ",
                  gib(a.host), " (", a.host_source, ")");
  } else {
    verdict = cat("predicted ", gib(m.device()), " of device memory per rank (", parts, " GiB)",
                  m.device() > a.device ? " > " : " <= ", "available ", gib(a.device), " (",
                  a.device_source, ")");
    if (m.host() > 0 || m.host() > a.host)
      verdict += cat(", and ", gib(m.host()), " of host memory (", host.empty() ? "" : host.substr(2),
                     " GiB)", m.host() > a.host ? " > " : " <= ", "available ", gib(a.host), " (",
                     a.host_source, ")");
  }
  std::string fit;
  for (const auto& s : what_would_fit(cfg, seq, l, t, a)) fit += (fit.empty() ? "" : "; ") + s;
  return cat("the run does not fit in memory: stage ", m.stage, " of ", l.name(), ", ", verdict,
             ". What would fit with the same global batch: ", fit,
             ". (--train.memory_check warn starts anyway)");
}

void check_memory(MPI_Comm world, MemoryCheck mode, const model::GptConfig& cfg, int seq,
                  const plan::Layout& l, const plan::MemoryTarget& t, int stage,
                  const MemoryAvailable& a) {
  if (mode == MemoryCheck::off) return;
  // A layout the planner refuses is the engine's to refuse, with its own message (the same on
  // every rank: the layout is).
  const std::string invalid = plan::layout_error(cfg, seq, l);
  if (!invalid.empty()) {
    logging::debug("train.memory_check: not checked (", invalid, ")");
    return;
  }
  const Timer clock;
  plan::MemoryBreakdown mine;
  try {
    agree(world, "train.memory_check", [&] {
      const auto stages = plan::memory_per_stage(cfg, seq, l, t);
      MESHTRAIN_CHECK(stage >= 0 && stage < static_cast<int>(stages.size()), "stage ", stage,
                      " of ", stages.size());
      mine = stages[static_cast<std::size_t>(stage)];
      if (fits({mine}, a)) return;
      int rank = 0, size = 1;
      MPI_Comm_rank(world, &rank);
      MPI_Comm_size(world, &size);
      throw ConfigError(cat("rank ", rank, " of ", size, ": ",
                            memory_refusal(cfg, seq, l, t, mine, a)));
    });
  } catch (const ConfigError& e) {
    if (mode == MemoryCheck::error) throw;
    logging::warn(e.what());
    return;
  }
  logging::info("memory: predicted ",
                a.device_is_host ? plan::format_bytes(mine.total())
                                 : plan::format_bytes(mine.device()) + " on the device",
                " per rank (stage ", mine.stage, "), available ",
                a.device_is_host ? gib(a.host) + " (" + a.host_source + ")"
                                 : gib(a.device) + " (" + a.device_source + ")",
                " [", static_cast<long long>(clock.seconds() * 1e3 + 0.5), " ms]");
}

plan::Layout train_layout(const train::TrainConfig& tc, const parallel::EngineOptions& eo,
                          const std::string& precision) {
  const parallel::ParallelConfig& pc = eo.parallel;
  plan::Layout l;
  l.dp = pc.shape.dp;
  l.pp = pc.shape.pp;
  l.tp = pc.shape.tp;
  l.ep = pc.shape.ep;
  l.cp = pc.shape.cp;
  l.cp_all_gather = pc.cp_comm == model::CpComm::all_gather;
  l.zero_stage = pc.dp.zero_stage;
  l.offload = pc.dp.offload;
  l.micro_batch = tc.micro_batch;
  l.n_micro = tc.grad_accum;
  l.schedule = pc.schedule;
  l.virtual_chunks = pc.virtual_chunks;
  l.sequence_parallel = pc.sequence_parallel;
  l.recompute = eo.recompute;
  l.recompute_mlp_act = eo.recompute_mlp_act;
  l.precision = plan::parse_precision(precision);
  l.fp8 = eo.fp8.enabled;
  l.fp8_rowwise = eo.fp8.scaling == kernels::Fp8Scaling::rowwise;
  l.fp8_wgrad_bf16 = eo.fp8.wgrad_bf16;
  l.fp8_first_last_bf16 = eo.fp8.first_last_bf16;
  l.fp8_experts = eo.fp8.experts;
  l.bucket_bytes = pc.dp.bucket_bytes;
  l.head_chunk_tokens = eo.head_chunk_tokens;
  l.ckpt_async = tc.ckpt.async_write && !tc.ckpt.dir.empty();
  return l;
}

void check_train_memory(const Runtime& rt, const boost::program_options::variables_map& vm,
                        const model::GptConfig& mc, const train::TrainConfig& tc,
                        const parallel::EngineOptions& eo, const std::string& precision) {
  const MemoryCheck mode = parse_memory_check(vm["train.memory_check"].as<std::string>());
  if (mode == MemoryCheck::off) return;
  const plan::Layout l = train_layout(tc, eo, precision);
  MESHTRAIN_CHECK(l.world() == rt.size(), "train.memory_check: the layout it predicts (",
                  l.name(), ") spans ", l.world(), " ranks, the job has ", rt.size());
  plan::MemoryTarget t;
  t.device_is_host = kDeviceIsHost;
  // The runtime's own share (CUDA context) is in use already: free memory does not hold it.
  t.runtime_bytes = 0;
  const int hs = mc.head_size();
  t.cudnn_attention = !kDeviceIsHost && eo.attention.impl != kernels::AttentionImpl::meshtrain &&
                      (hs == 64 || hs == 128) &&
                      kernels::cudnn_attention_unavailable_reason().empty();
  t.deterministic_attention = eo.attention.deterministic;
  const int stage =
      mesh::coord_of(rt.rank(), eo.parallel.shape, eo.parallel.order).pp;
  const MemoryAvailable a = memory_available(rt.node(), rt.device(), kc::device_count());
  check_memory(rt.world(), mode, mc, tc.seq_len, l, t, stage, a);
}

}  // namespace meshtrain::app
