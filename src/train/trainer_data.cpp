// The trainer's data sources (issue 38): what each source has supplied, its epochs, the record
// a checkpoint keeps of them, and evaluation on each source's validation shards. The data order
// itself is io::BlendedDataset's, a function of (seed, data batch, sequence) only.
#include <cmath>
#include <cstdio>

#include "meshtrain/core/json.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::train {

namespace {
constexpr const char* kDataKey = "data.sources";  // checkpoint attribute extra.data.sources
}

template <class T>
void TrainerT<T>::describe_data() const {
  if (!data_.blended()) return;
  const auto& sources = data_.sources();
  const double run_sequences =
      static_cast<double>(cfg_.steps) * static_cast<double>(engine_.global_batch());
  logging::info("data: a blend of ", sources.size(), " sources; each sequence's source follows "
                "from its place in the data order (seed ", cfg_.seed, ")");
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const io::DataSource& s = sources[i];
    const double realised = static_cast<double>(data_.schedule().per_period(static_cast<int>(i))) /
                            io::kBlendPeriod;
    char line[256];
    std::snprintf(line, sizeof line,
                  "  %s: weight %.4f, %llu windows in %zu shard(s), %.2f epochs over %lld steps",
                  s.name.c_str(), realised, static_cast<unsigned long long>(s.train->num_windows()),
                  s.train->files().size(),
                  run_sequences * realised / static_cast<double>(s.train->num_windows()),
                  static_cast<long long>(cfg_.steps));
    logging::info(line, s.val ? cat(", validation ", s.val->num_windows(), " windows")
                              : std::string(", no validation shards"));
  }
}

template <class T>
void TrainerT<T>::report_epochs(std::int64_t step, const std::vector<std::uint64_t>& before,
                                const std::vector<std::uint64_t>& after) const {
  for (std::size_t i = 0; i < after.size(); ++i) {
    const io::DataSource& s = data_.sources()[i];
    const std::uint64_t n = s.train->num_windows();
    if (after[i] / n == before[i] / n) continue;
    const std::string who = data_.blended() ? cat("source '", s.name, "' (data.blend)")
                                            : std::string("the training data (data.train)");
    logging::info("data: ", who, " completed epoch ", after[i] / n, " at step ", step + 1, " (",
                  n, " windows each); sequences now come from epoch ", after[i] / n + 1,
                  ", in a new order");
  }
}

template <class T>
std::string TrainerT<T>::data_record(std::int64_t steps_done) const {
  const int gb = engine_.global_batch();
  const std::vector<std::uint64_t> drawn =
      data_.drawn(io::batch_of_step(steps_done, skipped_batches_), gb);
  Json sources = Json::array();
  for (std::size_t i = 0; i < drawn.size(); ++i) {
    const io::DataSource& s = data_.sources()[i];
    sources.push_back(Json{{"name", s.name},
                           {"weight", s.weight},
                           {"sequences", drawn[i]},
                           {"tokens", drawn[i] * static_cast<std::uint64_t>(cfg_.seq_len)},
                           {"windows", s.train->num_windows()}});
  }
  return json::dump(Json{{"blend", data_.blended()}, {"sources", sources}});
}

