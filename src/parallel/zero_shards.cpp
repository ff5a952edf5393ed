#include "meshtrain/parallel/zero_shards.hpp"

#include <algorithm>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/timer.hpp"

namespace meshtrain::parallel {

template <class T>
ZeroShards<T>::ZeroShards(const model::ParameterRegistry& reg, ZeroPartition part, int zero_stage,
                          View1<T> params, comm::Communicator& replicas, ExecSpace exec,
                          comm::Communicator* expert_replicas)
    : reg_(reg),
      part_(std::move(part)),
      whole_(reg.size(), 1),
      stage_(zero_stage),
      params_(params),
      replicas_(replicas),
      exec_(exec),
      expert_replicas_(expert_replicas ? expert_replicas : &replicas) {
  for (const auto& g : part_.groups())
    MESHTRAIN_CHECK(g.ranks == comm_of(static_cast<int>(&g - part_.groups().data())).size(),
                    "ZeroShards: a group split over ", g.ranks, " ranks, its communicator has ",
                    comm_of(static_cast<int>(&g - part_.groups().data())).size());
  if (stage_ <= 2)
    MESHTRAIN_CHECK(params_.span() >= reg.size(), "ZeroShards: ZeRO-", stage_,
                    " needs the model's full parameter buffer (", reg.size(), " elements), got ",
                    params_.span());
  if (stage_ >= 2) shard_grads_ = zeros<T>("zero.shard_grads", part_.shard_size());
  if (stage_ == 3) shard_params_ = zeros<T>("zero.shard_params", part_.shard_size());
}

template <class T>
int ZeroShards<T>::optimizer_rank() const {
  return sharded() ? replicas_.rank() : 0;
}

std::vector<optim::ShardPiece> shard_pieces(const ZeroPartition& p, int rank) {
  std::vector<optim::ShardPiece> out;
  for (int g = 0; g < static_cast<int>(p.groups().size()); ++g) {
    const FlatRange pc = p.piece(g, rank);
    out.push_back(optim::ShardPiece{pc.begin, p.groups()[g].shard_offset, pc.size()});
  }
  return out;
}

std::vector<optim::ShardRange> shard_ranges(const model::ParameterRegistry& reg,
                                            const ZeroPartition& part, int rank,
                                            bool count_experts) {
  // Consecutive parameters of one piece with the same decay and norm flags form one range; the
  // alignment gaps between them hold zeros in parameters and gradients, which AdamW keeps zero.
  std::vector<optim::ShardRange> out;
  int last_group = -1;
  for (const auto& s : part.segments(reg, rank)) {
    const bool counted = reg.counts_in_norm(*s.param) &&
                         (count_experts || s.param->grad_group != model::ParamGroup::expert_dp);
    if (!out.empty() && last_group == s.group && out.back().decay == s.param->decay &&
        out.back().counted == counted) {
      out.back().length = s.flat_begin + s.size() - out.back().flat;
    } else {
      out.push_back(optim::ShardRange{s.flat_begin, s.shard_offset, s.size(), s.param->decay,
                                      counted});
    }
    last_group = s.group;
  }
  return out;
}

ShardBytes zero_shard_bytes(const ZeroPartition& part, int zero_stage, std::size_t elem_bytes) {
  ShardBytes b;
  if (zero_stage >= 2) b.grads = part.shard_size() * elem_bytes;   // zero.shard_grads
  if (zero_stage == 3) b.params = part.shard_size() * elem_bytes;  // zero.shard_params
  return b;
}

std::size_t zero_staging_bytes(const ZeroPartition& part, int zero_stage, std::size_t elem_bytes) {
  if (!(zero_stage == 1 || zero_stage == 2) || part.dp_size() == 1) return 0;
  std::size_t max_piece = 0, max_recv = 0;
  for (const auto& g : part.groups()) {
    max_piece = std::max(max_piece, g.piece);
    max_recv = std::max(max_recv, g.piece * static_cast<std::size_t>(g.ranks));
  }
  return (max_piece + max_recv) * elem_bytes;
}

template <class T>
std::vector<optim::ShardPiece> ZeroShards<T>::optimizer_pieces() const {
  return shard_pieces(optimizer_partition(), optimizer_rank());
}

template <class T>
std::vector<optim::ShardRange> ZeroShards<T>::optimizer_ranges() const {
  // Unsharded (ZeRO-0) under expert parallelism: each rank's experts are its own, replicated
  // only over expert-dp; the optimizer sums their squares over the ep group apart.
  const bool ep_split = expert_replicas_ != &replicas_ && expert_replicas_->size() < replicas_.size();
  return shard_ranges(reg_, optimizer_partition(), optimizer_rank(), sharded() || !ep_split);
}

template <class T>
View1<T> ZeroShards<T>::optimizer_grads(View1<T> model_grads) const {
  return stage_ <= 1 ? model_grads : shard_grads_;
}
template <class T>
optim::Index ZeroShards<T>::optimizer_grads_index() const {
  return stage_ <= 1 ? optim::Index::flat : optim::Index::shard;
}
template <class T>
View1<T> ZeroShards<T>::optimizer_params() const {
  return stage_ <= 2 ? params_ : shard_params_;
}
template <class T>
optim::Index ZeroShards<T>::optimizer_params_index() const {
  return stage_ <= 2 ? optim::Index::flat : optim::Index::shard;
}

template <class T>
void ZeroShards<T>::gather_groups(View1<const T> src, optim::Index where, View1<T> dst,
                                  CommStats& stats) {
  const int me = replicas_.rank();
  std::size_t max_piece = 0, max_recv = 0;
  for (const auto& g : part_.groups()) {
    max_piece = std::max(max_piece, g.piece);
    max_recv = std::max(max_recv, g.piece * static_cast<std::size_t>(g.ranks));
  }
  if (stage_send_.span() < max_piece || stage_recv_.span() < max_recv) {
    stage_send_ = alloc<T>("zero.gather_send", max_piece);
    stage_recv_ = alloc<T>("zero.gather_recv", max_recv);
  }
  const Timer t;
  for (int g = 0; g < static_cast<int>(part_.groups().size()); ++g) {
    const ZeroGroup& zg = part_.groups()[g];
    const FlatRange pc = part_.piece(g, me);
    auto send = slice(stage_send_, 0, zg.piece);
    auto recv = slice(stage_recv_, 0, zg.piece * static_cast<std::size_t>(zg.ranks));
    Kokkos::deep_copy(exec_, send, T(0.0f));
    if (pc.size()) {
      const std::size_t from = where == optim::Index::flat ? pc.begin : zg.shard_offset;
      Kokkos::deep_copy(exec_, slice(send, 0, pc.size()), slice(src, from, pc.size()));
    }
    comm_of(g).all_gather(send, recv);
    Kokkos::deep_copy(exec_, slice(dst, zg.range.begin, zg.range.size()),
                      slice(recv, 0, zg.range.size()));
    stats.bytes += recv.span() * sizeof(T);
    ++stats.ops;
  }
  exec_.fence();
  stats.total_seconds += t.seconds();
  stats.exposed_seconds += t.seconds();
}

template <class T>
void ZeroShards<T>::gather_updated_params(CommStats& stats) {
  // With one rank the update already is the whole buffer.
  if ((stage_ == 1 || stage_ == 2) && replicas_.size() > 1)
    gather_groups(params_, optim::Index::flat, params_, stats);
}

template <class T>
void ZeroShards<T>::scatter_params(View1<const T> full) {
  if (stage_ < 3) {
    if (full.data() != params_.data()) Kokkos::deep_copy(exec_, params_, full);
    return;
  }
  const int me = replicas_.rank();
  for (int g = 0; g < static_cast<int>(part_.groups().size()); ++g) {
    const FlatRange pc = part_.piece(g, me);
    if (pc.size())
      Kokkos::deep_copy(exec_, slice(shard_params_, part_.groups()[g].shard_offset, pc.size()),
                        slice(full, pc.begin, pc.size()));
  }
  exec_.fence();
}

template <class T>
void ZeroShards<T>::gather_params(View1<T> full, CommStats& stats) {
  if (stage_ < 3) {
    Kokkos::deep_copy(exec_, full, params_);
    return;
  }
  gather_groups(shard_params_, optim::Index::shard, full, stats);
}

template <class T>
std::size_t ZeroShards<T>::shard_bytes() const {
  return (shard_params_.span() + shard_grads_.span()) * sizeof(T);
}

template <class T>
std::size_t ZeroShards<T>::staging_bytes() const {
  return (stage_send_.span() + stage_recv_.span()) * sizeof(T);
}

template class ZeroShards<float>;
#if MESHTRAIN_HAVE_BF16
template class ZeroShards<bf16>;
template class ZeroShards<fp16>;
#endif

}  // namespace meshtrain::parallel
