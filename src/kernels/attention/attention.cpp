// Causal self-attention, FlashAttention-style (Dao et al. 2022; backward as in FlashAttention-2,
// Dao 2023): no T x T buffer is ever allocated.
//
// Forward, one team per query row (b, h, i), vector lanes over the head dimension: an online
// softmax over keys j <= i keeps a running max m, a running sum l and an unnormalised output o
// (in team scratch, fp32), rescaling both by exp(m_old - m_new) whenever the max grows. The
// row's lse = m + log(l) is all that is saved.
//
// Backward, with s_ij = q_i.k_j / sqrt(HS), P_ij = exp(s_ij - lse_i), dP_ij = dO_i.v_j:
//   D_i = dO_i . O_i,  dS_ij = P_ij (dP_ij - D_i)
//   dq_i = scale sum_{j<=i} dS_ij k_j;  dk_j = scale sum_{i>=j} dS_ij q_i;  dv_j = sum_{i>=j} P_ij dO_i
// Two passes, one parallel over query rows (D and dq), one over key rows (dk, dv): every
// output row is summed by exactly one team in a fixed order, so there are no atomics and the
// result is the same bit for bit on every run.
//
// This is the portable baseline (a warp per row, keys streamed from global memory) and the
// oracle of the tiled paths: attention_host.cpp (CBLAS) and attention_cuda*.cpp (CUDA).
#include "meshtrain/kernels/attention/attention.hpp"

#include <string>
#include <type_traits>

#include "attention_cuda.hpp"
#include "attention_cudnn.hpp"
#include "attention_host.hpp"
#include "../common.hpp"

namespace meshtrain::kernels {

namespace detail {
// Row layout of the packed qkv buffer: C = NH*HS query columns, then Ckv = NKV*HS key and Ckv
// value columns; ld = C + 2*Ckv is the row stride. Query head h reads kv head h / G.
struct AttnShape {
  detail::Index T, C, Ckv, ld, NH, NKV, G, HS;
};

inline AttnShape check_attention(const char* fn, int B, int Tlen, int NH, int HS, int& NKV) {
  if (NKV == 0) NKV = NH;
  MESHTRAIN_CHECK(B >= 0 && Tlen >= 0 && NH > 0 && HS > 0 && NKV > 0, fn, ": bad shape B=", B,
                  ", T=", Tlen, ", NH=", NH, ", HS=", HS, ", NKV=", NKV);
  MESHTRAIN_CHECK(NH % NKV == 0, fn, ": NKV=", NKV, " key/value heads do not divide NH=", NH,
                  " query heads (model.n_kv_head must divide model.n_head)");
  const Index C = Index(NH) * HS, Ckv = Index(NKV) * HS;
  return AttnShape{Tlen, C, Ckv, C + 2 * Ckv, NH, NKV, NH / NKV, HS};
}
}  // namespace detail

template <class T>
void attention_forward_flash(const ExecSpace& exec, View1<T> out, View1<float> lse,
                             View1<const T> qkv, int B, int Tlen, int NH, int HS, int NKV) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  using detail::Index;
  const char* fn = "attention_forward";
  const detail::AttnShape s = detail::check_attention(fn, B, Tlen, NH, HS, NKV);
  const std::size_t rows = std::size_t(B) * Tlen;
  detail::check_extent(out, rows * s.C, fn, "out");
  detail::check_extent(qkv, rows * s.ld, fn, "qkv");
  detail::check_extent(lse, rows * NH, fn, "lse");
  const Acc scale = Acc(1) / kc::sqrt(Acc(HS));
  const Acc lowest = detail::kLowest<Acc>;
  using Scratch = detail::ScratchView<Acc>;
  detail::Team policy(exec, B * NH * Tlen, 1, detail::vector_length_for(HS));
  policy.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(HS)));
  Kokkos::parallel_for(
      "meshtrain::attention_forward", policy, KOKKOS_LAMBDA(const detail::Member& m) {
        // league rank = (b*NH + h)*T + i, which is also the row's index in lse.
        const Index r = m.league_rank();
        const Index i = r % s.T, bh = r / s.T, h = bh % s.NH, b = bh / s.NH;
        const Index q0 = (b * s.T + i) * s.ld + h * s.HS, kvh = h / s.G;
        Scratch o(m.team_scratch(0), s.HS);
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, s.HS), [&](Index d) { o(d) = 0; });
        Acc mx = lowest, l = 0;
        for (Index j = 0; j <= i; ++j) {
          const Index k0 = (b * s.T + j) * s.ld + s.C + kvh * s.HS, v0 = k0 + s.Ckv;
          Acc dot = 0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(m, s.HS),
              [&](Index d, Acc& a) { a += acc(qkv(q0 + d)) * acc(qkv(k0 + d)); }, dot);
          const Acc sc = dot * scale;
          const Acc mnew = sc > mx ? sc : mx;
          const Acc corr = kc::exp(mx - mnew), p = kc::exp(sc - mnew);
          l = l * corr + p;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, s.HS),
                               [&](Index d) { o(d) = o(d) * corr + p * acc(qkv(v0 + d)); });
          mx = mnew;
        }
        const Index o0 = (b * s.T + i) * s.C + h * s.HS;
        const Acc inv = Acc(1) / l;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, s.HS),
                             [&](Index d) { out(o0 + d) = static_cast<T>(o(d) * inv); });
        Kokkos::single(Kokkos::PerTeam(m), [&]() { lse(r) = static_cast<float>(mx + kc::log(l)); });
      });
}

