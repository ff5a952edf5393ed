// The blocks of ring attention through cuDNN's fused flash attention (attention_cudnn.hpp): the
// SDPA graphs of cudnn_sdpa.hpp with Tq query rows against Tk key rows, causal (Tq == Tk, the
// same positions) or full (no mask), every input read in place through its slice's strides.
//
// cuDNN writes its outputs in the i/o type T, while the block contract's outputs are the fp32
// partial output and lse (forward) and fp32 gradient accumulators (backward). So cuDNN writes
// into scratch of the shared buffer and a small kernel carries the values into the slices:
// - forward: O [B, Tq, NH HS] in T and the statistics [B, NH, Tq] fp32, copied into out (the
//   partial is rounded to T once before the fp32 merge, as TransformerEngine's context
//   parallelism does) and lse;
// - backward: dQ [B, Tq, NH HS], dK and dV [B, Tk, NKV HS] in T, added to dq, dk, dv (each
//   block's share rounded to T once, summed over the blocks in fp32).
// The backward's statistics (the merged lse of the query rows) are copied into packed scratch
// first: the packed [B, NH, Tq] layout is the one the self-attention graphs run with, and a
// row offset into the stats buffer need not be 16-byte aligned.
#include "attention_cudnn.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN)
#include <cstdint>
#include <type_traits>

#include "cudnn_sdpa.hpp"

