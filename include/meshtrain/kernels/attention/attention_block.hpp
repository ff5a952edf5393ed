#pragma once
// Attention between a block of query rows and a block of key/value rows that live in different
// buffers: the unit of ring (context-parallel) attention, where each rank holds a slice of every
// sequence and the key/value slices of the others pass by (parallel/ring_attention.hpp).
//
// A block is causal (the query and key rows are the same positions: key j is seen by query i
// iff j <= i) or full (every key row precedes every query row). Its forward writes a partial
// output, normalised over the block's keys, and the block's log-sum-exp; partials of the same
// query rows merge exactly by their log-sum-exps (attention_merge). Its backward takes the
// merged output and log-sum-exp of the query rows (FlashAttention-2's backward is blockwise
// given them: P = exp(s - lse), dS = P (dP - D), D = dO . O) and adds its share to dq, dk, dv.
//
// Buffers are addressed through slices, so a block can be a range of rows inside a bigger
// buffer (the second half of a rank's rows; the key/value part of a packed qkv row):
//   rows: element (b, i, c) at offset + b * batch + i * row + c   (c: head * HS + d)
//   stats (lse, D): (b, h, i) at offset + b * batch + h * head + i
// Grouped-query attention as attention.hpp: query head h reads kv head h / (NH / NKV).
// Partial outputs, lse, D and the gradient accumulators are in the accumulation type (fp32,
// fp64 for double); the inputs in T. The portable Kokkos kernels here are the oracle of any
// faster path and run everywhere.
//
// On a CUDA device, for T = bf16/fp16 (A = float), forward and backward run on cuDNN's fused
// flash attention first, under --attn.impl as attention_forward/backward (attention.hpp): its
// forward writes the block's output in T, so the partial is rounded to T once before the fp32
// merge (as TransformerEngine's context parallelism does); its backward writes the block's dQ,
// dK, dV in T, added to the fp32 accumulators.
#include <cstdint>

#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

struct RowSlice {
  std::int64_t offset = 0, row = 0, batch = 0;
};
struct StatSlice {
  std::int64_t offset = 0, head = 0, batch = 0;
};

struct AttentionBlockShape {
  int B = 0, Tq = 0, Tk = 0, NH = 0, NKV = 0, HS = 0;
  bool causal = false;  // Tq == Tk, the same positions
};

// A row slice of a contiguous [B, T, width] buffer starting at row `row0`, column `col0`.
inline RowSlice rows_of(int T, int width, int row0 = 0, int col0 = 0) {
  return {static_cast<std::int64_t>(row0) * width + col0, width,
          static_cast<std::int64_t>(T) * width};
}
// A stat slice of a contiguous [B, NH, T] buffer starting at row `row0`.
inline StatSlice stats_of(int T, int NH, int row0 = 0) {
  return {row0, T, static_cast<std::int64_t>(NH) * T};
}

template <class T, class A>
void attention_block_forward(const ExecSpace& exec, const AttentionBlockShape& s,
                             View1<const T> q, RowSlice qs, View1<const T> k, RowSlice ks,
                             View1<const T> v, RowSlice vs, View1<A> out, RowSlice os,
                             View1<A> lse, StatSlice ls);

// acc (normalised output) and acc_lse of B x Tq rows merged with a block's partial: both
// weighted by exp(lse - new lse), new lse = log(exp(acc_lse) + exp(blk_lse)). A row whose
// acc_lse is -inf (no keys yet) takes the block's values.
template <class A>
void attention_merge(const ExecSpace& exec, int B, int Tq, int NH, int HS, View1<A> acc,
                     RowSlice as, View1<A> acc_lse, StatSlice als, View1<const A> blk,
                     RowSlice bs, View1<const A> blk_lse, StatSlice bls);

// D = rowsum(dO * O) per (b, h, i): the backward's per-row term, computed once per step.
template <class T, class A>
void attention_rowdot(const ExecSpace& exec, int B, int Tq, int NH, int HS, View1<const T> dout,
                      RowSlice dos, View1<const T> out, RowSlice os, View1<A> D, StatSlice Ds);

// dq += scale dS k, dk += scale dS^T q, dv += P^T dO over the block, with out (in T), lse and
// D = rowsum(dout * out) those of the merged output of the query rows. Our kernels read D;
// cuDNN forms D from dout and out itself.
template <class T, class A>
void attention_block_backward(const ExecSpace& exec, const AttentionBlockShape& s,
                              View1<const T> q, RowSlice qs, View1<const T> k, RowSlice ks,
                              View1<const T> v, RowSlice vs, View1<const T> dout, RowSlice dos,
                              View1<const T> out, RowSlice outs, View1<const A> lse,
                              StatSlice ls, View1<const A> D, StatSlice Ds, View1<A> dq,
                              RowSlice dqs, View1<A> dk, RowSlice dks, View1<A> dv, RowSlice dvs);

// How many blocks (forward and backward calls) cuDNN has run in this process: tests prove with
// it that cuDNN, not the fallback, ran.
std::int64_t cudnn_attention_block_calls();

}  // namespace meshtrain::kernels