template <class T>
void attention_backward_flash(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                              View1<const T> qkv, View1<const T> out, View1<const float> lse,
                              int B, int Tlen, int NH, int HS, int NKV) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  using detail::Index;
  const char* fn = "attention_backward";
  const detail::AttnShape s = detail::check_attention(fn, B, Tlen, NH, HS, NKV);
  const std::size_t rows = std::size_t(B) * Tlen;
  detail::check_extent(dqkv, rows * s.ld, fn, "dqkv");
  detail::check_extent(dout, rows * s.C, fn, "dout");
  detail::check_extent(qkv, rows * s.ld, fn, "qkv");
  detail::check_extent(out, rows * s.C, fn, "out");
  detail::check_extent(lse, rows * NH, fn, "lse");
  const Acc scale = Acc(1) / kc::sqrt(Acc(HS));
  using Scratch = detail::ScratchView<Acc>;
  const int vlen = detail::vector_length_for(HS);
  // D_i, one per (b, h, i) like lse; written by pass 1, read by pass 2.
  View1<Acc> Dbuf = alloc<Acc>("attention_backward_D", rows * NH);

  // Pass 1: per query row, D_i and dq_i.
  detail::Team rows_policy(exec, B * NH * Tlen, 1, vlen);
  rows_policy.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(HS)));
  Kokkos::parallel_for(
      "meshtrain::attention_backward_dq", rows_policy, KOKKOS_LAMBDA(const detail::Member& m) {
        const Index r = m.league_rank();
        const Index i = r % s.T, bh = r / s.T, h = bh % s.NH, b = bh / s.NH;
        const Index q0 = (b * s.T + i) * s.ld + h * s.HS, kvh = h / s.G;
        const Index o0 = (b * s.T + i) * s.C + h * s.HS;
        Scratch dq(m.team_scratch(0), s.HS);
        Acc Di = 0;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(m, s.HS),
            [&](Index d, Acc& a) { a += acc(dout(o0 + d)) * acc(out(o0 + d)); }, Di);
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, s.HS), [&](Index d) { dq(d) = 0; });
        const Acc lse_i = lse(r);
        for (Index j = 0; j <= i; ++j) {
          const Index k0 = (b * s.T + j) * s.ld + s.C + kvh * s.HS, v0 = k0 + s.Ckv;
          Acc qk = 0, dp = 0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(m, s.HS),
              [&](Index d, Acc& a) { a += acc(qkv(q0 + d)) * acc(qkv(k0 + d)); }, qk);
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(m, s.HS),
              [&](Index d, Acc& a) { a += acc(dout(o0 + d)) * acc(qkv(v0 + d)); }, dp);
          const Acc ds = kc::exp(qk * scale - lse_i) * (dp - Di);
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, s.HS),
                               [&](Index d) { dq(d) += ds * acc(qkv(k0 + d)); });
        }
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, s.HS),
                             [&](Index d) { dqkv(q0 + d) = static_cast<T>(dq(d) * scale); });
        Kokkos::single(Kokkos::PerTeam(m), [&]() { Dbuf(r) = Di; });
      });

  // Pass 2: per key row j of kv head kvh (league rank (b*NKV + kvh)*T + j), dk_j and dv_j over
  // the G query heads that share it (in head order) and their queries i >= j.
  detail::Team keys_policy(exec, B * s.NKV * Tlen, 1, vlen);
  keys_policy.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(2 * HS)));
  Kokkos::parallel_for(
      "meshtrain::attention_backward_dkv", keys_policy, KOKKOS_LAMBDA(const detail::Member& m) {
        const Index r = m.league_rank();
        const Index j = r % s.T, bk = r / s.T, kvh = bk % s.NKV, b = bk / s.NKV;
        const Index k0 = (b * s.T + j) * s.ld + s.C + kvh * s.HS, v0 = k0 + s.Ckv;
        Scratch dk(m.team_scratch(0), 2 * s.HS);  // [dk | dv]
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, 2 * s.HS), [&](Index d) { dk(d) = 0; });
        for (Index h = kvh * s.G; h < (kvh + 1) * s.G; ++h)
          for (Index i = j; i < s.T; ++i) {
            const Index q0 = (b * s.T + i) * s.ld + h * s.HS;
            const Index o0 = (b * s.T + i) * s.C + h * s.HS;
            const Index ri = (b * s.NH + h) * s.T + i;
            Acc qk = 0, dp = 0;
            Kokkos::parallel_reduce(
                Kokkos::ThreadVectorRange(m, s.HS),
                [&](Index d, Acc& a) { a += acc(qkv(q0 + d)) * acc(qkv(k0 + d)); }, qk);
            Kokkos::parallel_reduce(
                Kokkos::ThreadVectorRange(m, s.HS),
                [&](Index d, Acc& a) { a += acc(dout(o0 + d)) * acc(qkv(v0 + d)); }, dp);
            const Acc p = kc::exp(qk * scale - Acc(lse(ri)));
            const Acc ds = p * (dp - Dbuf(ri));
            Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, s.HS), [&](Index d) {
              dk(d) += ds * acc(qkv(q0 + d));
              dk(s.HS + d) += p * acc(dout(o0 + d));
            });
          }
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, s.HS), [&](Index d) {
          dqkv(k0 + d) = static_cast<T>(dk(d) * scale);
          dqkv(v0 + d) = static_cast<T>(dk(s.HS + d));
        });
      });
}

