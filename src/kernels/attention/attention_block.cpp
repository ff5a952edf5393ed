// Block attention for ring attention (attention_block.hpp): the portable kernels, structured as
// attention.cpp's (one team per query row with an online softmax forward; a backward in two
// passes, over query rows for dq and over key rows for dk and dv, so every output row is summed
// by one team in a fixed order: no atomics, the same bits on every run). On a CUDA device the
// forward and backward hand bf16/fp16 blocks to cuDNN first (attention_block_cudnn.cpp).
#include "meshtrain/kernels/attention/attention_block.hpp"

#include <atomic>
#include <cmath>
#include <limits>

#include "../common.hpp"
#include "attention_cudnn.hpp"

namespace meshtrain::kernels {

namespace {

using detail::Index;

void check_shape(const char* fn, const AttentionBlockShape& s) {
  MESHTRAIN_CHECK(s.B >= 0 && s.Tq >= 0 && s.Tk >= 0 && s.NH > 0 && s.NKV > 0 && s.HS > 0 &&
                      s.NH % s.NKV == 0,
                  fn, ": bad shape B=", s.B, ", Tq=", s.Tq, ", Tk=", s.Tk, ", NH=", s.NH,
                  ", NKV=", s.NKV, ", HS=", s.HS);
  MESHTRAIN_CHECK(!s.causal || s.Tq == s.Tk, fn, ": a causal block needs Tq == Tk (", s.Tq,
                  " vs ", s.Tk, ")");
}

// The highest element a slice of `rows` rows of `width` columns reads, plus one.
template <class V>
void check_rows(const char* fn, const char* what, const V& v, const RowSlice& r, int B, int rows,
                std::int64_t width) {
  if (B == 0 || rows == 0) return;
  const std::int64_t end = r.offset + (B - 1) * r.batch + (rows - 1) * r.row + width;
  MESHTRAIN_CHECK(r.offset >= 0 && end <= static_cast<std::int64_t>(v.extent(0)), fn, ": ", what,
                  " slice ends at ", end, " beyond its ", v.extent(0), " elements");
}
template <class V>
void check_stats(const char* fn, const char* what, const V& v, const StatSlice& s, int B, int NH,
                 int rows) {
  if (B == 0 || rows == 0) return;
  const std::int64_t end = s.offset + (B - 1) * s.batch + (NH - 1) * s.head + rows;
  MESHTRAIN_CHECK(s.offset >= 0 && end <= static_cast<std::int64_t>(v.extent(0)), fn, ": ", what,
                  " slice ends at ", end, " beyond its ", v.extent(0), " elements");
}

std::atomic<std::int64_t> g_cudnn_block_calls{0};

}  // namespace

std::int64_t cudnn_attention_block_calls() { return g_cudnn_block_calls.load(); }
void detail::count_cudnn_attention_block_call() { ++g_cudnn_block_calls; }

template <class T, class A>
void attention_block_forward(const ExecSpace& exec, const AttentionBlockShape& s,
                             View1<const T> q, RowSlice qs, View1<const T> k, RowSlice ks,
                             View1<const T> v, RowSlice vs, View1<A> out, RowSlice os,
                             View1<A> lse, StatSlice ls) {
  const char* fn = "attention_block_forward";
  check_shape(fn, s);
  const std::int64_t C = std::int64_t(s.NH) * s.HS, Ckv = std::int64_t(s.NKV) * s.HS;
  check_rows(fn, "q", q, qs, s.B, s.Tq, C);
  check_rows(fn, "k", k, ks, s.B, s.Tk, Ckv);
  check_rows(fn, "v", v, vs, s.B, s.Tk, Ckv);
  check_rows(fn, "out", out, os, s.B, s.Tq, C);
  check_stats(fn, "lse", lse, ls, s.B, s.NH, s.Tq);
  if (detail::attention_block_forward_cudnn<T, A>(exec, s, q, qs, k, ks, v, vs, out, os, lse, ls))
    return;
  const Index Tq = s.Tq, Tk = s.Tk, NH = s.NH, HS = s.HS, G = s.NH / s.NKV;
  const bool causal = s.causal;
  const A scale = A(1) / std::sqrt(A(s.HS));
  const A lowest = detail::kLowest<A>;
  const A minus_inf = -std::numeric_limits<A>::infinity();
  using Scratch = detail::ScratchView<A>;
  detail::Team policy(exec, s.B * s.NH * s.Tq, 1, detail::vector_length_for(s.HS));
  policy.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(s.HS)));
  Kokkos::parallel_for(
      "meshtrain::attention_block_forward", policy, KOKKOS_LAMBDA(const detail::Member& m) {
        const Index r = m.league_rank();
        const Index i = r % Tq, bh = r / Tq, h = bh % NH, b = bh / NH, kvh = h / G;
        const Index q0 = qs.offset + b * qs.batch + i * qs.row + h * HS;
        Scratch o(m.team_scratch(0), HS);
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, HS), [&](Index d) { o(d) = 0; });
        A mx = lowest, l = 0;
        const Index last = causal ? i + 1 : Tk;
        for (Index j = 0; j < last; ++j) {
          const Index k0 = ks.offset + b * ks.batch + j * ks.row + kvh * HS;
          const Index v0 = vs.offset + b * vs.batch + j * vs.row + kvh * HS;
          A dot = 0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(m, HS),
              [&](Index d, A& a) { a += static_cast<A>(q(q0 + d)) * static_cast<A>(k(k0 + d)); },
              dot);
          const A sc = dot * scale;
          const A mnew = sc > mx ? sc : mx;
          const A corr = kc::exp(mx - mnew), p = kc::exp(sc - mnew);
          l = l * corr + p;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, HS), [&](Index d) {
            o(d) = o(d) * corr + p * static_cast<A>(v(v0 + d));
          });
          mx = mnew;
        }
        const Index o0 = os.offset + b * os.batch + i * os.row + h * HS;
        const A inv = l > 0 ? A(1) / l : A(0);
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, HS),
                             [&](Index d) { out(o0 + d) = o(d) * inv; });
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          lse(ls.offset + b * ls.batch + h * ls.head + i) = l > 0 ? mx + kc::log(l) : minus_inf;
        });
      });
}

