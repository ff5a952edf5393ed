#include "meshtrain/train/metrics_writer.hpp"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include "meshtrain/core/json.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::train {

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::open(const std::string& path, bool writer, bool append) {
  path_ = path;
  if (file_) std::fclose(file_);
  file_ = nullptr;
  if (!writer || path.empty()) return;
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_)
    throw ConfigError(cat("cannot write the metrics file '", path, "' (train.metrics): ",
                          std::strerror(errno), "; check that its folder exists and is writable"));
}

void MetricsWriter::write(const Json& record) {
  if (!file_) return;
  Json r = record;
  Json nonfinite = Json::array();
  for (auto it = r.begin(); it != r.end(); ++it)
    if (it->is_number_float() && !std::isfinite(it->get<double>())) {
      nonfinite.push_back(it.key());
      *it = nullptr;
    }
  if (!nonfinite.empty()) r["nonfinite"] = std::move(nonfinite);
  // One line, six significant digits (what the records held before they went through a JSON
  // library), Python's separators.
  const std::string line = json::dump(r, json::Style{0, 6}) + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), file_) == line.size() &&
                  std::fflush(file_) == 0;
  if (!ok && !failing_) {
    logging::warn("cannot write the metrics file '", path_, "': ", std::strerror(errno),
                  "; training goes on, records are lost until writing works again");
    std::clearerr(file_);
  } else if (!ok) {
    std::clearerr(file_);
  }
  failing_ = !ok;
}

namespace {

// A float as the double with the same shortest decimal form (1e-3f is written 0.001, not
// 0.0010000000474974513); non-finite values pass through, for write() to turn into null.
double shortest(float f) {
  if (!std::isfinite(f)) return static_cast<double>(f);
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

}  // namespace

Json step_record(const StepMetrics& m, int ranks, std::int64_t tokens_per_step) {
  Json r{{"step", m.step + 1},
         {"loss", shortest(m.loss)},
         {"lr", shortest(m.lr)},
         {"grad_norm", shortest(m.grad_norm)},
         {"step_ms", m.step_seconds * 1e3},
         {"tokens_per_s", m.tokens_per_second},
         {"tflops", m.tflops},
         {"mfu", m.mfu},
         {"memory_bytes", m.memory_bytes},
         {"loss_scale", shortest(m.loss_scale)},
         {"skipped", m.skipped ? 1 : 0},
         {"bubble", m.bubble},
         {"comm_ms", m.dp_comm_ms},
         {"comm_hidden", m.dp_hidden},
         {"tp_comm_ms", m.tp_comm_ms},
         {"ranks", ranks},
         {"tokens", (m.step + 1) * tokens_per_step}};
  if (m.fp8_share > 0) r["fp8_flops_share"] = m.fp8_share;
  if (!m.moe.empty()) {
    r["moe_aux"] = m.moe_aux;
    r["moe_z"] = m.moe_z;
    Json layers = Json::array();
    for (const auto& l : m.moe)
      layers.push_back(Json{{"layer", l.layer}, {"tokens_min", l.load_min},
                            {"tokens_max", l.load_max}, {"tokens_cv", l.load_cv},
                            {"dropped", l.dropped}, {"aux", l.aux}, {"z", l.z},
                            {"expert_ms", l.expert_ms}, {"a2a_ms", l.a2a_ms}});
    r["moe"] = layers;
  }
  // A step that saved a checkpoint says so: the scaling driver leaves its time out.
  if (m.ckpt_ms > 0) {
    r["checkpoint"] = 1;
    r["ckpt_ms"] = m.ckpt_ms;
  }
  // A step that ran while a background checkpoint write was in flight (ckpt.async).
  if (m.ckpt_writing) r["ckpt_writing"] = 1;
  return r;
}

}  // namespace meshtrain::train