// Dispatch (like gemm): host memory goes to the blocked CBLAS path of attention_host.cpp, which
// vectorises where these kernels' per-pair dot products cannot; a CUDA device to the tiled
// FlashAttention-2 kernels of attention_cuda*.cpp (HS in {32, 64, 128}, float and bf16);
// everything else to the portable kernels above.
namespace detail {
// Element types of the CBLAS host path (bf16 has no BLAS; it runs the portable kernels).
template <class T>
inline constexpr bool kHostBlasType = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class T>
void check_forward(const char* fn, View1<T> out, View1<float> lse, View1<const T> qkv, int B,
                   int Tlen, int NH, int HS, int& NKV) {
  const AttnShape s = check_attention(fn, B, Tlen, NH, HS, NKV);
  const std::size_t rows = std::size_t(B) * Tlen;
  check_extent(out, rows * s.C, fn, "out");
  check_extent(qkv, rows * s.ld, fn, "qkv");
  check_extent(lse, rows * NH, fn, "lse");
}

template <class T>
void check_backward(const char* fn, View1<T> dqkv, View1<const T> dout, View1<const T> qkv,
                    View1<const T> out, View1<const float> lse, int B, int Tlen, int NH, int HS,
                    int& NKV) {
  const AttnShape s = check_attention(fn, B, Tlen, NH, HS, NKV);
  const std::size_t rows = std::size_t(B) * Tlen;
  check_extent(dqkv, rows * s.ld, fn, "dqkv");
  check_extent(dout, rows * s.C, fn, "dout");
  check_extent(qkv, rows * s.ld, fn, "qkv");
  check_extent(out, rows * s.C, fn, "out");
  check_extent(lse, rows * NH, fn, "lse");
}
}  // namespace detail

template <class T>
void attention_forward(const ExecSpace& exec, View1<T> out, View1<float> lse, View1<const T> qkv,
                       int B, int Tlen, int NH, int HS, int NKV) {
  detail::check_forward("attention_forward", out, lse, qkv, B, Tlen, NH, HS, NKV);
  if constexpr (kDeviceIsHost && detail::kHostBlasType<T>) {
    detail::attention_forward_host<T>(exec, out, lse, qkv, B, Tlen, NH, HS, NKV);
    return;
  }
#if defined(KOKKOS_ENABLE_CUDA)
  if (detail::attention_forward_cudnn<T>(exec, out, lse, qkv, B, Tlen, NH, HS, NKV)) return;
  if constexpr (detail::kCudaAttentionType<T>) {
    const detail::ToolRegion region(
        [] { return std::string("meshtrain::attention_forward_cuda"); });
    if (detail::attention_forward_cuda<T>(exec, out, lse, qkv, B, Tlen, NH, HS, NKV)) return;
  }
#endif
  attention_forward_flash<T>(exec, out, lse, qkv, B, Tlen, NH, HS, NKV);
}

