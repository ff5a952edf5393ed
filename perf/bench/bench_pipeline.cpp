// Pipeline schedules: bubble and activation memory per stage (issue 6).
//
//   mpirun -np PP build/cpu/perf/bench/bench_pipeline [--n-layer 8] [--n-embd 128] [--n-head 4]
//          [--vocab 256] [--seq-len 64] [--micro-batch 2] [--micro 4,8,16]
//          [--schedules gpipe,1f1b,interleaved] [--chunks 2] [--steps 10] [--warmup 2]
//
// The world is the pipeline (pp = world size). For each schedule and micro-batch count m, one
// JSON line (rank 0, stdout) with:
//  - bubble_analytic: (pp - 1) / (v m + pp - 1) (equal stages, free communication);
//  - bubble_measured[s]: idle / wall of stage s from PipelineStepStats, median over the timed
//    steps (a stage's wall runs from the barrier before the step to its own last action, so the
//    last stage, which finishes first, reads low); bubble_busy: 1 - sum_s compute_s / (pp W),
//    W = the step (the longest stage wall), median over steps: every stage measured against the
//    same step, as the analytic figure is;
//  - bubble_replay[s]: the same action lists (build_schedule) replayed with free communication
//    and each (stage, chunk) forward / backward taking its cost measured with that rank running
//    alone (the other ranks asleep; process CPU time, least of 8), and each message taking the
//    one-way time of an activation ping-pong between stages 0 and 1 (message_us): the bubble
//    of these stages on dedicated cores. With uniform costs the replay reproduces the analytic
//    figure (bubble_replay_uniform checks it);
//  - compute_dilation: compute time inside the pipelined step / the same actions' costs run
//    alone. Above 1 when ranks share cores: the CPU figures are distorted by oversubscription;
//    runner_overhead: the share of a stage's wall neither waiting nor computing (copying input
//    gradients for sending, posting messages), mean over stages;
//  - memory per stage: act_alloc = model.activation_bytes() (n_slots per chunk, as allocated),
//    act_micro = one micro-batch's activations through the stage's chunks, in_flight =
//    max_in_flight (micro-batches alive at once, summed over chunks), act_peak = the peak of
//    the live activations walking the stage's action list (each chunk weighted by its bytes),
//    act_chunk_slots = what the model would allocate with a slot count per chunk (each
//    chunk's own peak) instead of the peak over chunks for every chunk.
// The tied wte's gradient sum and the optimizer are outside the pipeline step and not run.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "meshtrain/comm/factory.hpp"
#include "meshtrain/comm/flight_recorder.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/mesh/process_mesh.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/parallel/pipeline_runner.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