template <class A>
void attention_merge(const ExecSpace& exec, int B, int Tq, int NH, int HS, View1<A> acc,
                     RowSlice as, View1<A> acc_lse, StatSlice als, View1<const A> blk,
                     RowSlice bs, View1<const A> blk_lse, StatSlice bls) {
  const char* fn = "attention_merge";
  const std::int64_t C = std::int64_t(NH) * HS;
  check_rows(fn, "acc", acc, as, B, Tq, C);
  check_rows(fn, "blk", blk, bs, B, Tq, C);
  check_stats(fn, "acc_lse", acc_lse, als, B, NH, Tq);
  check_stats(fn, "blk_lse", blk_lse, bls, B, NH, Tq);
  const Index T = Tq, H = NH, D = HS;
  const A minus_inf = -std::numeric_limits<A>::infinity();
  Kokkos::parallel_for(
      "meshtrain::attention_merge", detail::Range(exec, 0, Index(B) * NH * Tq),
      KOKKOS_LAMBDA(const Index r) {
        const Index i = r % T, bh = r / T, h = bh % H, b = bh / H;
        A& la = acc_lse(als.offset + b * als.batch + h * als.head + i);
        const A lb = blk_lse(bls.offset + b * bls.batch + h * bls.head + i);
        if (lb == minus_inf) return;  // the block saw no key of this row
        const Index a0 = as.offset + b * as.batch + i * as.row + h * D;
        const Index b0 = bs.offset + b * bs.batch + i * bs.row + h * D;
        if (la == minus_inf) {
          for (Index d = 0; d < D; ++d) acc(a0 + d) = blk(b0 + d);
          la = lb;
          return;
        }
        const A mx = la > lb ? la : lb;
        const A wa = kc::exp(la - mx), wb = kc::exp(lb - mx), sum = wa + wb;
        for (Index d = 0; d < D; ++d) acc(a0 + d) = (acc(a0 + d) * wa + blk(b0 + d) * wb) / sum;
        la = mx + kc::log(sum);
      });
}

template <class T, class A>
void attention_rowdot(const ExecSpace& exec, int B, int Tq, int NH, int HS, View1<const T> dout,
                      RowSlice dos, View1<const T> out, RowSlice os, View1<A> D, StatSlice Ds) {
  const char* fn = "attention_rowdot";
  const std::int64_t C = std::int64_t(NH) * HS;
  check_rows(fn, "dout", dout, dos, B, Tq, C);
  check_rows(fn, "out", out, os, B, Tq, C);
  check_stats(fn, "D", D, Ds, B, NH, Tq);
  const Index rows = Tq, H = NH, W = HS;
  Kokkos::parallel_for(
      "meshtrain::attention_rowdot", detail::Range(exec, 0, Index(B) * NH * Tq),
      KOKKOS_LAMBDA(const Index r) {
        const Index i = r % rows, bh = r / rows, h = bh % H, b = bh / H;
        const Index g0 = dos.offset + b * dos.batch + i * dos.row + h * W;
        const Index o0 = os.offset + b * os.batch + i * os.row + h * W;
        A sum = 0;
        for (Index d = 0; d < W; ++d) sum += static_cast<A>(dout(g0 + d)) * static_cast<A>(out(o0 + d));
        D(Ds.offset + b * Ds.batch + h * Ds.head + i) = sum;
      });
}