template <class T>
void TrainerT<T>::restore_data(const io::CheckpointAttributes& a) {
  const int gb = engine_.global_batch();
  const std::int64_t batch = io::batch_of_step(a.step, skipped_batches_);
  const auto& sources = data_.sources();
  // What an uninterrupted run of this blend would have drawn by now.
  std::vector<std::uint64_t> pure(sources.size());
  for (std::size_t i = 0; i < sources.size(); ++i)
    pure[i] = data_.schedule().count_before(static_cast<int>(i),
                                            static_cast<std::uint64_t>(batch) * gb);
  const auto it = a.extra.find(kDataKey);
  if (it == a.extra.end()) {  // saved before sources were recorded: the data order as it was
    data_.resume(batch, gb, pure);
    return;
  }
  const Json rec = json::parse(it->second, cat(a.path, ": attribute extra.", kDataKey));
  std::vector<std::uint64_t> base(sources.size(), 0);
  bool same = json::at(rec, "sources", kDataKey).size() == sources.size();
  for (const Json& r : json::at(rec, "sources", kDataKey)) {
    const std::string& name = json::as_string(json::at(r, "name", kDataKey), kDataKey);
    std::size_t i = 0;
    while (i < sources.size() && sources[i].name != name) ++i;
    if (i == sources.size()) {
      same = false;
      logging::warn("data: the checkpoint's source '", name, "' is not part of this run's data");
      continue;
    }
    base[i] = static_cast<std::uint64_t>(json::as_int(json::at(r, "sequences", kDataKey), kDataKey));
    same = same && json::as_number(json::at(r, "weight", kDataKey), kDataKey) == sources[i].weight;
  }
  data_.resume(batch, gb, base);
  if (!same || base != pure) {
    std::string counts;
    for (std::size_t i = 0; i < sources.size(); ++i)
      counts += cat(i ? ", " : "", sources[i].name, " ", base[i]);
    logging::info("data: the sources or weights differ from the checkpoint's; each source "
                  "continues after the sequences it had supplied (", counts, ")");
  }
}

template <class T>
EvalLosses TrainerT<T>::evaluate_sources() {
  EvalLosses e;
  const auto& sources = data_.sources();
  e.by_source.assign(sources.size(), NAN);
  double weight = 0, sum = 0;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const io::TokenDataset* val = sources[i].val;
    if (!val) continue;
    const auto batch = [&](int first, int count, std::int32_t* in, std::int32_t* tg) {
      val->fill_sequential(static_cast<std::uint64_t>(first), count, in, tg);
    };
    e.by_source[i] = engine_.evaluate(batch, cfg_.eval_batches);
    weight += sources[i].weight;
    sum += sources[i].weight * static_cast<double>(e.by_source[i]);
  }
  e.loss = weight > 0 ? static_cast<float>(sum / weight) : NAN;
  return e;
}

template <class T>
void TrainerT<T>::log_eval(std::int64_t step, const EvalLosses& e, bool final) {
  Json record{{"step", step}, {"val_loss", e.loss}};
  std::string by;
  if (data_.blended()) {
    Json per = Json::object();
    for (std::size_t i = 0; i < e.by_source.size(); ++i) {
      if (std::isnan(e.by_source[i])) continue;
      per[data_.sources()[i].name] = e.by_source[i];
      by += cat(by.empty() ? " (" : ", ", data_.sources()[i].name, " ", e.by_source[i]);
    }
    if (!by.empty()) by += ")";
    record["val_loss_by_source"] = per;
  }
  if (final) logging::info("final val loss ", e.loss, by, " (", cfg_.eval_batches, " batches)");
  else logging::info("step ", step, " | val loss ", e.loss, by);
  metrics_.write(record);
  tensorboard_.scalars(step, {{"eval/loss", e.loss}});
}

#define MESHTRAIN_TRAINER_DATA(T)                                                            \
  template void TrainerT<T>::describe_data() const;                                          \
  template void TrainerT<T>::report_epochs(std::int64_t, const std::vector<std::uint64_t>&,  \
                                           const std::vector<std::uint64_t>&) const;         \
  template std::string TrainerT<T>::data_record(std::int64_t) const;                         \
  template void TrainerT<T>::restore_data(const io::CheckpointAttributes&);                  \
  template EvalLosses TrainerT<T>::evaluate_sources();                                       \
  template void TrainerT<T>::log_eval(std::int64_t, const EvalLosses&, bool);
MESHTRAIN_TRAINER_DATA(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_TRAINER_DATA(bf16)
MESHTRAIN_TRAINER_DATA(fp16)
#endif
#undef MESHTRAIN_TRAINER_DATA

}  // namespace meshtrain::train
