#pragma once
// Token + position embedding.
//   out[b,t,:] = wte[tokens[b,t] - vocab_start, :] (+ wpe[pos(t), :] when wpe is non-empty)
// pos(t) = positions[t] where positions is given (context parallelism: a rank's rows are not
// the first Tlen positions of the sequence), else t.
// Only tokens in [vocab_start, vocab_start + vocab_local) contribute: with a vocab-parallel
// embedding each tensor-parallel rank holds a slice of rows and the partial results are summed
// over tp. Tokens outside the slice give zero rows.
#include <cstdint>

#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

template <class T>
void embedding_forward(const ExecSpace& exec, View1<T> out, View1<const std::int32_t> tokens,
                       View1<const T> wte, View1<const T> wpe, int B, int Tlen, int C,
                       int vocab_start, int vocab_local,
                       View1<const std::int32_t> positions = {});

// dwte[v - vocab_start, :] += sum of dout rows whose token is v (scatter-add, deterministic:
// same result bit for bit on every run); dwpe[pos(t), :] += sum over b of dout[b,t,:] (skipped
// when dwpe is empty; positions must be distinct).
template <class T>
void embedding_backward(const ExecSpace& exec, View1<T> dwte, View1<T> dwpe, View1<const T> dout,
                        View1<const std::int32_t> tokens, int B, int Tlen, int C,
                        int vocab_start, int vocab_local,
                        View1<const std::int32_t> positions = {});

}  // namespace meshtrain::kernels
