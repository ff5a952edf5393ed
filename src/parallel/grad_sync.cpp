#include "meshtrain/parallel/grad_sync.hpp"

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

template <class T>
GradSync<T>::GradSync(ModelBuffers<T> model, comm::Communicator& replicas, const DpOptions& opt,
                      ExecSpace exec, comm::Communicator* expert_replicas, comm::Communicator* ep)
    : model_(std::move(model)), replicas_(replicas), expert_replicas_(expert_replicas), ep_(ep), opt_(opt) {
  MESHTRAIN_CHECK(model_.registry, "GradSync: no parameter registry");
  const int edp = expert_replicas_ ? expert_replicas_->size() : replicas_.size();
  MESHTRAIN_CHECK(replicas_.size() % edp == 0, "GradSync: expert-dp size ", edp,
                  " does not divide dp=", replicas_.size());
  const int ep_size = replicas_.size() / edp;
  MESHTRAIN_CHECK(ep_size == 1 || (ep_ && ep_->size() == ep_size), "GradSync: mesh.ep=",
                  ep_size, " needs its expert-parallel communicator");
  DpLayout layout = make_dp_layout(*model_.registry, sizeof(T), opt_, replicas_.size(), ep_size);
  plan_ = std::move(layout.plan);
  shards_ = std::make_unique<ZeroShards<T>>(*model_.registry, std::move(layout.partition),
                                            opt_.zero_stage, model_.params, replicas_, exec, expert_replicas_);
  reducer_ = std::make_unique<GradReducer<T>>(plan_, model_, *shards_, replicas_, exec);
  if (opt_.zero_stage == 3)
    gatherer_ = std::make_unique<ParamGatherer<T>>(plan_, model_, *shards_, replicas_);
  policy_ = std::make_unique<DpPolicy>(plan_, *reducer_, gatherer_.get());
}

template <class T>
GradSync<T>::~GradSync() = default;

template <class T>
void GradSync<T>::set_embedding_group(comm::Communicator* embedding) {
  tied_ = std::make_unique<TiedEmbeddingSum<T>>(*model_.registry, embedding);
  reducer_->set_tied(tied_.get());
  policy_->set_tied_sum(tied_->active());
}

template <class T>
void GradSync<T>::scatter_params(View1<const T> full) {
  shards_->scatter_params(full);
  policy_->release_all_params();
}

template <class T>
CommStats GradSync<T>::param_stats() const {
  CommStats s = gather_stats_;
  if (gatherer_) s += gatherer_->stats();
  return s;
}

template <class T>
void GradSync<T>::reset_stats() {
  reducer_->reset_stats();
  if (gatherer_) gatherer_->reset_stats();
  gather_stats_ = CommStats{};
}

template <class T>
typename GradSync<T>::Bytes GradSync<T>::bytes() const {
  Bytes b;
  b.shard_params = shards_->shard_params().span() * sizeof(T);
  b.shard_grads = shards_->shard_grads().span() * sizeof(T);
  b.grad_buffers = reducer_->pool_bytes();
  b.param_buffers = (gatherer_ ? gatherer_->pool_bytes() : 0) + shards_->staging_bytes();
  return b;
}

template class GradSync<float>;
#if MESHTRAIN_HAVE_BF16
template class GradSync<bf16>;
template class GradSync<fp16>;
#endif

}  // namespace meshtrain::parallel