namespace {

struct Args {
  int n_layer = 8, n_embd = 128, n_head = 4, vocab = 256, seq_len = 64, micro_batch = 2;
  int chunks = 2, steps = 10, warmup = 2;
  std::vector<int> micro = {4, 8, 16};
  std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved"};
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--n-layer") a.n_layer = std::stoi(v);
    else if (k == "--n-embd") a.n_embd = std::stoi(v);
    else if (k == "--n-head") a.n_head = std::stoi(v);
    else if (k == "--vocab") a.vocab = std::stoi(v);
    else if (k == "--seq-len") a.seq_len = std::stoi(v);
    else if (k == "--micro-batch") a.micro_batch = std::stoi(v);
    else if (k == "--chunks") a.chunks = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--schedules") a.schedules = split(v);
    else if (k == "--micro") {
      a.micro.clear();
      for (const auto& m : split(v)) a.micro.push_back(std::stoi(m));
    } else {
      std::fprintf(stderr, "bench_pipeline: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

template <class V>
void fill_random(V v, std::uint64_t modulo, const char* stream) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.extent(0); ++i) {
    const std::uint64_t r = rng::bits(1, rng::name_stream(stream), i);
    if constexpr (std::is_integral_v<typename V::value_type>)
      h(i) = static_cast<typename V::value_type>(r % modulo);
    else
      h(i) = static_cast<float>(static_cast<double>(r % 2001) / 1000.0 - 1.0);  // [-1, 1]
  }
  Kokkos::deep_copy(v, h);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// CPU seconds of this process (all its threads): unlike wall time, not inflated while another
// process has the core.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// A barrier whose waiters sleep instead of polling, so that the rank being timed alone has a
// core to itself (MPI's blocking calls spin).
void sleeping_barrier(MPI_Comm comm) {
  MPI_Request r;
  MPI_Ibarrier(comm, &r);
  for (int done = 0; !done;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

// Replays every stage's action list: a receive completes `latency` seconds after the matching
// send was issued (the runner's sends never block), compute actions take fwd[s][c] / bwd[s][c].
struct Replay {
  double makespan = 0;
  std::vector<double> busy;
};
Replay replay(const ScheduleSpec& spec, const std::vector<std::vector<double>>& fwd,
              const std::vector<std::vector<double>>& bwd, double latency = 0) {
  const int P = spec.pp;
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < P; ++s) lists.push_back(build_schedule(spec, s));
  std::vector<std::size_t> pos(static_cast<std::size_t>(P), 0);
  std::vector<double> t(static_cast<std::size_t>(P), 0.0);
  Replay r;
  r.busy.assign(static_cast<std::size_t>(P), 0.0);
  std::map<std::tuple<bool, int, int>, double> sent;  // message -> time it was issued
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      const auto su = static_cast<std::size_t>(s);
      for (; pos[su] < lists[su].size(); ++pos[su], progress = true) {
        const Action& a = lists[su][pos[su]];
        if (a.op == Op::forward || a.op == Op::backward) {
          const auto c = static_cast<std::size_t>(a.chunk);
          const double d = a.op == Op::forward ? fwd[su][c] : bwd[su][c];
          t[su] += d;
          r.busy[su] += d;
          continue;
        }
        const MessageKey k = message_key(spec, s, a);
        const auto key = std::make_tuple(k.grad, k.micro, k.boundary);
        if (a.op == Op::send_act || a.op == Op::send_grad) {
          sent[key] = t[su];
          continue;
        }
        const auto it = sent.find(key);
        if (it == sent.end()) break;  // blocked until the peer sends
        t[su] = std::max(t[su], it->second + latency);
      }
    }
  }
  for (int s = 0; s < P; ++s) {
    if (pos[static_cast<std::size_t>(s)] != lists[static_cast<std::size_t>(s)].size()) {
      std::fprintf(stderr, "bench_pipeline: replay of %s deadlocked on stage %d\n",
                   schedule_name(spec.kind), s);
      std::exit(1);
    }
    r.makespan = std::max(r.makespan, t[static_cast<std::size_t>(s)]);
  }
  return r;
}

std::vector<double> replay_bubbles(const Replay& r) {
  std::vector<double> b;
  for (double busy : r.busy) b.push_back(1.0 - busy / r.makespan);
  return b;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

// One JSON object on one line; each figure rounded to the decimals it is good for (0: an integer).
struct JsonLine {
  Json j = Json::object();
  static Json fixed(double v, int decimals) {
    if (decimals == 0) return std::llround(v);
    const double scale = std::pow(10.0, decimals);
    return std::round(v * scale) / scale;
  }
  JsonLine& text(const std::string& k, const std::string& v) {
    j[k] = v;
    return *this;
  }
  JsonLine& num(const std::string& k, double v, int decimals = 0) {
    j[k] = fixed(v, decimals);
    return *this;
  }
  JsonLine& array(const std::string& k, const std::vector<double>& v, int decimals) {
    Json& a = j[k] = Json::array();
    for (double x : v) a.push_back(fixed(x, decimals));
    return *this;
  }
};

// One micro-batch's activation bytes of each chunk of `stage` (a one-slot model per chunk).
std::vector<double> chunk_bytes(const model::GptConfig& cfg, const Args& a,
                                const ScheduleSpec& spec, const std::vector<LayerRange>& pieces,
                                int stage) {
  const auto chunks = stage_chunks(pieces, spec.pp, stage);
  std::vector<double> out;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    model::ModelLayout l;
    l.chunks = {chunks[c]};
    l.has_embedding = stage == 0 && c == 0;
    l.has_head = stage == spec.pp - 1 && c + 1 == chunks.size();
    l.n_slots = 1;
    model::Gpt m(cfg, a.micro_batch, a.seq_len, l);
    out.push_back(static_cast<double>(m.activation_bytes()));
  }
  return out;
}

void run_config(const Args& a, const model::GptConfig& cfg, ScheduleKind kind, int n_micro,
                comm::Communicator& ppc, MPI_Comm pp_comm) {
  const int P = ppc.size(), stage = ppc.rank();
  const ScheduleSpec spec{kind, P, n_micro, kind == ScheduleKind::interleaved ? a.chunks : 1};
  const auto pieces = partition(spec, cfg, a.seq_len);
  model::Gpt m(cfg, a.micro_batch, a.seq_len, pipeline_layout(spec, pieces, stage));
  m.init_parameters(1);
  PipelineRunner<float> runner(m, ppc, spec, stage);
  const int N = a.micro_batch * a.seq_len;
  auto tokens = alloc<std::int32_t>("bench.tokens", static_cast<std::size_t>(N));
  auto targets = alloc<std::int32_t>("bench.targets", static_cast<std::size_t>(N));
  fill_random(tokens, static_cast<std::uint64_t>(cfg.vocab_size), "bench.tokens");
  fill_random(targets, static_cast<std::uint64_t>(cfg.vocab_size), "bench.targets");
  const float scale = 1.0f / static_cast<float>(N * n_micro);

  // Each chunk's forward and backward of one micro-batch, this rank running alone; process CPU
  // time, least of `reps`: other jobs on the machine only ever add to it.
  const int V = spec.chunks, reps = 8;
  std::vector<double> fwd(static_cast<std::size_t>(V)), bwd(static_cast<std::size_t>(V));
  {
    auto x = alloc<float>("bench.x", m.activation_elems());
    auto dy = alloc<float>("bench.dy", m.activation_elems());
    fill_random(x, 0, "bench.x");
    fill_random(dy, 0, "bench.dy");
    for (int turn = 0; turn < P; ++turn) {
      if (turn == stage) {
        for (int c = 0; c < V; ++c) {
          std::vector<double> f, b;
          for (int r = 0; r <= reps; ++r) {  // r = 0: warm-up
            double t = cpu_seconds();
            m.forward(c, 0, tokens, x, targets, scale);
            m.exec().fence();
            if (r) f.push_back(cpu_seconds() - t);
            t = cpu_seconds();
            m.backward(c, 0, dy);
            m.exec().fence();
            if (r) b.push_back(cpu_seconds() - t);
          }
          fwd[static_cast<std::size_t>(c)] = *std::min_element(f.begin(), f.end());
          bwd[static_cast<std::size_t>(c)] = *std::min_element(b.begin(), b.end());
        }
      }
      sleeping_barrier(pp_comm);
    }
  }
  // One activation message between stages 0 and 1, the others asleep: half the round trip.
  double latency = 0;
  if (P > 1) {
    auto buf = alloc<float>("bench.message", m.activation_elems());
    const int n = static_cast<int>(m.activation_elems()), iters = 20;
    std::vector<double> rt;
    if (stage < 2)
      for (int i = 0; i < iters + 5; ++i) {
        Timer t;
        if (stage == 0) {
          MPI_Send(buf.data(), n, MPI_FLOAT, 1, 7, pp_comm);
          MPI_Recv(buf.data(), n, MPI_FLOAT, 1, 7, pp_comm, MPI_STATUS_IGNORE);
        } else {
          MPI_Recv(buf.data(), n, MPI_FLOAT, 0, 7, pp_comm, MPI_STATUS_IGNORE);
          MPI_Send(buf.data(), n, MPI_FLOAT, 0, 7, pp_comm);
        }
        if (i >= 5) rt.push_back(t.seconds());
      }
    latency = median(rt) / 2;  // used on stage 0
    sleeping_barrier(pp_comm);
  }

  // The pipelined steps.
  std::vector<double> idle, wall, comp;
  for (int step = 0; step < a.warmup + a.steps; ++step) {
    m.zero_grads();
    m.reset_loss_sum();
    m.exec().fence();
    MPI_Barrier(pp_comm);
    const PipelineStepStats st =
        runner.step([&](int) { return MicroBatch{tokens, targets}; }, scale);
    if (step >= a.warmup) {
      idle.push_back(st.idle_s);
      wall.push_back(st.wall_s);
      comp.push_back(st.compute_s);
    }
  }

  // Gather per-step figures and per-chunk costs on rank 0.
  const int S = a.steps;
  std::vector<double> mine;
  for (const auto* v : {&idle, &wall, &comp}) mine.insert(mine.end(), v->begin(), v->end());
  mine.insert(mine.end(), fwd.begin(), fwd.end());
  mine.insert(mine.end(), bwd.begin(), bwd.end());
  const auto per_rank = static_cast<int>(mine.size());
  std::vector<double> all(static_cast<std::size_t>(per_rank * P));
  MPI_Gather(mine.data(), per_rank, MPI_DOUBLE, all.data(), per_rank, MPI_DOUBLE, 0, pp_comm);

  // Memory: allocated, per micro-batch, in flight, and the live peak along the action list.
  const std::vector<double> cb = chunk_bytes(cfg, a, spec, pieces, stage);
  // Also each chunk's own peak: what slot counts per chunk (instead of one count for every
  // chunk, the peak over chunks) would allocate.
  double live = 0, peak = 0;
  std::vector<int> live_c(static_cast<std::size_t>(V), 0), peak_c(live_c);
  for (const Action& act : runner.actions()) {
    const auto c = static_cast<std::size_t>(act.chunk);
    const int d = act.op == Op::forward ? 1 : act.op == Op::backward ? -1 : 0;
    live += d * cb[c];
    live_c[c] += d;
    peak = std::max(peak, live);
    peak_c[c] = std::max(peak_c[c], live_c[c]);
  }
  double micro_bytes = 0, per_chunk_slots = 0;
  for (int c = 0; c < V; ++c) {
    micro_bytes += cb[static_cast<std::size_t>(c)];
    per_chunk_slots += peak_c[static_cast<std::size_t>(c)] * cb[static_cast<std::size_t>(c)];
  }
  constexpr int kMem = 6;
  const double mem[kMem] = {static_cast<double>(m.activation_bytes()), micro_bytes / V,
                            static_cast<double>(max_in_flight(spec, stage)), peak,
                            static_cast<double>(runner.n_slots()), per_chunk_slots};
  std::vector<double> mem_all(static_cast<std::size_t>(kMem * P));
  MPI_Gather(mem, kMem, MPI_DOUBLE, mem_all.data(), kMem, MPI_DOUBLE, 0, pp_comm);
  if (stage != 0) return;

  auto at = [&](int s, int k) { return all[static_cast<std::size_t>(s * per_rank + k)]; };
  std::vector<double> bubble(static_cast<std::size_t>(P)), step_s, busy_bubble, dilation;
  std::vector<double> overhead;  // neither waiting nor in the model: copies, posting messages
  std::vector<std::vector<double>> F(static_cast<std::size_t>(P)), B(F);
  double alone = 0;  // one step's compute, every action run alone, summed over stages
  for (int s = 0; s < P; ++s) {
    std::vector<double> r;
    std::vector<double> o;
    for (int i = 0; i < S; ++i) {
      r.push_back(at(s, i) / at(s, S + i));
      o.push_back(1.0 - (at(s, i) + at(s, 2 * S + i)) / at(s, S + i));
    }
    bubble[static_cast<std::size_t>(s)] = median(r);
    overhead.push_back(median(o));
    for (int c = 0; c < V; ++c) {
      F[static_cast<std::size_t>(s)].push_back(at(s, 3 * S + c));
      B[static_cast<std::size_t>(s)].push_back(at(s, 3 * S + V + c));
      alone += n_micro * (at(s, 3 * S + c) + at(s, 3 * S + V + c));
    }
  }
  for (int i = 0; i < S; ++i) {
    double w = 0, c = 0;
    for (int s = 0; s < P; ++s) {
      w = std::max(w, at(s, S + i));
      c += at(s, 2 * S + i);
    }
    step_s.push_back(w);
    busy_bubble.push_back(1.0 - c / (P * w));
    dilation.push_back(c / alone);
  }
  const Replay rp = replay(spec, F, B, latency);
  std::vector<std::vector<double>> uf(static_cast<std::size_t>(P),
                                      std::vector<double>(static_cast<std::size_t>(V), 1.0));
  std::vector<std::vector<double>> ub(uf);
  for (auto& row : ub) std::fill(row.begin(), row.end(), 2.0);
  const Replay uniform = replay(spec, uf, ub);
  auto mem_col = [&](int k, double unit) {
    std::vector<double> v;
    for (int s = 0; s < P; ++s) v.push_back(mem_all[static_cast<std::size_t>(kMem * s + k)] / unit);
    return v;
  };
  const double MiB = 1048576.0;
  std::vector<double> cost_ms;
  for (int s = 0; s < P; ++s) {
    double c = 0;
    for (int k = 0; k < V; ++k)
      c += F[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)] +
           B[static_cast<std::size_t>(s)][static_cast<std::size_t>(k)];
    cost_ms.push_back(1e3 * c);
  }
  JsonLine j;
  j.text("bench", "pipeline").text("schedule", schedule_name(kind));
  j.num("pp", P).num("v", V).num("m", n_micro).num("n_layer", cfg.n_layer);
  j.num("n_embd", cfg.n_embd).num("n_head", cfg.n_head).num("vocab", cfg.vocab_size);
  j.num("seq_len", a.seq_len).num("micro_batch", a.micro_batch).text("layers", to_string(pieces));
  j.num("steps", S).num("warmup", a.warmup);
  j.num("bubble_analytic", analytic_bubble(spec), 4);
  j.array("bubble_measured", bubble, 4).num("bubble_measured_mean", mean(bubble), 4);
  j.num("bubble_busy", median(busy_bubble), 4);
  j.array("bubble_replay", replay_bubbles(rp), 4);
  j.num("bubble_replay_mean", mean(replay_bubbles(rp)), 4);
  j.num("bubble_replay_uniform", mean(replay_bubbles(uniform)), 4);
  j.num("step_ms", 1e3 * median(step_s), 2).num("replay_step_ms", 1e3 * rp.makespan, 2);
  j.num("message_us", 1e6 * latency, 1).num("compute_dilation", median(dilation), 3);
  j.num("runner_overhead", mean(overhead), 4).array("stage_fb_ms_alone", cost_ms, 2);
  j.array("n_slots", mem_col(4, 1), 0).array("in_flight", mem_col(2, 1), 0);
  j.array("act_micro_MiB", mem_col(1, MiB), 3);
  j.array("act_alloc_MiB", mem_col(0, MiB), 3).array("act_peak_MiB", mem_col(3, MiB), 3);
  j.array("act_chunk_slots_MiB", mem_col(5, MiB), 3);
  std::printf("%s\n", json::dump(j.j).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  meshtrain::comm::set_flight_world(MPI_COMM_WORLD);  // world ranks in flight dumps
  {
    const Args a = parse(argc, argv);
    kc::initialize(-1);
    {
      int world = 1;
      MPI_Comm_size(MPI_COMM_WORLD, &world);
      mesh::ProcessMesh pm(MPI_COMM_WORLD, mesh::Shape{1, world, 1});
      auto ppc = comm::make_communicator(comm::default_backend(), pm.pp().get());
      model::GptConfig cfg;
      cfg.n_layer = a.n_layer;
      cfg.n_embd = a.n_embd;
      cfg.n_head = a.n_head;
      cfg.vocab_size = a.vocab;
      cfg.block_size = a.seq_len;
      for (const std::string& name : a.schedules)
        for (int m : a.micro) {
          const ScheduleKind kind = parse_schedule_kind(name);
          if (kind == ScheduleKind::interleaved && m % world != 0) continue;  // Megatron's rule
          run_config(a, cfg, kind, m, *ppc, pm.pp().get());
        }
    }
    Kokkos::finalize();
  }
  MPI_Finalize();
  return 0;
}