template <class T, class A>
void attention_block_backward(const ExecSpace& exec, const AttentionBlockShape& s,
                              View1<const T> q, RowSlice qs, View1<const T> k, RowSlice ks,
                              View1<const T> v, RowSlice vs, View1<const T> dout, RowSlice dos,
                              View1<const T> out, RowSlice outs, View1<const A> lse,
                              StatSlice ls, View1<const A> D, StatSlice Ds, View1<A> dq,
                              RowSlice dqs, View1<A> dk, RowSlice dks, View1<A> dv, RowSlice dvs) {
  const char* fn = "attention_block_backward";
  check_shape(fn, s);
  const std::int64_t C = std::int64_t(s.NH) * s.HS, Ckv = std::int64_t(s.NKV) * s.HS;
  check_rows(fn, "q", q, qs, s.B, s.Tq, C);
  check_rows(fn, "k", k, ks, s.B, s.Tk, Ckv);
  check_rows(fn, "v", v, vs, s.B, s.Tk, Ckv);
  check_rows(fn, "dout", dout, dos, s.B, s.Tq, C);
  check_rows(fn, "dq", dq, dqs, s.B, s.Tq, C);
  check_rows(fn, "dk", dk, dks, s.B, s.Tk, Ckv);
  check_rows(fn, "dv", dv, dvs, s.B, s.Tk, Ckv);
  check_stats(fn, "lse", lse, ls, s.B, s.NH, s.Tq);
  check_stats(fn, "D", D, Ds, s.B, s.NH, s.Tq);
  check_rows(fn, "out", out, outs, s.B, s.Tq, C);
  if (detail::attention_block_backward_cudnn<T, A>(exec, s, q, qs, k, ks, v, vs, dout, dos, out,
                                                   outs, lse, ls, dq, dqs, dk, dks, dv, dvs))
    return;
  const Index Tq = s.Tq, Tk = s.Tk, NH = s.NH, NKV = s.NKV, HS = s.HS, G = s.NH / s.NKV;
  const bool causal = s.causal;
  const A scale = A(1) / std::sqrt(A(s.HS));
  using Scratch = detail::ScratchView<A>;
  const int vlen = detail::vector_length_for(s.HS);

  // Pass 1: per query row, dq += scale sum_j dS_ij k_j.
  detail::Team rows_policy(exec, s.B * s.NH * s.Tq, 1, vlen);
  rows_policy.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(s.HS)));
  Kokkos::parallel_for(
      "meshtrain::attention_block_backward_dq", rows_policy,
      KOKKOS_LAMBDA(const detail::Member& m) {
        const Index r = m.league_rank();
        const Index i = r % Tq, bh = r / Tq, h = bh % NH, b = bh / NH, kvh = h / G;
        const Index q0 = qs.offset + b * qs.batch + i * qs.row + h * HS;
        const Index g0 = dos.offset + b * dos.batch + i * dos.row + h * HS;
        const A lse_i = lse(ls.offset + b * ls.batch + h * ls.head + i);
        const A D_i = D(Ds.offset + b * Ds.batch + h * Ds.head + i);
        Scratch acc(m.team_scratch(0), HS);
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, HS), [&](Index d) { acc(d) = 0; });
        const Index last = causal ? i + 1 : Tk;
        for (Index j = 0; j < last; ++j) {
          const Index k0 = ks.offset + b * ks.batch + j * ks.row + kvh * HS;
          const Index v0 = vs.offset + b * vs.batch + j * vs.row + kvh * HS;
          A qk = 0, dp = 0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(m, HS),
              [&](Index d, A& a) { a += static_cast<A>(q(q0 + d)) * static_cast<A>(k(k0 + d)); },
              qk);
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(m, HS),
              [&](Index d, A& a) { a += static_cast<A>(dout(g0 + d)) * static_cast<A>(v(v0 + d)); },
              dp);
          const A ds = kc::exp(qk * scale - lse_i) * (dp - D_i);
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, HS),
                               [&](Index d) { acc(d) += ds * static_cast<A>(k(k0 + d)); });
        }
        const Index d0 = dqs.offset + b * dqs.batch + i * dqs.row + h * HS;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, HS),
                             [&](Index d) { dq(d0 + d) += acc(d) * scale; });
      });

  // Pass 2: per key row j of kv head kvh, over the G query heads that share it and the query
  // rows that see it: dk += scale sum dS_ij q_i, dv += sum P_ij dO_i.
  detail::Team keys_policy(exec, s.B * s.NKV * s.Tk, 1, vlen);
  keys_policy.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(2 * s.HS)));
  Kokkos::parallel_for(
      "meshtrain::attention_block_backward_dkv", keys_policy,
      KOKKOS_LAMBDA(const detail::Member& m) {
        const Index r = m.league_rank();
        const Index j = r % Tk, bk = r / Tk, kvh = bk % NKV, b = bk / NKV;
        const Index k0 = ks.offset + b * ks.batch + j * ks.row + kvh * HS;
        const Index v0 = vs.offset + b * vs.batch + j * vs.row + kvh * HS;
        Scratch acc(m.team_scratch(0), 2 * HS);  // [dk | dv]
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, 2 * HS), [&](Index d) { acc(d) = 0; });
        for (Index h = kvh * G; h < (kvh + 1) * G; ++h)
          for (Index i = causal ? j : 0; i < Tq; ++i) {
            const Index q0 = qs.offset + b * qs.batch + i * qs.row + h * HS;
            const Index g0 = dos.offset + b * dos.batch + i * dos.row + h * HS;
            const Index si = b * ls.batch + h * ls.head + i;
            A qk = 0, dp = 0;
            Kokkos::parallel_reduce(
                Kokkos::ThreadVectorRange(m, HS),
                [&](Index d, A& a) { a += static_cast<A>(q(q0 + d)) * static_cast<A>(k(k0 + d)); },
                qk);
            Kokkos::parallel_reduce(
                Kokkos::ThreadVectorRange(m, HS),
                [&](Index d, A& a) { a += static_cast<A>(dout(g0 + d)) * static_cast<A>(v(v0 + d)); },
                dp);
            const A p = kc::exp(qk * scale - lse(ls.offset + si));
            const A ds = p * (dp - D(Ds.offset + b * Ds.batch + h * Ds.head + i));
            Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, HS), [&](Index d) {
              acc(d) += ds * static_cast<A>(q(q0 + d));
              acc(HS + d) += p * static_cast<A>(dout(g0 + d));
            });
          }
        const Index dk0 = dks.offset + b * dks.batch + j * dks.row + kvh * HS;
        const Index dv0 = dvs.offset + b * dvs.batch + j * dvs.row + kvh * HS;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, HS), [&](Index d) {
          dk(dk0 + d) += acc(d) * scale;
          dv(dv0 + d) += acc(HS + d);
        });
      });
}

