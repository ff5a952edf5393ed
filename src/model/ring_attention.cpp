#include "meshtrain/model/ring_attention.hpp"

#include <limits>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/kernels/attention/attention_block.hpp"

namespace meshtrain::model {

namespace k = kernels;

CpComm parse_cp_comm(const std::string& text) {
  if (text == "ring") return CpComm::ring;
  if (text == "all_gather") return CpComm::all_gather;
  throw ConfigError(cat("cp.comm='", text, "' must be ring or all_gather"));
}

const char* cp_comm_name(CpComm c) { return c == CpComm::ring ? "ring" : "all_gather"; }

std::vector<int> cp_positions(int T, int cp, int r) {
  MESHTRAIN_CHECK(cp > 0 && r >= 0 && r < cp && T % (2 * cp) == 0, "cp_positions: T=", T,
                  " is not divisible by 2 x cp=", 2 * cp);
  const int c = T / (2 * cp);
  std::vector<int> p;
  p.reserve(static_cast<std::size_t>(2 * c));
  for (int t = 0; t < c; ++t) p.push_back(r * c + t);
  for (int t = 0; t < c; ++t) p.push_back((2 * cp - 1 - r) * c + t);
  return p;
}

std::size_t ring_attention_bytes(CpComm how, int cp, std::size_t B, std::size_t Tl,
                                 std::size_t NH, std::size_t NKV, std::size_t HS,
                                 std::size_t E) {
  const std::size_t A = E == 8 ? 8 : 4, rows = B * Tl, C = NH * HS, W = 2 * NKV * HS;
  const std::size_t stats = B * NH * Tl, n = static_cast<std::size_t>(cp);
  // acc, blk, dq; acc_lse, blk_lse, D
  std::size_t b = 3 * rows * C * A + 3 * stats * A;
  if (how == CpComm::ring)
    b += 2 * rows * W * E + 2 * rows * W * A;  // kv and dkv, double-buffered
  else
    b += rows * W * E + n * rows * W * E + n * rows * W * A + rows * W * A;  // own, gathered
  return b;
}

namespace {

template <class V>
void ensure(V& v, const char* label, std::size_t n) {
  if (v.extent(0) != n) v = alloc<typename V::value_type>(label, n);
}

// dst rows [B*Tl, width] (contiguous) <- columns [col0, col0 + width) of src rows of `ld`.
template <class D, class S>
void copy_columns(const ExecSpace& exec, View1<D> dst, View1<const S> src, std::size_t rows,
                  std::int64_t ld, std::int64_t col0, std::int64_t width, std::int64_t dst_ld,
                  std::int64_t dst_col0) {
  Kokkos::parallel_for(
      "meshtrain::ring_attention_copy",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
          exec, 0, static_cast<std::int64_t>(rows) * width),
      KOKKOS_LAMBDA(const std::int64_t e) {
        const std::int64_t row = e / width, c = e % width;
        dst(row * dst_ld + dst_col0 + c) = static_cast<D>(src(row * ld + col0 + c));
      });
}

}  // namespace

template <class T>
RingAttention<T>::RingAttention(comm::Communicator& cp, CpComm how, int B, int Tl, int NH,
                                int NKV, int HS, ExecSpace exec)
    : cp_(cp), how_(how), B_(B), Tl_(Tl), NH_(NH), NKV_(NKV), HS_(HS), r_(cp.rank()),
      n_(cp.size()), exec_(exec) {
  MESHTRAIN_CHECK(Tl % 2 == 0, "RingAttention: ", Tl, " local rows are not two equal chunks");
  if (how_ == CpComm::ring && n_ > 1) cp_.prepare_p2p({(r_ + 1) % n_, (r_ + n_ - 1) % n_});
}

template <class T>
RingAttention<T>::~RingAttention() = default;

template <class T>
std::size_t RingAttention<T>::bytes() const {
  std::size_t b = 0;
  for (const auto* v : {&acc_, &acc_lse_, &blk_, &blk_lse_, &dq_, &D_, &dkv_[0], &dkv_[1], &dkv_all_})
    b += v->span() * sizeof(A);
  for (const auto* v : {&kv_[0], &kv_[1], &kv_all_}) b += v->span() * sizeof(T);
  return b;
}

