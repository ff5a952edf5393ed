#include "meshtrain/parallel/step_batch.hpp"

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

StepBatches::StepBatches(const Shape& shape, ExecSpace exec) : shape_(shape), exec_(exec) {
  MESHTRAIN_CHECK(shape_.micro_batch > 0 && shape_.seq_len > 0 && shape_.token_slots > 0,
                  "StepBatches: micro_batch=", shape_.micro_batch, ", seq_len=", shape_.seq_len,
                  ", token_slots=", shape_.token_slots);
  const std::size_t B = static_cast<std::size_t>(shape_.micro_batch);
  const std::size_t whole = B * static_cast<std::size_t>(shape_.seq_len);
  const bool rows = !shape_.positions.empty();
  local_ = rows ? B * shape_.positions.size() : whole;
  token_micro_.assign(static_cast<std::size_t>(shape_.token_slots), -1);
  if (!shape_.tokens && !shape_.targets) return;  // a middle stage reads nothing
  if (shape_.tokens)
    for (int k = 0; k < shape_.token_slots; ++k)
      tokens_.push_back(alloc<std::int32_t>("batch.tokens", local_));
  if (shape_.targets) targets_ = alloc<std::int32_t>("batch.targets", local_);
  if (rows) {  // whole sequences as the data layer writes them, this rank's rows beside them
    h_tokens_.push_back(HostView1<std::int32_t>("batch.host_tokens", whole));
    h_targets_ = HostView1<std::int32_t>("batch.host_targets", whole);
    if (shape_.tokens) h_token_rows_ = HostView1<std::int32_t>("batch.host_token_rows", local_);
    if (shape_.targets)
      h_target_rows_ = HostView1<std::int32_t>("batch.host_target_rows", local_);
    return;
  }
  // The data layer writes into the device buffers' mirrors: the buffers themselves in a host
  // build (no copy at all), else one host buffer per part, uploaded from.
  constexpr bool host_build =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;
  if (shape_.tokens) {
    if (host_build)
      for (const auto& t : tokens_) h_tokens_.push_back(Kokkos::create_mirror_view(t));
    else
      h_tokens_.push_back(HostView1<std::int32_t>("batch.host_tokens", local_));
  }
  if (shape_.targets) h_targets_ = Kokkos::create_mirror_view(targets_);
  if (!shape_.tokens || !shape_.targets)  // the sequences' other half, which is not read here
    h_unread_ = HostView1<std::int32_t>("batch.host_unread", whole);
}

void StepBatches::begin(const BatchSource& source, std::function<int(int)> first) {
  source_ = &source;
  first_ = std::move(first);
  token_micro_.assign(token_micro_.size(), -1);
  target_micro_ = host_micro_ = -1;
}

void StepBatches::end() {
  source_ = nullptr;
  first_ = nullptr;
}

void StepBatches::produce(int micro) {
  MESHTRAIN_CHECK(source_ != nullptr, "StepBatches::get(", micro, ") outside a pass");
  const std::size_t slot = static_cast<std::size_t>(micro % shape_.token_slots);
  const bool rows = !shape_.positions.empty();
  // Whole sequences under context parallelism; else the mirror of each part read (the slot's
  // own for the tokens in a host build) and the scratch for a part not read.
  std::int32_t* tokens = h_unread_.data();
  std::int32_t* targets = h_unread_.data();
  if (rows || shape_.tokens) tokens = h_tokens_[h_tokens_.size() == 1 ? 0 : slot].data();
  if (rows || shape_.targets) targets = h_targets_.data();
  (*source_)(first_(micro), shape_.micro_batch, tokens, targets);
  host_micro_ = micro;
  ++produced_;
}

void StepBatches::upload(View1<std::int32_t> dst, HostView1<std::int32_t> whole,
                         HostView1<std::int32_t> rows) {
  ++uploads_;
  if (shape_.positions.empty()) {
    // The host filled the buffer while the device may still run the previous micro-batch;
    // deep_copy on the instance orders the upload after it (a no-op where they are one buffer).
    Kokkos::deep_copy(exec_, dst, whole);
    return;
  }
  // Context parallelism: the rows at this rank's positions (its two chunks) of each sequence.
  const std::vector<int>& pos = shape_.positions;
  const std::size_t len = static_cast<std::size_t>(shape_.seq_len), Tl = pos.size();
  for (std::size_t b = 0; b < static_cast<std::size_t>(shape_.micro_batch); ++b)
    for (std::size_t t = 0; t < Tl; ++t)
      rows(b * Tl + t) = whole(b * len + static_cast<std::size_t>(pos[t]));
  Kokkos::deep_copy(exec_, dst, rows);
}

StepBatch StepBatches::get(int micro) {
  const std::size_t slot = static_cast<std::size_t>(micro % shape_.token_slots);
  const bool tokens = shape_.tokens && token_micro_[slot] != micro;
  const bool targets = shape_.targets && target_micro_ != micro;
  if ((tokens || targets) && host_micro_ != micro) produce(micro);
  if (tokens) {
    const std::size_t h = h_tokens_.size() == 1 ? 0 : slot;
    upload(tokens_[slot], h_tokens_[h], h_token_rows_);
    token_micro_[slot] = micro;
  }
  if (targets) {
    upload(targets_, h_targets_, h_target_rows_);
    target_micro_ = micro;
  }
  StepBatch sb;
  if (shape_.tokens) sb.tokens = tokens_[slot];
  if (shape_.targets) sb.targets = targets_;
  return sb;
}

}  // namespace meshtrain::parallel