namespace meshtrain::kernels::detail {

namespace {

using Policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;

constexpr std::size_t round256(std::size_t n) { return (n + 255) / 256 * 256; }

cudnn::Rows rows(const RowSlice& r) { return {r.batch, r.row}; }
// A packed [B, rows, width] buffer of scratch.
cudnn::Rows packed(int rows, std::int64_t width) { return {rows * width, width}; }

// The shape of a block whose query-side outputs (O, dQ, stats) and key-side outputs (dK, dV)
// are packed scratch; the inputs are read through their slices.
cudnn::SdpaShape block_shape(const AttentionBlockShape& s, const RowSlice& qs, const RowSlice& ks,
                             const RowSlice& vs) {
  cudnn::SdpaShape sh{s.B, s.Tq, s.Tk, s.NH, s.NKV, s.HS, s.causal};
  const std::int64_t C = std::int64_t(s.NH) * s.HS, Ckv = std::int64_t(s.NKV) * s.HS;
  sh.q = rows(qs);
  sh.k = rows(ks);
  sh.v = rows(vs);
  sh.o = sh.dq = packed(s.Tq, C);
  sh.dk = sh.dv = packed(s.Tk, Ckv);
  sh.stats_batch = std::int64_t(s.NH) * s.Tq;
  sh.stats_head = s.Tq;
  return sh;
}

// Whether the block can be cuDNN's at all (a block without keys or rows is ours: trivial).
bool cudnn_shape(const AttentionBlockShape& s) { return s.B > 0 && s.Tq > 0 && s.Tk > 0; }

// dst slice (op)= src, a packed [B, rows, width] buffer in T: dst(b, i, c) at
// ds.offset + b ds.batch + i ds.row + c.
template <bool kAdd, class T, class A>
void carry_rows(const ExecSpace& exec, const char* label, View1<A> dst, const RowSlice& ds,
                const T* src, int B, int rows, std::int64_t width) {
  const std::int64_t R = rows, W = width;
  Kokkos::parallel_for(label, Policy(exec, 0, std::int64_t(B) * R * W),
                       KOKKOS_LAMBDA(const std::int64_t e) {
                         const std::int64_t c = e % W, bi = e / W, i = bi % R, b = bi / R;
                         const A x = static_cast<A>(src[e]);
                         A& d = dst(ds.offset + b * ds.batch + i * ds.row + c);
                         if constexpr (kAdd) d += x;
                         else d = x;
                       });
}

// Statistics between a slice ((b, h, i) at offset + b batch + h head + i) and packed
// [B, NH, Tq] scratch, in the direction `to_slice`.
void copy_stats(const ExecSpace& exec, const char* label, int B, int NH, int Tq, float* slice,
                const StatSlice& ls, float* packed_stats, bool to_slice) {
  const std::int64_t R = Tq, H = NH;
  const StatSlice l = ls;
  Kokkos::parallel_for(label, Policy(exec, 0, std::int64_t(B) * H * R),
                       KOKKOS_LAMBDA(const std::int64_t e) {
                         const std::int64_t i = e % R, bh = e / R, h = bh % H, b = bh / H;
                         float& x = slice[l.offset + b * l.batch + h * l.head + i];
                         if (to_slice) x = packed_stats[e];
                         else packed_stats[e] = x;
                       });
}

}  // namespace

template <class T, class A>
bool attention_block_forward_cudnn(const ExecSpace& exec, const AttentionBlockShape& s,
                                   View1<const T> q, RowSlice qs, View1<const T> k, RowSlice ks,
                                   View1<const T> v, RowSlice vs, View1<A> out, RowSlice os,
                                   View1<A> lse, StatSlice ls) {
  if constexpr (!(cudnn::kIoType<T> && std::is_same_v<A, float>)) {
    return false;
  } else {
    if (!cudnn_shape(s)) return false;
    const T *qp = q.data() + qs.offset, *kp = k.data() + ks.offset, *vp = v.data() + vs.offset;
    if (!cudnn::eligible(s.HS, {qp, kp, vp},
                         {qs.row, qs.batch, ks.row, ks.batch, vs.row, vs.batch}))
      return false;
    const cudnn::SdpaShape shape = block_shape(s, qs, ks, vs);
    cudnn::Sdpa call(exec);
    if (!call.plan(false, cudnn::io_type<T>(), shape)) return false;
    const std::int64_t C = std::int64_t(s.NH) * s.HS;
    const std::size_t o_bytes = round256(std::size_t(s.B) * s.Tq * C * sizeof(T));
    unsigned char* buf = call.scratch(o_bytes + std::size_t(s.B) * s.NH * s.Tq * sizeof(float));
    T* o = reinterpret_cast<T*>(buf);
    float* stats = reinterpret_cast<float*>(buf + o_bytes);
    call.forward({qp, kp, vp, o, stats});
    carry_rows<false>(exec, "meshtrain::attention_block_forward_cudnn_out", out, os,
                      static_cast<const T*>(o), s.B, s.Tq, C);
    copy_stats(exec, "meshtrain::attention_block_forward_cudnn_lse", s.B, s.NH, s.Tq, lse.data(),
               ls, stats, true);
    count_cudnn_attention_block_call();
    return true;
  }
}

template <class T, class A>
bool attention_block_backward_cudnn(const ExecSpace& exec, const AttentionBlockShape& s,
                                    View1<const T> q, RowSlice qs, View1<const T> k, RowSlice ks,
                                    View1<const T> v, RowSlice vs, View1<const T> dout,
                                    RowSlice dos, View1<const T> out, RowSlice outs,
                                    View1<const A> lse, StatSlice ls, View1<A> dq, RowSlice dqs,
                                    View1<A> dk, RowSlice dks, View1<A> dv, RowSlice dvs) {
  if constexpr (!(cudnn::kIoType<T> && std::is_same_v<A, float>)) {
    return false;
  } else {
    if (!cudnn_shape(s)) return false;
    const T *qp = q.data() + qs.offset, *kp = k.data() + ks.offset, *vp = v.data() + vs.offset;
    const T *dop = dout.data() + dos.offset, *op = out.data() + outs.offset;
    if (!cudnn::eligible(s.HS, {qp, kp, vp, dop, op},
                         {qs.row, qs.batch, ks.row, ks.batch, vs.row, vs.batch, dos.row,
                          dos.batch, outs.row, outs.batch}))
      return false;
    cudnn::SdpaShape shape = block_shape(s, qs, ks, vs);
    shape.o = rows(outs);
    shape.dout = rows(dos);
    cudnn::Sdpa call(exec);
    if (!call.plan(true, cudnn::io_type<T>(), shape)) return false;
    const std::int64_t C = std::int64_t(s.NH) * s.HS, Ckv = std::int64_t(s.NKV) * s.HS;
    const std::size_t stats_bytes = round256(std::size_t(s.B) * s.NH * s.Tq * sizeof(float));
    const std::size_t dq_bytes = round256(std::size_t(s.B) * s.Tq * C * sizeof(T));
    const std::size_t dkv_bytes = round256(std::size_t(s.B) * s.Tk * Ckv * sizeof(T));
    unsigned char* buf = call.scratch(stats_bytes + dq_bytes + 2 * dkv_bytes);
    auto* stats = reinterpret_cast<float*>(buf);
    T* dq_t = reinterpret_cast<T*>(buf + stats_bytes);
    T* dk_t = reinterpret_cast<T*>(buf + stats_bytes + dq_bytes);
    T* dv_t = reinterpret_cast<T*>(buf + stats_bytes + dq_bytes + dkv_bytes);
    copy_stats(exec, "meshtrain::attention_block_backward_cudnn_lse", s.B, s.NH, s.Tq,
               const_cast<float*>(lse.data()), ls, stats, false);
    call.backward({qp, kp, vp, op, dop, stats, dq_t, dk_t, dv_t});
    carry_rows<true>(exec, "meshtrain::attention_block_backward_cudnn_dq", dq, dqs,
                     static_cast<const T*>(dq_t), s.B, s.Tq, C);
    carry_rows<true>(exec, "meshtrain::attention_block_backward_cudnn_dk", dk, dks,
                     static_cast<const T*>(dk_t), s.B, s.Tk, Ckv);
    carry_rows<true>(exec, "meshtrain::attention_block_backward_cudnn_dv", dv, dvs,
                     static_cast<const T*>(dv_t), s.B, s.Tk, Ckv);
    count_cudnn_attention_block_call();
    return true;
  }
}

#define MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK_CUDNN(T, A)                                        \
  template bool attention_block_forward_cudnn<T, A>(                                             \
      const ExecSpace&, const AttentionBlockShape&, View1<const T>, RowSlice, View1<const T>,    \
      RowSlice, View1<const T>, RowSlice, View1<A>, RowSlice, View1<A>, StatSlice);              \
  template bool attention_block_backward_cudnn<T, A>(                                            \
      const ExecSpace&, const AttentionBlockShape&, View1<const T>, RowSlice, View1<const T>,    \
      RowSlice, View1<const T>, RowSlice, View1<const T>, RowSlice, View1<const T>, RowSlice,    \
      View1<const A>, StatSlice, View1<A>, RowSlice, View1<A>, RowSlice, View1<A>, RowSlice);
MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK_CUDNN(float, float)
MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK_CUDNN(double, double)
MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK_CUDNN(bf16, float)
MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK_CUDNN(fp16, float)
#undef MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK_CUDNN

}  // namespace meshtrain::kernels::detail

#endif