// The block of source `src` (the rank whose keys and values k_buf/v_buf hold, rows of
// `kv_row`): causal over all rows for this rank's own; its first chunk for all query rows when
// src < r; all its rows for the second query chunk when src > r. Merged into acc_.
template <class T>
void RingAttention<T>::block_forward(int src, View1<const T> k_buf, View1<const T> v_buf,
                                     std::int64_t k_off, std::int64_t v_off, std::int64_t kv_row,
                                     View1<const T> qkv) {
  const int C = NH_ * HS_, Ckv = NKV_ * HS_, ld = C + 2 * Ckv, c = Tl_ / 2;
  k::AttentionBlockShape s{B_, Tl_, Tl_, NH_, NKV_, HS_, src == r_};
  int q_row0 = 0, kv_rows = Tl_;
  if (src < r_) kv_rows = c;  // all queries, the source's first chunk
  if (src > r_) q_row0 = c;   // the second query chunk, all of the source's rows
  s.Tq = Tl_ - q_row0;
  s.Tk = kv_rows;
  const k::RowSlice qs{std::int64_t(q_row0) * ld, ld, std::int64_t(Tl_) * ld};
  const k::RowSlice ks{k_off, kv_row, std::int64_t(Tl_) * kv_row};
  const k::RowSlice vs{v_off, kv_row, std::int64_t(Tl_) * kv_row};
  const k::RowSlice os = k::rows_of(Tl_, C, q_row0);
  const k::StatSlice ls = k::stats_of(Tl_, NH_, q_row0);
  k::attention_block_forward<T, A>(exec_, s, qkv, qs, k_buf, ks, v_buf, vs, blk_, os, blk_lse_, ls);
  k::attention_merge<A>(exec_, B_, s.Tq, NH_, HS_, acc_, os, acc_lse_, ls, blk_, os, blk_lse_, ls);
}

template <class T>
void RingAttention<T>::forward(View1<T> out, View1<float> lse, View1<const T> qkv) {
  const int C = NH_ * HS_, Ckv = NKV_ * HS_, ld = C + 2 * Ckv;
  const std::size_t rows = std::size_t(B_) * Tl_;
  MESHTRAIN_CHECK(qkv.span() == rows * ld && out.span() == rows * C &&
                      lse.span() == std::size_t(B_) * NH_ * Tl_,
                  "RingAttention::forward: buffer sizes do not match B=", B_, ", Tl=", Tl_);
  ensure(acc_, "ring_attention.acc", rows * C);
  ensure(blk_, "ring_attention.blk", rows * C);
  ensure(acc_lse_, "ring_attention.acc_lse", std::size_t(B_) * NH_ * Tl_);
  ensure(blk_lse_, "ring_attention.blk_lse", std::size_t(B_) * NH_ * Tl_);
  Kokkos::deep_copy(exec_, acc_lse_, -std::numeric_limits<A>::infinity());
  if (how_ == CpComm::all_gather) {
    forward_all_gather(qkv);
  } else {
    // This rank's own block straight from qkv while its keys and values start round the ring.
    ensure(kv_[0], "ring_attention.kv0", rows * 2 * Ckv);
    ensure(kv_[1], "ring_attention.kv1", rows * 2 * Ckv);
    copy_columns<T, T>(exec_, kv_[0], qkv, rows, ld, C, 2 * Ckv, 2 * Ckv, 0);
    const int next = (r_ + 1) % n_, prev = (r_ + n_ - 1) % n_;
    for (int i = 0; i < n_; ++i) {
      const View1<T> cur = kv_[i % 2], nxt = kv_[(i + 1) % 2];
      comm::Request send, recv;
      if (i + 1 < n_) {
        send = cp_.isend(cur, next, i);
        recv = cp_.irecv(nxt, prev, i);
        comm_bytes_ += static_cast<double>(cur.span() * sizeof(T));
      }
      const int src = (r_ - i + n_) % n_;
      if (i == 0)
        block_forward(src, qkv, qkv, C, C + Ckv, ld, qkv);
      else
        block_forward(src, cur, cur, 0, Ckv, 2 * Ckv, qkv);
      Timer t;
      recv.wait();
      send.wait();
      wait_s_ += t.seconds();
    }
  }
  // The merged output and lse.
  const View1<const A> acc = acc_;
  const View1<const A> acc_lse = acc_lse_;
  Kokkos::parallel_for(
      "meshtrain::ring_attention_out",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
          exec_, 0, static_cast<std::int64_t>(rows) * C),
      KOKKOS_LAMBDA(const std::int64_t e) { out(e) = static_cast<T>(acc(e)); });
  Kokkos::parallel_for(
      "meshtrain::ring_attention_lse",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
          exec_, 0, static_cast<std::int64_t>(B_) * NH_ * Tl_),
      KOKKOS_LAMBDA(const std::int64_t e) { lse(e) = static_cast<float>(acc_lse(e)); });
}