template <class T>
void attention_backward(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                        View1<const T> qkv, View1<const T> out, View1<const float> lse, int B,
                        int Tlen, int NH, int HS, int NKV) {
  detail::check_backward("attention_backward", dqkv, dout, qkv, out, lse, B, Tlen, NH, HS, NKV);
  if constexpr (kDeviceIsHost && detail::kHostBlasType<T>) {
    detail::attention_backward_host<T>(exec, dqkv, dout, qkv, out, lse, B, Tlen, NH, HS, NKV);
    return;
  }
#if defined(KOKKOS_ENABLE_CUDA)
  if (detail::attention_backward_cudnn<T>(exec, dqkv, dout, qkv, out, lse, B, Tlen, NH, HS, NKV))
    return;
  if constexpr (detail::kCudaAttentionType<T>) {
    const detail::ToolRegion region(
        [] { return std::string("meshtrain::attention_backward_cuda"); });
    if (detail::attention_backward_cuda<T>(exec, dqkv, dout, qkv, out, lse, B, Tlen, NH, HS, NKV))
      return;
  }
#endif
  attention_backward_flash<T>(exec, dqkv, dout, qkv, out, lse, B, Tlen, NH, HS, NKV);
}

template <class T>
void attention_forward_reference(const ExecSpace& exec, View1<T> out, View1<const T> qkv, int B,
                                 int Tlen, int NH, int HS, int NKV) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  using detail::Index;
  const char* fn = "attention_forward_reference";
  const detail::AttnShape s = detail::check_attention(fn, B, Tlen, NH, HS, NKV);
  const std::size_t rows = std::size_t(B) * Tlen;
  detail::check_extent(out, rows * s.C, fn, "out");
  detail::check_extent(qkv, rows * s.ld, fn, "qkv");
  const Acc scale = Acc(1) / kc::sqrt(Acc(HS));
  // The textbook form: materialise the probabilities (two-pass softmax), then P @ V.
  View1<Acc> att = alloc<Acc>("attention_reference_probs", rows * NH * std::size_t(Tlen));
  Kokkos::parallel_for(
      "meshtrain::attention_forward_reference", detail::Range(exec, 0, Index(rows) * NH),
      KOKKOS_LAMBDA(Index r) {
        const Index i = r % s.T, bh = r / s.T, h = bh % s.NH, b = bh / s.NH;
        const Index q0 = (b * s.T + i) * s.ld + h * s.HS, kvh = h / s.G;
        const Index a0 = r * s.T;
        Acc mx = 0;
        for (Index j = 0; j <= i; ++j) {
          const Index k0 = (b * s.T + j) * s.ld + s.C + kvh * s.HS;
          Acc dot = 0;
          for (Index d = 0; d < s.HS; ++d) dot += acc(qkv(q0 + d)) * acc(qkv(k0 + d));
          att(a0 + j) = dot * scale;
          if (j == 0 || att(a0 + j) > mx) mx = att(a0 + j);
        }
        Acc sum = 0;
        for (Index j = 0; j <= i; ++j) {
          att(a0 + j) = kc::exp(att(a0 + j) - mx);
          sum += att(a0 + j);
        }
        for (Index j = 0; j <= i; ++j) att(a0 + j) /= sum;
        const Index o0 = (b * s.T + i) * s.C + h * s.HS;
        for (Index d = 0; d < s.HS; ++d) {
          Acc o = 0;
          for (Index j = 0; j <= i; ++j)
            o += att(a0 + j) * acc(qkv((b * s.T + j) * s.ld + s.C + s.Ckv + kvh * s.HS + d));
          out(o0 + d) = static_cast<T>(o);
        }
      });
}

#define MESHTRAIN_INSTANTIATE_ATTENTION(T)                                                      \
  template void attention_forward<T>(const ExecSpace&, View1<T>, View1<float>, View1<const T>,  \
                                     int, int, int, int, int);                                  \
  template void attention_backward<T>(const ExecSpace&, View1<T>, View1<const T>,               \
                                      View1<const T>, View1<const T>, View1<const float>, int,  \
                                      int, int, int, int);                                      \
  template void attention_forward_flash<T>(const ExecSpace&, View1<T>, View1<float>,            \
                                           View1<const T>, int, int, int, int, int);            \
  template void attention_backward_flash<T>(const ExecSpace&, View1<T>, View1<const T>,         \
                                            View1<const T>, View1<const T>, View1<const float>, \
                                            int, int, int, int, int);                           \
  template void attention_forward_reference<T>(const ExecSpace&, View1<T>, View1<const T>, int, \
                                               int, int, int, int);
MESHTRAIN_INSTANTIATE_ATTENTION(float)
MESHTRAIN_INSTANTIATE_ATTENTION(double)
// bf16 (the same bits as CUDA's __nv_bfloat16): tensor-core kernels on CUDA, the portable
// kernels elsewhere. fp16: the portable kernels.
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_ATTENTION(bf16)
MESHTRAIN_INSTANTIATE_ATTENTION(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_ATTENTION

}  // namespace meshtrain::kernels
