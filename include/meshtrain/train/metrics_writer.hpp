#pragma once
// The JSON-lines metrics file (train.metrics): written by world rank 0 alone, one JSON object
// per line, flushed after every line, so a reader (perf/scaling, a plot) never sees a torn
// record. Every value is valid JSON: a non-finite number becomes null and its key is listed in
// the record's "nonfinite" array. A failed write warns (once until writing works again) and
// training goes on.
#include <cstdint>
#include <cstdio>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace meshtrain::train {

struct StepMetrics;

class MetricsWriter {
 public:
  MetricsWriter() = default;  // writes nothing
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Opens `path` on the writer rank (others keep a writer that writes nothing): appended to
  // when `append` (a resumed run keeps its earlier records), truncated otherwise. ConfigError
  // naming the file and the cause when it cannot be opened.
  void open(const std::string& path, bool writer, bool append);
  bool active() const { return file_ != nullptr; }
  explicit operator bool() const { return active(); }
  const std::string& path() const { return path_; }

  // `record` in the order its keys should appear; written as {"key": value, ...}.
  void write(const nlohmann::ordered_json& record);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  bool failing_ = false;
};

// The step record the scaling driver reads (DESIGN, "Metrics contract").
nlohmann::ordered_json step_record(const StepMetrics& m, int ranks, std::int64_t tokens_per_step);

}  // namespace meshtrain::train