template <class T>
void RingAttention<T>::forward_all_gather(View1<const T> qkv) {
  const int C = NH_ * HS_, Ckv = NKV_ * HS_, ld = C + 2 * Ckv;
  const std::size_t rows = std::size_t(B_) * Tl_, per = rows * 2 * Ckv;
  ensure(kv_[0], "ring_attention.kv0", per);
  ensure(kv_all_, "ring_attention.kv_all", per * n_);
  copy_columns<T, T>(exec_, kv_[0], qkv, rows, ld, C, 2 * Ckv, 2 * Ckv, 0);
  cp_.all_gather(kv_[0], kv_all_);
  comm_bytes_ += static_cast<double>(per * (n_ - 1) * sizeof(T));
  for (int src = 0; src < n_; ++src) {
    if (src == r_) {
      block_forward(src, qkv, qkv, C, C + Ckv, ld, qkv);
      continue;
    }
    const std::int64_t base = std::int64_t(src) * std::int64_t(per);
    block_forward(src, kv_all_, kv_all_, base, base + Ckv, 2 * Ckv, qkv);
  }
}

template <class T>
void RingAttention<T>::block_backward(int src, View1<const T> k_buf, View1<const T> v_buf,
                                      std::int64_t k_off, std::int64_t v_off, std::int64_t kv_row,
                                      View1<A> dkv, View1<const T> qkv, View1<const T> dout,
                                      View1<const T> out) {
  const int C = NH_ * HS_, Ckv = NKV_ * HS_, ld = C + 2 * Ckv, c = Tl_ / 2;
  k::AttentionBlockShape s{B_, Tl_, Tl_, NH_, NKV_, HS_, src == r_};
  int q_row0 = 0, kv_rows = Tl_;
  if (src < r_) kv_rows = c;
  if (src > r_) q_row0 = c;
  s.Tq = Tl_ - q_row0;
  s.Tk = kv_rows;
  const k::RowSlice qs{std::int64_t(q_row0) * ld, ld, std::int64_t(Tl_) * ld};
  const k::RowSlice ks{k_off, kv_row, std::int64_t(Tl_) * kv_row};
  const k::RowSlice vs{v_off, kv_row, std::int64_t(Tl_) * kv_row};
  const k::RowSlice os = k::rows_of(Tl_, C, q_row0);
  const k::StatSlice ls = k::stats_of(Tl_, NH_, q_row0);
  // dK and dV of the source: [B, Tl, 2 NKV HS] accumulators (k | v), its first kv_rows rows.
  const k::RowSlice dks = k::rows_of(Tl_, 2 * Ckv, 0, 0);
  const k::RowSlice dvs = k::rows_of(Tl_, 2 * Ckv, 0, Ckv);
  k::attention_block_backward<T, A>(exec_, s, qkv, qs, k_buf, ks, v_buf, vs, dout, os, out, os,
                                    View1<const A>(acc_lse_), ls, View1<const A>(D_), ls, dq_, os,
                                    dkv, dks, dkv, dvs);
}

