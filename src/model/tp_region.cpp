// The tensor-parallel region's operations (tp_region.hpp). Every collective is the one, on the
// buffers and in the order, that the model issued inline before it had a name; the blocking ones
// are timed from issue to completion, the non-blocking ones from wait() only (their issue
// overlaps compute).
#include "meshtrain/model/tp_region.hpp"

#include "meshtrain/core/timer.hpp"
#include "meshtrain/model/fp8_amax.hpp"

namespace meshtrain::model {

namespace {
// Adds the wall time of a communication call to a counter.
struct CommTimer {
  explicit CommTimer(double& acc) : acc_(acc) {}
  ~CommTimer() { acc_ += t_.seconds(); }
  double& acc_;
  Timer t_;
};
}  // namespace

template <class T>
TpRegion<T>::TpRegion(comm::Communicator* tp, bool sequence_parallel, std::size_t rows,
                      std::size_t cols, bool norm_bias)
    : tp_(tp), rank_(tp ? tp->rank() : 0), size_(tp ? tp->size() : 1) {
  if (!active()) return;
  sp_ = sequence_parallel;
  const std::size_t P = static_cast<std::size_t>(size_), local = sp_ ? rows / P : rows;
  partial_ = alloc<T>("tp.partial", rows * cols);
  reduced_ = alloc<T>("tp.proj_out", local * cols);
  if (!sp_) return;
  local_elems_ = local * cols;
  dlocal_ = alloc<T>("sp.dln_local", local * cols);
  full_ = alloc<T>("sp.dres_full", rows * cols);
  local_ = alloc<T>("sp.ln_local", local * cols);
  norm_dw_ = alloc<T>("sp.ln_dw", cols);
  if (norm_bias) norm_db_ = alloc<T>("sp.ln_db", cols);
}

template <class T>
void TpRegion<T>::agree_amax(const ExecSpace& exec, View1<float> amax, std::size_t count) {
  if (!active()) return;
  CommTimer t(seconds_);
  model::agree_amax(*tp_, exec, amax, count);
}

template <class T>
void TpRegion<T>::enter(View1<const T> local, View1<T> full) {
  if (!sp_) return;
  CommTimer t(seconds_);
  tp_->all_gather(local, full);
}

template <class T>
comm::Request TpRegion<T>::enter_backward(View1<const T> partial, View1<T> dlocal) {
  if (!active()) return {};
  return sp_ ? tp_->ireduce_scatter(partial, dlocal) : tp_->iall_reduce(partial, dlocal);
}

template <class T>
void TpRegion<T>::exit(View1<const T> partial, View1<T> out) {
  if (!active()) return;
  CommTimer t(seconds_);
  if (sp_) tp_->reduce_scatter(partial, out);
  else tp_->all_reduce(partial, out);
}

template <class T>
View1<const T> TpRegion<T>::exit_backward(View1<const T> dlocal) {
  if (!sp_) return dlocal;
  CommTimer t(seconds_);
  tp_->all_gather(dlocal, full_);
  return full_;
}

template <class T>
void TpRegion<T>::sum_replicated(View1<T> g) {
  if (!active()) return;
  CommTimer t(seconds_);
  tp_->all_reduce(g);
}

template <class T>
void TpRegion<T>::vocab_max(View1<float> row_max) {
  if (!active()) return;
  CommTimer t(seconds_);
  tp_->all_reduce(row_max, comm::ReduceOp::max);
}

template <class T>
void TpRegion<T>::vocab_sum(View1<float> sums) {
  if (!active()) return;
  CommTimer t(seconds_);
  tp_->all_reduce(sums);
}

template <class T>
void TpRegion<T>::wait(comm::Request& r) {
  if (!active()) return r.wait();  // nothing of tp's to time
  CommTimer t(seconds_);
  r.wait();
}

template class TpRegion<float>;
#if MESHTRAIN_HAVE_BF16
template class TpRegion<bf16>;
template class TpRegion<fp16>;
#endif

}  // namespace meshtrain::model
