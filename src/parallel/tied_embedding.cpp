#include "meshtrain/parallel/tied_embedding.hpp"

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/timer.hpp"

namespace meshtrain::parallel {

template <class T>
TiedEmbeddingSum<T>::TiedEmbeddingSum(const model::ParameterRegistry& reg,
                                      comm::Communicator* embedding)
    : embedding_(embedding) {
  if (!active()) return;
  const model::ParamInfo* wte = reg.find(reg.embedding_name());
  MESHTRAIN_CHECK(wte, "set_embedding_group: this rank holds no wte");
  wte_offset_ = wte->offset;
  wte_numel_ = wte->numel;
}

template <class T>
void TiedEmbeddingSum<T>::sum_in(View1<T> buffer, std::size_t range_begin, CommStats& stats) {
  if (!active()) return;
  const Timer t;
  embedding_->all_reduce(slice(buffer, wte_offset_ - range_begin, wte_numel_));
  stats.total_seconds += t.seconds();
  stats.exposed_seconds += t.seconds();
  stats.bytes += wte_numel_ * sizeof(T);
  ++stats.ops;
}

template class TiedEmbeddingSum<float>;
#if MESHTRAIN_HAVE_BF16
template class TiedEmbeddingSum<bf16>;
template class TiedEmbeddingSum<fp16>;
#endif

}  // namespace meshtrain::parallel