template <class T>
void RingAttention<T>::backward(View1<T> dqkv, View1<const T> dout, View1<const T> qkv,
                                View1<const T> out, View1<const float> lse) {
  const int C = NH_ * HS_, Ckv = NKV_ * HS_, ld = C + 2 * Ckv;
  const std::size_t rows = std::size_t(B_) * Tl_, per = rows * 2 * Ckv;
  const std::size_t stats = std::size_t(B_) * NH_ * Tl_;
  MESHTRAIN_CHECK(dqkv.span() == rows * ld && dout.span() == rows * C && qkv.span() == rows * ld &&
                      out.span() == rows * C && lse.span() == stats,
                  "RingAttention::backward: buffer sizes do not match B=", B_, ", Tl=", Tl_);
  ensure(dq_, "ring_attention.dq", rows * C);
  ensure(D_, "ring_attention.D", stats);
  ensure(acc_lse_, "ring_attention.acc_lse", stats);
  Kokkos::deep_copy(exec_, dq_, A(0));
  // The forward's lse (of this micro-batch: others have run since) in the accumulation type.
  {
    const View1<A> l = acc_lse_;
    Kokkos::parallel_for(
        "meshtrain::ring_attention_lse_in",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
            exec_, 0, static_cast<std::int64_t>(stats)),
        KOKKOS_LAMBDA(const std::int64_t e) { l(e) = static_cast<A>(lse(e)); });
  }
  k::attention_rowdot<T, A>(exec_, B_, Tl_, NH_, HS_, dout, k::rows_of(Tl_, C), out,
                            k::rows_of(Tl_, C), D_, k::stats_of(Tl_, NH_));
  View1<A> own;  // this rank's dK | dV, complete
  if (how_ == CpComm::all_gather) {
    ensure(kv_[0], "ring_attention.kv0", per);
    ensure(kv_all_, "ring_attention.kv_all", per * n_);
    ensure(dkv_all_, "ring_attention.dkv_all", per * n_);
    ensure(dkv_[0], "ring_attention.dkv0", per);
    copy_columns<T, T>(exec_, kv_[0], qkv, rows, ld, C, 2 * Ckv, 2 * Ckv, 0);
    cp_.all_gather(kv_[0], kv_all_);
    Kokkos::deep_copy(exec_, dkv_all_, A(0));
    for (int src = 0; src < n_; ++src) {
      const std::int64_t base = std::int64_t(src) * std::int64_t(per);
      const View1<A> d = slice(dkv_all_, std::size_t(base), per);
      if (src == r_)
        block_backward(src, qkv, qkv, C, C + Ckv, ld, d, qkv, dout, out);
      else
        block_backward(src, kv_all_, kv_all_, base, base + Ckv, 2 * Ckv, d, qkv, dout, out);
    }
    cp_.reduce_scatter(dkv_all_, dkv_[0]);
    comm_bytes_ += static_cast<double>(per * (n_ - 1) * (sizeof(T) + sizeof(A)));
    own = dkv_[0];
  } else {
    for (int b = 0; b < 2; ++b) {
      ensure(kv_[b], b ? "ring_attention.kv1" : "ring_attention.kv0", per);
      ensure(dkv_[b], b ? "ring_attention.dkv1" : "ring_attention.dkv0", per);
    }
    copy_columns<T, T>(exec_, kv_[0], qkv, rows, ld, C, 2 * Ckv, 2 * Ckv, 0);
    Kokkos::deep_copy(exec_, dkv_[0], A(0));
    const int next = (r_ + 1) % n_, prev = (r_ + n_ - 1) % n_;
    // Step i holds the keys and values of rank r - i and their gradient so far; both move on
    // (the keys before the compute, the gradient after it), and after the last step the
    // gradient of this rank's own arrives from the previous rank.
    for (int i = 0; i < n_; ++i) {
      const View1<T> cur = kv_[i % 2], nxt = kv_[(i + 1) % 2];
      const View1<A> dcur = dkv_[i % 2], dnxt = dkv_[(i + 1) % 2];
      comm::Request ksend, krecv;
      if (i + 1 < n_) {
        ksend = cp_.isend(cur, next, 2 * i);
        krecv = cp_.irecv(nxt, prev, 2 * i);
        comm_bytes_ += static_cast<double>(cur.span() * sizeof(T));
      }
      const int src = (r_ - i + n_) % n_;
      if (i == 0)
        block_backward(src, qkv, qkv, C, C + Ckv, ld, dcur, qkv, dout, out);
      else
        block_backward(src, cur, cur, 0, Ckv, 2 * Ckv, dcur, qkv, dout, out);
      if (n_ == 1) {
        own = dcur;
        break;
      }
      comm::Request dsend = cp_.isend(dcur, next, 2 * i + 1);
      comm::Request drecv = cp_.irecv(dnxt, prev, 2 * i + 1);
      comm_bytes_ += static_cast<double>(dcur.span() * sizeof(A));
      Timer t;
      krecv.wait();
      ksend.wait();
      drecv.wait();
      dsend.wait();
      wait_s_ += t.seconds();
      if (i + 1 == n_) own = dnxt;
    }
  }
  // dqkv = [dq | dk | dv] per row.
  const View1<const A> dq = dq_, dkv = own;
  const std::int64_t width = ld, Cq = C, W = 2 * Ckv;
  Kokkos::parallel_for(
      "meshtrain::ring_attention_dqkv",
      Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(
          exec_, 0, static_cast<std::int64_t>(rows) * width),
      KOKKOS_LAMBDA(const std::int64_t e) {
        const std::int64_t row = e / width, col = e % width;
        dqkv(e) = static_cast<T>(col < Cq ? dq(row * Cq + col) : dkv(row * W + col - Cq));
      });
}

template class RingAttention<float>;
template class RingAttention<double>;
#if MESHTRAIN_HAVE_BF16
template class RingAttention<bf16>;
template class RingAttention<fp16>;
#endif

}  // namespace meshtrain::model
