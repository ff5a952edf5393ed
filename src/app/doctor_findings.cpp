// `meshtrain doctor`'s analysis: a run's records and the planner's prediction in, the seeds'
// troubleshooting table's findings out (app/doctor.hpp). Pure: no files, no MPI.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "meshtrain/app/doctor.hpp"
#include "meshtrain/core/error.hpp"

namespace meshtrain::app {

double bubble_share(int pp, int v, int m) {
  return pp <= 1 ? 0.0 : (pp - 1.0) / (static_cast<double>(v) * m + pp - 1.0);
}

int micro_batches_halving_bubble(int pp, int v, int m) {
  // (pp - 1) / (v m' + pp - 1) = b / 2  <=>  v m' = 2 v m + pp - 1.
  int m2 = static_cast<int>(std::ceil(2.0 * m + (pp - 1.0) / v - 1e-9));
  if (v > 1) m2 = (m2 + pp - 1) / pp * pp;
  return m2;
}

namespace {

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%%", 100.0 * x);
  return b;
}
std::string ms(double x) {
  char b[32];
  std::snprintf(b, sizeof b, x < 10 ? "%.2f ms" : "%.1f ms", x);
  return b;
}
std::string fixed(double x, int digits) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, x);
  return b;
}
std::string list(const std::vector<std::int64_t>& v, std::size_t most = 8) {
  std::string s;
  for (std::size_t i = 0; i < v.size() && i < most; ++i) s += cat(i ? ", " : "", v[i]);
  if (v.size() > most) s += cat(", ... (", v.size(), " in all)");
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The steps whose times describe the steady state: the first logged step carries start-up
// costs, a checkpoint step its save; with nothing else left they are all there is.
std::vector<const StepRecord*> steady(const RunData& r) {
  std::vector<const StepRecord*> s;
  for (std::size_t i = 0; i < r.steps.size(); ++i)
    if (i > 0 && !r.steps[i].checkpoint && r.steps[i].step_ms > 0) s.push_back(&r.steps[i]);
  if (s.empty())
    for (const auto& x : r.steps) s.push_back(&x);
  return s;
}
template <class F>
double median_of(const std::vector<const StepRecord*>& s, F f) {
  std::vector<double> v;
  for (const StepRecord* x : s) v.push_back(f(*x));
  return median(v);
}

Finding bubble(const RunData& r) {
  Finding f;
  f.topic = "pipeline bubble";
  const plan::Layout& l = r.layout;
  const int v = l.schedule == parallel::ScheduleKind::interleaved ? l.virtual_chunks : 1;
  if (l.pp <= 1) {
    f.text = "none: pp 1 (no pipeline)";
    return f;
  }
  const double b = bubble_share(l.pp, v, l.n_micro);
  const double measured = median_of(steady(r), [](const StepRecord& s) { return s.bubble; });
  f.text = cat(pct(b), " of each stage's step at pp ", l.pp, " with ", l.n_micro,
               " micro-batches (the schedule's (pp - 1) / (", v > 1 ? "v " : "",
               "m + pp - 1)); measured idle on rank 0: ", pct(measured),
               r.gpu ? " (host wall time, which kernels still queued on the GPU hide)" : "");
  f.problem = b >= 0.2 || measured >= 0.2;
  if (f.problem) {
    const int m2 = micro_batches_halving_bubble(l.pp, v, l.n_micro);
    f.advice = cat("GPU utilisation swinging -> pipeline bubbles -> more micro-batches: ", m2,
                   " micro-batches (train.grad_accum ", m2, ") would halve it to ",
                   pct(bubble_share(l.pp, v, m2)), "; the global batch grows ",
                   fixed(static_cast<double>(m2) / l.n_micro, 1),
                   "x unless train.micro_batch shrinks with it");
    if (v == 1 && l.n_micro % l.pp == 0 && l.n_micro >= l.pp)
      f.advice += cat(", or pp.schedule interleaved with pp.virtual_chunks 2: ",
                      pct(bubble_share(l.pp, 2, l.n_micro)));
  }
  return f;
}

Finding communication(const RunData& r, const Prediction& p) {
  Finding f;
  f.topic = "communication";
  const auto s = steady(r);
  const double step = median_of(s, [](const StepRecord& x) { return x.step_ms; });
  const double dp_ms = median_of(s, [](const StepRecord& x) { return x.comm_ms; });
  const double hidden = median_of(s, [](const StepRecord& x) { return x.comm_hidden; });
  const double tp_ms = median_of(s, [](const StepRecord& x) { return x.tp_comm_ms; });
  const double a2a_ms = median_of(s, [](const StepRecord& x) { return x.a2a_ms; });
  const plan::Layout& l = r.layout;
  if (l.world() == 1 && l.zero_stage == 0 && !l.offload) {
    f.text = "none: one rank";
    return f;
  }
  const double dp_exposed = dp_ms * (1 - hidden);
  const double share = step > 0 ? (dp_exposed + tp_ms + a2a_ms) / step : 0;
  const char* kind = l.zero_stage >= 2 ? "reduce-scatter" : "all-reduce";
  std::string pred;
  if (p.valid)
    pred = cat(" (planner: ", ms(p.cost.dp_comm_total_s * 1e3), ", ",
               ms(p.cost.dp_comm_s * 1e3), " exposed)");
  // Gradients are reduced over the replicas: dp x cp ranks hold the same parameters.
  const std::string replicas = l.cp > 1 ? cat("dp ", l.dp, " x cp ", l.cp) : cat("dp ", l.dp);
  f.text = cat(replicas, " (gradient ", kind, ", ZeRO-", l.zero_stage, "): ", ms(dp_ms),
               " per step, ", pct(hidden), " hidden, ", ms(dp_exposed), " exposed = ",
               pct(step > 0 ? dp_exposed / step : 0), " of the step", pred, "; tp ", l.tp, ": ",
               ms(tp_ms), " blocking = ", pct(step > 0 ? tp_ms / step : 0), " of the step",
               a2a_ms > 0 ? cat("; ep ", l.ep, " (MoE all-to-all): ", ms(a2a_ms), " blocking = ",
                                pct(step > 0 ? a2a_ms / step : 0), " of the step")
                          : std::string(),
               "; exposed communication in all: ", pct(share), " of ", ms(step),
               r.gpu ? " (host wall time: on GPUs an upper bound of the exposed part)" : "");
  std::vector<std::string> advice;
  if (share > 0.3)
    advice.push_back(cat("communication over 30% of the step -> all-reduce inefficiency -> ",
                         r.gpu ? "try NCCL_ALGO=Tree (jobs/lib/site_env.sh) and compare"
                               : "(the MPI backend: NCCL_ALGO does not apply) fewer, larger "
                                 "reductions per token: a larger train.micro_batch or "
                                 "train.grad_accum"));
  // A reduction that does not overlap backward: the table's data-parallel row.
  if (static_cast<long>(l.dp) * l.cp > 1 && dp_ms > 0 && hidden < 0.1) {
    f.problem = true;
    if (!r.dp_overlap) {
      advice.push_back("the dp all-reduce is not hidden: dp.overlap=false launches every "
                       "bucket after backward; dp.overlap true starts each bucket when its "
                       "gradients are ready");
    } else {
      const double grads = p.valid && !p.stages.empty() ? p.stages.front().grads : 0;
      const double bucket = static_cast<double>(l.bucket_bytes);
      if (grads > 0 && grads <= bucket)
        advice.push_back(cat("the dp all-reduce is not hidden: one bucket (dp.bucket_mb ",
                             fixed(bucket / 1048576.0, 1), ") holds all ",
                             fixed(grads / 1048576.0, 2), " MiB of gradients, and the last "
                             "bucket always waits for the end of backward; a smaller "
                             "dp.bucket_mb lets buckets start during backward"));
      else
        advice.push_back("the dp all-reduce is not hidden although dp.overlap is on: backward "
                         "is too short to cover it (a larger train.micro_batch), or the "
                         "links are slow");
    }
    advice.push_back("no speed-up with more GPUs -> data-parallel communication -> gradient "
                     "compression (not built in meshtrain; bf16 gradients halve the bytes)");
  }
  if (share > 0.3) f.problem = true;
  for (std::size_t i = 0; i < advice.size(); ++i) f.advice += (i ? "; " : "") + advice[i];
  return f;
}

Finding memory(const RunData& r, const Prediction& p) {
  Finding f;
  f.topic = "memory";
  // Ranks that share a device share its memory: the host's on CPU builds, a GPU when ranks
  // outnumber the node's GPUs.
  const int devices = r.gpu ? std::max(1, r.devices_per_node) : 1;
  const double share = std::max(1, (r.ranks_per_node + devices - 1) / devices);
  const double cap = r.memory_capacity / share;
  double pred = 0;
  int pred_stage = 0;
  if (p.valid)
    for (const auto& m : p.stages)
      if ((p.host_memory ? m.total() : m.device()) > pred)
        pred = p.host_memory ? m.total() : m.device(), pred_stage = m.stage;
  std::string text;
  double least = 1;
  int least_rank = -1;
  if (!r.memory_per_rank.empty() && cap > 0) {
    for (std::size_t k = 0; k < r.memory_per_rank.size(); ++k) {
      const double head = 1 - r.memory_per_rank[k] / cap;
      text += cat(k ? ", " : "", "rank ", k, " ", plan::format_bytes(r.memory_per_rank[k]),
                  " (", pct(head), " free)");
      if (head < least) least = head, least_rank = static_cast<int>(k);
    }
    text = cat("peak per rank of ", plan::format_bytes(cap),
               r.gpu ? " (the GPU's" : " (the host's memory", share > 1 ? cat(" / ", share,
                                                                           " ranks sharing it")
                                                                    : std::string(),
               "): ", text, "; least headroom ", pct(least), " on rank ", least_rank);
  } else if (!r.steps.empty() && r.steps.back().memory_bytes > 0 && cap > 0) {
    // The run ended early: its step records still carry rank 0's figure.
    const double m = r.steps.back().memory_bytes;
    least = 1 - m / cap;
    least_rank = 0;
    text = cat("rank 0 at step ", r.steps.back().step, ": ", plan::format_bytes(m), " of ",
               plan::format_bytes(cap), " (", pct(least), " free); the other ranks' peaks were "
               "not recorded (the run did not reach its end)");
  } else {
    text = "no per-rank peak recorded (the run did not reach its end)";
    if (cap > 0 && pred > 0) least = 1 - pred / cap;
  }
  if (p.valid)
    text += cat("; planner: ", plan::format_bytes(pred), " per rank of stage ", pred_stage);
  f.text = text;
  f.problem = least < 0.1;
  if (f.problem) {
    f.advice = "out of memory -> tensor-parallel split -> a larger mesh.tp";
    if (p.tp2_valid)
      f.advice += cat(": tp ", r.layout.tp * 2, " (dp ", r.layout.dp / 2, ") needs ",
                      plan::format_bytes(p.tp2_peak), " per rank (planner)");
    f.advice += "; or zero.stage 3, train.recompute, a smaller train.micro_batch "
                "(`meshtrain plan` ranks what fits)";
  }
  return f;
}

Finding stability(const RunData& r) {
  Finding f;
  f.topic = "stability";
  std::vector<std::int64_t> bad_loss, bad_grad, skipped, halved, spikes;
  double last_scale = 0;
  std::vector<double> recent;
  for (const auto& s : r.steps) {
    if (!s.loss_finite) bad_loss.push_back(s.step);
    if (!s.grad_finite) bad_grad.push_back(s.step);
    if (s.skipped) skipped.push_back(s.step);
    if (last_scale > 0 && s.loss_scale < last_scale) halved.push_back(s.step);
    last_scale = s.loss_scale;
    if (s.loss_finite) {
      if (recent.size() >= 5 && s.loss > 2 * median(recent)) spikes.push_back(s.step);
      recent.push_back(s.loss);
      if (recent.size() > 5) recent.erase(recent.begin());
    }
  }
  std::string text = cat(r.steps.size(), " steps logged");
  if (!bad_loss.empty()) text += cat("; non-finite loss at step ", list(bad_loss));
  if (!bad_grad.empty())
    text += cat("; non-finite gradients at step ", list(bad_grad),
                skipped.empty() ? "" : " (update skipped)");
  if (!skipped.empty()) text += cat("; updates skipped at step ", list(skipped));
  if (r.loss_scaling && !r.steps.empty())
    text += cat("; loss scale ", r.steps.front().loss_scale, " -> ", r.steps.back().loss_scale,
                halved.empty() ? std::string() : cat(" (lowered at step ", list(halved), ")"));
  if (!spikes.empty()) text += cat("; loss spikes (over twice the recent median) at step ",
                                   list(spikes));
  if (bad_loss.empty() && bad_grad.empty() && skipped.empty() && spikes.empty())
    text += ", every loss and gradient norm finite";
  f.text = text;
  f.problem = !bad_loss.empty() || !bad_grad.empty() || !skipped.empty() || !spikes.empty();
  if (!f.problem) return f;
  const bool fp16 = r.layout.precision == plan::Precision::fp16;
  if (fp16 && !r.loss_scaling) {
    f.advice = "NaN loss -> fp16 overflow -> loss scaling: train.loss_scaling on";
  } else if (r.loss_scaling && !skipped.empty()) {
    f.advice = cat("NaN loss -> fp16 overflow -> loss scaling: it is on and skipped ",
                   skipped.size(), " update(s)", halved.empty() ? "" : ", lowering the scale",
                   "; if the scale keeps falling the gradients overflow for another reason "
                   "(a lower train.lr, train.grad_clip)");
  } else {
    const std::int64_t first =
        !bad_grad.empty() ? bad_grad.front() : !bad_loss.empty() ? bad_loss.front() : 0;
    f.advice = first > 0
                   ? cat("not an fp16 overflow (", plan::precision_name(r.layout.precision),
                         "): the first non-finite step is ", first,
                         ", which trains data batch ", first - 1, " unless rollbacks moved "
                         "it; a bad batch is stepped over by train.on_nonfinite skip or "
                         "rollback (this run: ", r.on_nonfinite, "), a rising loss by a lower "
                         "train.lr or train.grad_clip")
                   : "loss spikes: a lower train.lr, a longer train.warmup or train.grad_clip";
  }
  return f;
}

Finding step_time(const RunData& r, const Prediction& p) {
  Finding f;
  f.topic = "step time";
  const auto s = steady(r);
  const double measured = median_of(s, [](const StepRecord& x) { return x.step_ms; });
  if (!p.valid) {
    f.text = cat("measured ", ms(measured), "; no prediction: ", p.why_not);
    return f;
  }
  const double predicted = p.cost.step_s * 1e3;
  const double ratio = predicted > 0 ? measured / predicted : 0;
  f.text = cat("measured ", ms(measured), " (median of ", s.size(), " steps), predicted ",
               ms(predicted), " by the planner (", p.calibration, ", bottleneck ",
               p.cost.bottleneck, "): ", fixed(ratio, 2), "x");
  f.problem = ratio > 1.5 || (ratio > 0 && ratio < 1 / 1.5);
  if (f.problem)
    f.advice = cat("the measured step is ", ratio > 1 ? "slower" : "faster", " than this "
                   "calibration predicts: a machine unlike the calibration's (run `meshtrain "
                   "bench` here), other jobs on the nodes, or a cost the model leaves out "
                   "(`meshtrain plan --plan.validate` refits its scales)");
  return f;
}

Finding hung(const RunData& r) {
  Finding f;
  f.topic = "hung collective";
  if (r.flights.empty()) {
    f.text = "none (no flight dumps: no collective timed out)";
    return f;
  }
  // The lowest outstanding operation of each communicator: where the job stopped.
  struct Stuck {
    const FlightComm* comm = nullptr;
    const FlightComm::Entry* entry = nullptr;
    std::set<int> waiting;  // ranks whose dump shows it outstanding
  };
  std::vector<Stuck> stuck;
  for (const auto& d : r.flights)
    for (const auto& c : d.comms)
      for (const auto& e : c.entries) {
        if (e.state != "outstanding") continue;
        auto it = std::find_if(stuck.begin(), stuck.end(), [&](const Stuck& s) {
          return s.comm->name == c.name && s.comm->world_ranks == c.world_ranks;
        });
        if (it == stuck.end()) {
          stuck.push_back(Stuck{&c, &e, {d.rank}});
        } else if (e.seq < it->entry->seq) {
          *it = Stuck{&c, &e, {d.rank}};
        } else if (e.seq == it->entry->seq) {
          it->waiting.insert(d.rank);
        }
        break;  // a communicator's later entries wait behind its first
      }
  f.problem = true;
  if (stuck.empty()) {
    f.text = cat(r.flights.size(), " flight dump(s), none with an outstanding operation (",
                 r.flights.front().reason, ")");
    return f;
  }
  std::vector<std::string> parts;
  std::set<int> culprits;
  for (const Stuck& s : stuck) {
    std::vector<std::string> missing;
    const bool p2p = s.entry->op == "send" || s.entry->op == "recv";
    for (std::size_t i = 0; i < s.comm->world_ranks.size(); ++i) {
      const int w = s.comm->world_ranks[i];
      if (s.waiting.count(w) || (p2p && static_cast<int>(i) != s.entry->peer)) continue;
      const FlightDump* d = nullptr;
      for (const auto& x : r.flights)
        if (x.rank == w) d = &x;
      const FlightComm* c = nullptr;
      if (d)
        for (const auto& x : d->comms)
          if (x.name == s.comm->name && x.world_ranks == s.comm->world_ranks) c = &x;
      if (!d) {
        missing.push_back(cat("rank ", w, " (no flight dump: stopped, dead, or hung outside a "
                              "collective)"));
        culprits.insert(w);
      } else if (c && c->issued < s.entry->seq) {
        missing.push_back(cat("rank ", w, " (behind: its last operation on '", s.comm->name,
                              "' is #", c->issued, ")"));
        culprits.insert(w);
      }
    }
    std::string waiting;
    for (int w : s.waiting) waiting += cat(waiting.empty() ? "" : ",", w);
    parts.push_back(cat("'", s.comm->name, "' #", s.entry->seq, " ", s.entry->op, " of ",
                        s.entry->bytes, " bytes waits on rank(s) ", waiting, "; not arrived: ",
                        missing.empty() ? std::string("none found") : [&] {
                          std::string m;
                          for (std::size_t i = 0; i < missing.size(); ++i)
                            m += (i ? "; " : "") + missing[i];
                          return m;
                        }()));
  }
  for (std::size_t i = 0; i < parts.size(); ++i) f.text += (i ? " | " : "") + parts[i];
  if (!culprits.empty()) {
    std::string c;
    for (int w : culprits) c += cat(c.empty() ? "" : ", ", w);
    f.advice = cat("the job hung on rank ", c, ": look at its log and its node (the others "
                   "waited for it until comm.timeout)");
  } else {
    f.advice = "every member issued the operation: the network or the library stalled (with "
               "NCCL, NCCL_DEBUG=INFO shows where)";
  }
  return f;
}

}  // namespace

std::vector<Finding> diagnose(const RunData& r, const Prediction& p) {
  return {bubble(r), communication(r, p), memory(r, p), stability(r), step_time(r, p), hung(r)};
}

}  // namespace meshtrain::app
