// `meshtrain doctor RUN_DIR`: reading a run's folder and the planner's prediction for it
// (app/doctor.hpp); the findings are doctor_findings.cpp's.
#include "meshtrain/app/doctor.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "meshtrain/app/options.hpp"
#include "meshtrain/app/subcommands.hpp"
#include "meshtrain/app/train_cmd.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/plan/calibration.hpp"

namespace meshtrain::app {

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p, const char* what) {
  std::ifstream in(p);
  if (!in) throw ConfigError(cat(p.string(), ": cannot be read (", what, ")"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

double number_or(const Json& r, const char* key, double dflt, bool* finite = nullptr) {
  const Json* v = json::find(r, key);
  if (!v || v->is_null()) {
    // null is the metrics writer's non-finite number (listed in "nonfinite").
    if (finite && v) *finite = false;
    return dflt;
  }
  return v->is_number() ? v->get<double>() : dflt;
}

void read_metrics(RunData& r, const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw ConfigError(cat(file.string(), ": cannot be read (the run's metrics; "
                                 "train.metrics)"));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    const Json j = json::parse(line, cat(file.string(), " line ", n));
    if (json::find(j, "val_loss")) {
      r.val_loss.emplace_back(j["step"].get<std::int64_t>(), number_or(j, "val_loss", NAN));
    } else if (json::find(j, "loss") && json::find(j, "step")) {
      StepRecord s;
      s.step = j["step"].get<std::int64_t>();
      s.loss = number_or(j, "loss", NAN, &s.loss_finite);
      s.grad_norm = number_or(j, "grad_norm", NAN, &s.grad_finite);
      s.lr = number_or(j, "lr", 0);
      s.step_ms = number_or(j, "step_ms", 0);
      s.tokens_per_s = number_or(j, "tokens_per_s", 0);
      s.mfu = number_or(j, "mfu", 0);
      s.loss_scale = number_or(j, "loss_scale", 1);
      s.bubble = number_or(j, "bubble", 0);
      s.comm_ms = number_or(j, "comm_ms", 0);
      s.comm_hidden = number_or(j, "comm_hidden", 0);
      s.tp_comm_ms = number_or(j, "tp_comm_ms", 0);
      s.memory_bytes = number_or(j, "memory_bytes", 0);
      s.skipped = number_or(j, "skipped", 0) != 0;
      s.checkpoint = json::find(j, "checkpoint") != nullptr;
      if (const Json* moe = json::find(j, "moe"); moe && moe->is_array())
        for (const auto& l : *moe) s.a2a_ms += number_or(l, "a2a_ms", 0);
      // A resumed or rolled-back run logs a step again: the later record is the one that held.
      while (!r.steps.empty() && r.steps.back().step >= s.step) r.steps.pop_back();
      r.steps.push_back(s);
    }
  }
}

FlightDump read_flight(const fs::path& file) {
  const Json j = json::parse(read_text(file, "a flight dump"), file.string());
  FlightDump d;
  d.rank = static_cast<int>(json::as_int(json::at(j, "rank", file.string()), file.string()));
  d.reason = j.value("reason", "");
  for (const auto& c : j.value("communicators", Json::array())) {
    FlightComm fc;
    fc.name = c.value("name", "");
    fc.world_ranks = c.value("world_ranks", std::vector<int>{});
    fc.issued = c.value("issued", std::uint64_t{0});
    for (const auto& e : c.value("entries", Json::array()))
      fc.entries.push_back(FlightComm::Entry{e.value("seq", std::uint64_t{0}), e.value("op", ""),
                                             e.value("state", ""), e.value("bytes", std::size_t{0}),
                                             e.value("peer", -1)});
    d.comms.push_back(std::move(fc));
  }
  return d;
}

plan::Layout layout_of(const po::variables_map& vm, int world) {
  plan::Layout l;
  const mesh::Shape s = mesh_shape(vm, world);
  l.dp = s.dp, l.pp = s.pp, l.tp = s.tp, l.ep = s.ep, l.cp = s.cp;
  l.cp_all_gather = vm.count("cp.comm") && vm["cp.comm"].as<std::string>() == "all_gather";
  l.zero_stage = vm["zero.stage"].as<int>();
  l.offload = vm["zero.offload_optimizer"].as<std::string>() == "cpu";
  l.micro_batch = vm["train.micro_batch"].as<int>();
  l.n_micro = vm["train.grad_accum"].as<int>();
  l.schedule = l.pp > 1 ? parallel::parse_schedule_kind(vm["pp.schedule"].as<std::string>())
                        : parallel::ScheduleKind::one_f_one_b;
  l.virtual_chunks = l.schedule == parallel::ScheduleKind::interleaved
                         ? vm["pp.virtual_chunks"].as<int>() : 1;
  l.sequence_parallel = vm["tp.sequence_parallel"].as<bool>();
  l.recompute = vm["train.recompute"].as<bool>();
  l.recompute_mlp_act = vm["train.recompute_mlp_act"].as<bool>();
  l.precision = plan::parse_precision(model_precision(vm["train.precision"].as<std::string>()));
  l.bucket_bytes = static_cast<std::size_t>(vm["dp.bucket_mb"].as<double>() * 1048576.0);
  return l;
}

Prediction predict(const RunData& r, const std::string& cal_path) {
  Prediction p;
  p.calibration = cal_path;
  const std::string err = plan::layout_error(r.model, r.seq_len, r.layout);
  if (!err.empty()) {
    p.why_not = err;
    return p;
  }
  const plan::Calibration cal = plan::load_calibration(cal_path);
  plan::Cluster cluster;
  cluster.world = r.world;
  cluster.gpus_per_node = std::max(1, r.ranks_per_node);
  cluster.memory_bytes = cal.device_memory_gib * 1073741824.0;
  plan::MemoryTarget t;
  t.device_is_host = cal.device == "cpu";
  t.runtime_bytes = cal.runtime_bytes;
  t.cudnn_attention = cal.device == "gpu";
  p.host_memory = t.device_is_host;
  p.cost = plan::step_cost(r.model, r.seq_len, r.layout, cluster, cal);
  p.stages = plan::memory_per_stage(r.model, r.seq_len, r.layout, t);
  p.valid = true;
  // The memory finding's alternative: twice the tensor-parallel size on the same ranks.
  plan::Layout l2 = r.layout;
  l2.tp *= 2;
  if (l2.dp % 2 == 0 && plan::layout_error(r.model, r.seq_len, (l2.dp /= 2, l2)).empty()) {
    p.tp2_valid = true;
    for (const auto& m : plan::memory_per_stage(r.model, r.seq_len, l2, t))
      p.tp2_peak = std::max(p.tp2_peak, p.host_memory ? m.total() : m.device());
  }
  return p;
}

}  // namespace

RunData load_run(const std::string& dir) {
  RunData r;
  r.dir = dir;
  const fs::path d(dir);
  if (!fs::is_directory(d))
    throw ConfigError(cat("doctor: '", dir, "' is not a folder (a run's train.out_dir)"));
  if (!fs::exists(d / "config.ini"))
    throw ConfigError(cat("doctor: '", dir, "' has no config.ini: not the train.out_dir of a run "
                          "(`meshtrain train` writes config.ini and run.json there before "
                          "step 1)"));
  if (fs::exists(d / "run.json")) {
    const Json j =
        json::parse(read_text(d / "run.json", "the run's job"), (d / "run.json").string());
    r.world = j.value("world", 1);
    r.ranks_per_node = j.value("ranks_per_node", 1);
    r.devices_per_node = j.value("devices_per_node", 0);
    r.gpu = j.value("device", "host") == "gpu";
    r.memory_capacity = j.value("memory_capacity_bytes", 0.0);
  }
  const config::Parsed p =
      config::parse({"--config", (d / "config.ini").string()}, train_options());
  const po::variables_map& vm = p.vm;
  r.model = model_config(vm);
  r.seq_len = vm["train.seq_len"].as<int>();
  if (r.seq_len == 0) r.seq_len = r.model.block_size;
  r.layout = layout_of(vm, r.world);
  r.dp_overlap = vm["dp.overlap"].as<bool>();
  const std::string scaling = vm["train.loss_scaling"].as<std::string>();
  r.loss_scaling = scaling == "on" || scaling == "static" ||
                   (scaling == "auto" && r.layout.precision == plan::Precision::fp16);
  r.on_nonfinite = vm["train.on_nonfinite"].as<std::string>();
  r.steps_planned = vm["train.steps"].as<long long>();
  // The metrics file is where the run wrote it: its own folder, or train.metrics.
  fs::path metrics = d / "metrics.jsonl";
  const std::string m = vm["train.metrics"].as<std::string>();
  if (!fs::exists(metrics) && !m.empty()) metrics = m;
  read_metrics(r, metrics);
  // Every rank's peak, written at the end of a run that reached it.
  if (fs::exists(d / "memory.json")) {
    const Json j = json::parse(read_text(d / "memory.json", "the ranks' peak memory"),
                               (d / "memory.json").string());
    for (const auto& x : j.value("memory_per_rank", Json::array()))
      r.memory_per_rank.push_back(x.get<double>());
    r.memory_capacity = j.value("memory_capacity_bytes", r.memory_capacity);
  }
  std::vector<fs::path> dumps;
  for (const auto& e : fs::directory_iterator(d)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("flight_", 0) == 0 && e.path().extension() == ".json") dumps.push_back(e.path());
  }
  std::sort(dumps.begin(), dumps.end());
  for (const auto& f : dumps) r.flights.push_back(read_flight(f));
  return r;
}