#define MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK(T, A)                                              \
  template void attention_block_forward<T, A>(const ExecSpace&, const AttentionBlockShape&,      \
                                              View1<const T>, RowSlice, View1<const T>, RowSlice, \
                                              View1<const T>, RowSlice, View1<A>, RowSlice,       \
                                              View1<A>, StatSlice);                               \
  template void attention_rowdot<T, A>(const ExecSpace&, int, int, int, int, View1<const T>,      \
                                       RowSlice, View1<const T>, RowSlice, View1<A>, StatSlice);  \
  template void attention_block_backward<T, A>(                                                  \
      const ExecSpace&, const AttentionBlockShape&, View1<const T>, RowSlice, View1<const T>,    \
      RowSlice, View1<const T>, RowSlice, View1<const T>, RowSlice, View1<const T>, RowSlice,    \
      View1<const A>, StatSlice, View1<const A>, StatSlice, View1<A>, RowSlice, View1<A>,        \
      RowSlice, View1<A>, RowSlice);
MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK(float, float)
MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK(double, double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK(bf16, float)
MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK(fp16, float)
#endif
#undef MESHTRAIN_INSTANTIATE_ATTENTION_BLOCK

template void attention_merge<float>(const ExecSpace&, int, int, int, int, View1<float>, RowSlice,
                                     View1<float>, StatSlice, View1<const float>, RowSlice,
                                     View1<const float>, StatSlice);
template void attention_merge<double>(const ExecSpace&, int, int, int, int, View1<double>,
                                      RowSlice, View1<double>, StatSlice, View1<const double>,
                                      RowSlice, View1<const double>, StatSlice);

}  // namespace meshtrain::kernels
