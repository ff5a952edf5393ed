#pragma once
// First-write gradients: a step need not zero a gradient that its first producer overwrites.
// Gradients accumulate (micro-batches, LM-head row chunks, a tied weight's two users), so the
// step used to zero the whole gradient buffer and every weight-gradient GEMM added into it with
// beta = 1, reading the zeros back (at the Llama-3.1-8B shape, 4 blocks: 1.9 G elements, ~1.3 ms
// of memset per step on an H100). PyTorch gets this for free (grad is None until the first
// backward writes it); here:
//   - a parameter is "first-written" when every producer of its gradient on this rank is a
//     weight-gradient GEMM that writes all of it (grad_first_written, a pure function of the
//     registry, so the planner counts what the runtime zeroes);
//   - begin of a step (DpPolicy::begin_step, ZeRO 0/1): arm() marks them unwritten, and only the
//     rest of the buffer (zero_ranges) is zeroed;
//   - each weight-gradient GEMM asks claim() for its beta: 0 for the first write of an unwritten
//     parameter (which is then written), 1 for every later one (next micro-batch, next head
//     chunk, ...). A write that covers only part of an unwritten parameter, or adds into one,
//     is an error, not a silent wrong sum;
//   - before a bucket is reduced, take_unwritten() hands back what no GEMM wrote (none in a
//     correct model), for the reducer to zero, so nothing unwritten is ever read.
// beta = 0 onto garbage and beta = 1 onto zeros give the same bits (0 + x = x), so the
// optimisation changes no number on host builds; tests/train/test_grad_first_write.cpp holds it
// to that. On GPUs cuBLASLt plans beta = 0 and beta = 1 apart and may pick another algorithm,
// whose summation order rounds differently: there the layouts' tolerances hold it.
//
// What stays zeroed, and why (each has a producer that adds rather than overwrites):
//   - biases: column sums added by gemm_dbias / column_sums_add (fused into the GEMM on CUDA,
//     accumulating whatever the GEMM's beta);
//   - norm weights and biases: the norm backward kernels add (and under sequence parallelism a
//     tp-summed scratch is added);
//   - the token embedding where this rank holds no LM head (a pipeline's first stage; an untied
//     head) and the position embedding: scatter-adds over the tokens;
//   - Llama's k_proj / v_proj when their kv heads are replicated over tp (n_kv_head < tp): each
//     rank's rows land in a scratch that is summed over tp and then added;
//   - MoE routers, shared experts and experts: routed scatter/grouped GEMMs over token subsets
//     (an expert may see no token in a micro-batch), fp32 routers through a scratch.
// Where the tied token embedding is also the LM head on this rank (pipeline depth 1), the head's
// GEMM runs before the embedding's scatter-add in every micro-batch (the head's backward is
// fused into its forward); the embedding backward still asks (GptT::before_accumulate) and
// zeroes the gradient itself if it ever came first.
//
// ZeRO 2/3 keep zeroing: their gradients live in pool buffers rebound (and zeroed) per bucket
// and micro-batch, and the model holds no full gradient buffer to claim ranges of.
#include <cstddef>
#include <vector>

#include "meshtrain/model/registry.hpp"

namespace meshtrain::model {

// [begin, end) of a stage's flat gradient buffer.
struct GradRange {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};

// Whether every producer of p's gradient on the rank of `reg` is one weight-gradient GEMM
// writing all of it (the list above, inverted): the block linears' weights and the LM head's.
bool grad_first_written(const ParameterRegistry& reg, const ParamInfo& p);

// Host bookkeeping of one stage's first-written gradients (no device data).
class GradFirstWrite {
 public:
  explicit GradFirstWrite(const ParameterRegistry& reg);

  // What an armed step zeroes: the buffer less the first-written parameters (padding included),
  // ascending and merged.
  const std::vector<GradRange>& zero_ranges() const { return zero_; }
  std::size_t zero_elems() const;

  // Begin of a step whose buffer is zeroed by zero_ranges only: every first-written parameter
  // unwritten.
  void arm();
  // Every gradient holds a value to add to (the whole buffer was zeroed): beta = 1 everywhere.
  void disarm();
  bool armed() const { return unwritten_ > 0; }

  // The beta of a GEMM about to write [offset, offset + n) of the buffer: 0 when that is
  // exactly an unwritten first-written parameter (marked written now), else 1. Throws when the
  // range overlaps an unwritten parameter otherwise (its other elements would stay garbage, or
  // the GEMM would add to garbage).
  float claim(std::size_t offset, std::size_t n);
  // The unwritten first-written parameters within [begin, end) (a range must hold them whole),
  // marked written: the caller zeroes them before anything reads or adds to them.
  std::vector<GradRange> take_unwritten(std::size_t begin, std::size_t end);

 private:
  // First-written parameters, ascending by begin, and whether each is unwritten this step.
  std::vector<GradRange> params_;
  std::vector<char> fresh_;
  std::size_t unwritten_ = 0;
  std::vector<GradRange> zero_;
};

}  // namespace meshtrain::model