po::options_description doctor_options() {
  po::options_description d;
  d.add(config::generic_options());
  po::options_description o("Doctor [doctor] (meshtrain doctor RUN_DIR [options])");
  o.add_options()
      ("doctor.run", po::value<std::string>()->default_value(""),
       "the run's folder (train.out_dir); also the first argument")
      ("doctor.calibration", po::value<std::string>()->default_value(""),
       "the planner's calibration for the prediction; default inputs/plan/cpu.json for a CPU "
       "run, inputs/plan/h200.json for a GPU run");
  d.add(o).add(log_options());
  return d;
}

int cmd_doctor(Runtime& rt, const std::vector<std::string>& args) {
  std::vector<std::string> rest = args;
  std::string dir;
  if (!rest.empty() && rest.front().rfind("-", 0) != 0) {
    dir = rest.front();
    rest.erase(rest.begin());
  }
  const config::Parsed p = config::parse(rest, doctor_options());
  logging::set_context(log_context(p.vm, rt.rank()));
  if (dir.empty()) dir = p.vm["doctor.run"].as<std::string>();
  MESHTRAIN_CONFIG_CHECK(!dir.empty(), "doctor: name the run's folder: meshtrain doctor RUN_DIR");
  if (rt.rank() != 0) return kExitOk;  // one reader; the others have nothing to add
  const RunData run = load_run(dir);
  std::string cal = p.vm["doctor.calibration"].as<std::string>();
  if (cal.empty()) cal = run.gpu ? "inputs/plan/h200.json" : "inputs/plan/cpu.json";
  const Prediction pred = predict(run, cal);
  const plan::Layout& l = run.layout;
  std::cout << "meshtrain doctor: " << dir << "\nrun: " << run.world << " rank(s), "
            << l.name() << "; " << run.steps.size() << " step(s) logged of "
            << run.steps_planned << ", " << run.flights.size() << " flight dump(s)\n";
  int problems = 0, i = 0;
  for (const Finding& f : diagnose(run, pred)) {
    std::cout << ++i << ". " << f.topic << (f.problem ? " [!]" : " [ok]") << ": " << f.text
              << "\n";
    if (f.problem) {
      ++problems;
      std::cout << "   -> " << f.advice << "\n";
    }
  }
  std::cout << (problems ? cat(problems, " finding(s) of the troubleshooting table")
                         : std::string("nothing from the troubleshooting table"))
            << "\n" << std::flush;
  return kExitOk;
}

}  // namespace meshtrain::app
