#pragma once
// The tensor-parallel region: Megatron's mappings (megatron/core/tensor_parallel/mappings.py) as
// named operations over the tp communicator, with sequence parallelism chosen once, here.
//
// A transformer block under tensor parallelism alternates between two kinds of tensor:
//  - the residual stream and the norms: replicated over tp (or, with sequence parallelism, split
//    by token rows, N / tp per rank);
//  - the inside of a column-parallel -> row-parallel pair (q/k/v and attention, fc and GELU):
//    split by columns (heads, MLP width), every rank holding all N rows.
// enter() crosses from the first kind into a column-parallel linear, exit() leaves a
// row-parallel linear back into the first kind; each has a backward counterpart:
//
//                        forward                          backward
//   enter (column in)    SP: all-gather rows; else none   SP: reduce-scatter; else all-reduce
//   exit  (row out)      SP: reduce-scatter; else         SP: all-gather rows; else none
//                        all-reduce
//
// (Megatron's gather_from_sequence_parallel_region / copy_to_tensor_model_parallel_region and
// reduce_scatter_to_sequence_parallel_region / reduce_from_tensor_model_parallel_region.) The
// column-parallel input gradient is reduced non-blocking so that the weight-gradient GEMM of the
// same linear runs meanwhile. Besides the two boundaries: parameters held whole on every tp rank
// whose gradients each rank computes from its share (norm weights under SP, replicated kv heads)
// are summed over tp, and the vocabulary-parallel softmax reduces its row max and sums.
//
// With tp = 1 (no communicator or one rank) every operation is the identity and no scratch is
// allocated. The region also owns the scratch the boundaries need and the host time of its
// communication (exact with MPI, whose calls return when done; launch time only with NCCL).
#include <cstddef>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::model {

template <class T>
class TpRegion {
 public:
  TpRegion() = default;  // tp = 1
  // rows: N of a micro-batch (every token row); cols: the model width; norm_bias: the norms
  // have a bias (LayerNorm), whose gradient is summed with the weight's under SP.
  TpRegion(comm::Communicator* tp, bool sequence_parallel, std::size_t rows, std::size_t cols,
           bool norm_bias);

  bool active() const { return size_ > 1; }
  bool sequence_parallel() const { return sp_; }  // and active()
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Host seconds spent in tp communication since construction.
  double comm_seconds() const { return seconds_; }

  // ---- Into a column-parallel linear ----
  // Where this rank writes its rows of `full` (a norm output the linear reads): a scratch of
  // N / tp rows under SP, `full` itself otherwise.
  View1<T> local_rows(View1<T> full) const { return sp_ ? local_ : full; }
  // Forward: full <- every rank's `local` rows (SP); nothing otherwise (local is full).
  void enter(View1<const T> local, View1<T> full);
  // Where the reduced input gradient (this rank's rows) lands: a scratch under SP, else `full`.
  View1<T> local_grad_rows(View1<T> full) const { return sp_ ? dlocal_ : full; }
  // Backward: dlocal <- sum over tp of `partial` (every row; reduce-scatter under SP, all-reduce
  // otherwise), started now and finished by wait(). Nothing at tp = 1 (dlocal is partial).
  comm::Request enter_backward(View1<const T> partial, View1<T> dlocal);

  // ---- Out of a row-parallel linear ----
  // Scratch for the partial sums of every row ([N, C]) and for their reduction (this rank's rows).
  View1<T> partial() const { return partial_; }
  View1<T> reduced() const { return reduced_; }
  // Forward: out <- sum over tp of `partial` (this rank's rows under SP: reduce-scatter; every
  // row otherwise: all-reduce).
  void exit(View1<const T> partial, View1<T> out);
  // Backward: every row of the output gradient (SP: all-gathered into a scratch); `dlocal`
  // itself otherwise.
  View1<const T> exit_backward(View1<const T> dlocal);

  // This rank's rows of `full` (every row): its N / tp under SP (Megatron's
  // scatter_to_sequence_parallel_region, a split without communication), `full` otherwise.
  View1<T> split_rows(View1<T> full) const {
    if (!sp_) return full;
    return slice(full, static_cast<std::size_t>(rank_) * local_elems_, local_elems_);
  }

  // ---- Parameters held whole on every tp rank ----
  // g <- sum over tp of g: a replicated parameter's gradient that each rank computed from its
  // share (its rows under SP, its query heads' use of replicated kv heads).
  void sum_replicated(View1<T> g);
  // Scratch for the norm parameters' partial gradients under SP ([C] each; db empty without a
  // norm bias).
  View1<T> norm_dw() const { return norm_dw_; }
  View1<T> norm_db() const { return norm_db_; }

  // ---- Vocabulary-parallel softmax (each rank holds padded_vocab / tp logits of a row) ----
  void vocab_max(View1<float> row_max);  // max over tp
  void vocab_sum(View1<float> sums);     // sum over tp

  // ---- FP8 scales (fp8_recipe.hpp) ----
  // amax[0, count) <- its max over tp (fp8_amax.hpp's agree_amax), so that a split tensor is
  // cast with the whole tensor's scales.
  void agree_amax(const ExecSpace& exec, View1<float> amax, std::size_t count);

  // Finishes an operation started above, timed (tp > 1).
  void wait(comm::Request& r);

 private:
  comm::Communicator* tp_ = nullptr;
  bool sp_ = false;
  int rank_ = 0, size_ = 1;
  double seconds_ = 0;
  std::size_t local_elems_ = 0;          // SP: (N / tp) x C
  View1<T> partial_, reduced_;           // tp > 1: [N, C], [N / tp or N, C]
  View1<T> local_, dlocal_, full_;       // SP: [N / tp, C] norm rows, input-gradient rows; [N, C]
  View1<T> norm_dw_, norm_db_;           // SP: [C]
};

}  // namespace meshtrain::model
