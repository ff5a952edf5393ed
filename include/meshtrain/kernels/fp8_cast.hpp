#pragma once
// FP8 casts with current scaling (TransformerEngine's "current" / torchao's dynamic scaling):
// the scale of a tensor comes from the tensor being cast,
//
//   amax = max |x|,  scale = fp8_max / amax  (1 where amax is 0 or not finite),
//   q = fp8(x * scale) (saturating, RNE),    x ~ decode(q) * scale_inv,  scale_inv = 1 / scale,
//
// tensorwise (one scale) or rowwise (one per row of the row-major [rows, cols] tensor, so an
// outlier spoils only its row). The steps are separate calls so that a tensor split over a
// tensor- or sequence-parallel group can agree its amax between them (model/fp8_amax.hpp), and
// so that a kernel producing the tensor can write the amax itself and go straight to
// fp8_scales: rmsnorm_forward, layernorm_forward, swiglu_forward and gelu_forward/backward take
// an optional amax, set to the bits fp8_amax would give on their output, and swiglu_backward two
// (its gate half's and its up half's), with no second read of it (src/kernels/amax_fused.hpp).
//
// amax is NaN-propagating: it is NaN if the tensor holds a NaN, inf if it holds an inf and no
// NaN, the largest magnitude otherwise. The saturating cast turns an inf into ±max, so a caller
// that must see non-finite tensors (the trainer's divergence policy) reads the amax, not the
// casted values. Scales, amaxes and inverse scales are device Views of 1 (tensorwise) or rows
// (rowwise) floats: what cuBLASLt's scale pointers take (scale_inv is its A/B_SCALE_POINTER).
#include <cstdint>
#include <functional>
#include <string>

#include "meshtrain/core/fp8.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

enum class Fp8Scaling { tensorwise, rowwise };

const char* fp8_scaling_name(Fp8Scaling s);  // "tensorwise" | "rowwise"

// amax(0) = max |x[i]| over i < n (NaN-propagating as above); accumulate: amax(0) = max(amax(0),
// that) — a running amax over several tensors (one check per step). n = 0 gives 0.
template <class T>
void fp8_amax(const ExecSpace& exec, View1<float> amax, View1<const T> x, std::size_t n,
              bool accumulate = false);

// amax(r) = max over the row |x[r * cols + c]|, r < rows (NaN-propagating as above).
template <class T>
void fp8_amax_rows(const ExecSpace& exec, View1<float> amax, View1<const T> x, int rows, int cols);

// The per-entry scale of current scaling for `count` amaxes: scale = fp8_max / amax, with
// scale = 1 where amax is 0 or not finite, FLT_MAX where the quotient overflows fp32 (amax
// below fp8_max / FLT_MAX); scale_inv = 1 / scale.
void fp8_scales(const ExecSpace& exec, View1<const float> amax, View1<float> scale,
                View1<float> scale_inv, std::size_t count, Fp8Format format);

// One scale on the host, the same arithmetic (the reference of tests and of host code).
KOKKOS_INLINE_FUNCTION float fp8_scale_from_amax(float amax, Fp8Format format) {
  const float fmax = fp8_max(format);
  if (!(amax > 0.0f) || !(amax <= 3.402823466e38f)) return 1.0f;  // 0, NaN or inf
  const float s = fmax / amax;
  return s <= 3.402823466e38f ? s : 3.402823466e38f;
}

// q[i] = fp8(x[i] * scale) for the row-major [rows, cols] x: scale(0) tensorwise, scale(r) for
// row r rowwise. transpose (tensorwise only) writes q as the [cols, rows] transpose, the
// K-contiguous operand layout Hopper's FP8 GEMMs need for the backward pass. Saturating.
template <class T>
void fp8_cast(const ExecSpace& exec, View1<std::uint8_t> q, View1<const T> x, int rows, int cols,
              View1<const float> scale, Fp8Scaling scaling, Fp8Format format,
              bool transpose = false);

// The block forms, tensorwise, for a row-major [rows, cols] block at x with row stride ld >= cols
// (a column block of a wider buffer: Llama's packed q|k|v and gate|up gradients), read in place.
// fp8_amax_block: amax(0) = max |x| over the block (NaN-propagating as fp8_amax).
// fp8_cast_block: q [rows, cols] and qt, its [cols, rows] transpose, from one read of x (either
// may be empty): a linear's output gradient feeds its input-gradient GEMM row-major and its
// weight-gradient GEMM transposed, under one scale.
template <class T>
void fp8_amax_block(const ExecSpace& exec, View1<float> amax, const T* x, int rows, int cols,
                    int ld);
template <class T>
void fp8_cast_block(const ExecSpace& exec, View1<std::uint8_t> q, View1<std::uint8_t> qt,
                    const T* x, int rows, int cols, int ld, View1<const float> scale,
                    Fp8Format format);

// fp8_scales(amax, scale, scale_inv, 1) then fp8_cast_block under that scale, as one kernel
// where the CUDA cast kernels take the block (the scale made in the cast, fp8_scales'
// arithmetic: the same bits), as the two calls elsewhere.
template <class T>
void fp8_scale_cast_block(const ExecSpace& exec, View1<std::uint8_t> q, View1<std::uint8_t> qt,
                          const T* x, int rows, int cols, int ld, View1<const float> amax,
                          View1<float> scale, View1<float> scale_inv, Fp8Format format);

// x[i] = decode(q[i]) * scale_inv(0 or r): the inverse of fp8_cast (without transpose).
template <class T>
void fp8_dequantize(const ExecSpace& exec, View1<T> x, View1<const std::uint8_t> q, int rows,
                    int cols, View1<const float> scale_inv, Fp8Scaling scaling, Fp8Format format);

// A quantized row-major [rows, cols] tensor with its scaling state, as the FP8 GEMMs take it.
// transposed: data holds the [cols, rows] transpose (tensorwise only); rows/cols still name the
// source tensor.
struct Fp8Tensor {
  Fp8Format format = Fp8Format::e4m3;
  Fp8Scaling scaling = Fp8Scaling::tensorwise;
  int rows = 0, cols = 0;
  bool transposed = false;
  View1<std::uint8_t> data;            // rows * cols codes
  View1<float> amax, scale, scale_inv;  // scale_count() entries each
  // Tensorwise, optionally: the other orientation of the same codes (what `transposed` does not
  // say data holds), cast in the same pass under the same scale (fp8_cast_block).
  View1<std::uint8_t> data_other;
  std::size_t scale_count() const {
    return scaling == Fp8Scaling::rowwise ? static_cast<std::size_t>(rows) : 1;
  }
};

Fp8Tensor make_fp8_tensor(const std::string& label, int rows, int cols, Fp8Format format,
                          Fp8Scaling scaling, bool transposed = false);

// Called between the amax and the scales with q.amax: the place to agree it over the group that
// splits the tensor (model/fp8_amax.hpp's agree_amax), so every layout casts with one scale.
using AmaxHook = std::function<void(View1<float> amax, std::size_t count)>;

// amax, [agree], scales, cast: q's shape, format and scaling say what to do.
template <class T>
void fp8_quantize(const ExecSpace& exec, Fp8Tensor& q, View1<const T> x,
                  const AmaxHook& agree = {});

}  // namespace meshtrain::kernels
