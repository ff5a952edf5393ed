// bf16 causal flash attention on tensor cores: FlashAttention-2 (Dao 2023) with mma.sync
// m16n8k16 (bf16 in, fp32 accumulate), fp32 online softmax in base 2.
//
// Forward: a CTA per (query block of 16 * kWarps rows, head, batch); each warp owns 16 query
// rows, keeps its Q fragments, the output accumulator and the running max/sum in registers,
// and streams 64-key K/V tiles through double-buffered shared memory (cp.async). P = exp2(S -
// m) goes from the S accumulators straight into the P.V product as bf16 A fragments. Key tiles
// entirely above a warp's diagonal are skipped; only the tiles that cross the diagonal or the
// sequence end are masked. Query blocks run heaviest (last) first.
//
// Backward, with P recomputed from lse and D_i = dO_i . O_i precomputed (into dqkv, d_slot):
//   dkdv: a CTA per (key block of 16 * kWarps keys, head, batch); each warp owns 16 keys and
//     accumulates dK, dV in registers over the query tiles at or below the diagonal:
//     S^T = K Q^T, dP^T = V dO^T, dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q.
//   dq:   a CTA per query block, the forward's loop: dQ += dS K over the key tiles.
// Every output row is summed by one warp in a fixed order: no atomics, the same bits on every
// run, at the price of recomputing S and dP in the dq pass (7 instead of 5 products).
#include "attention_cuda.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cmath>

#include "attention_cuda_device.hpp"

namespace meshtrain::kernels::detail::cuda {

namespace {

constexpr int kBN = 64;  // keys per K/V tile (forward, dq); queries per Q/dO tile (dkdv)

// ---------------------------------------------------------------------------------------------
// Forward.
template <int D, int kWarps, int kKeys = kBN>
struct Fwd {
  static constexpr int kThreads = 32 * kWarps, BM = 16 * kWarps, BN = kKeys, SD = D + 8;
  static constexpr int kSmem = (BM + 4 * BN) * SD * int(sizeof(bf16_t));
};

template <int D, int kWarps, int kKeys = kBN>
__global__ void __launch_bounds__(32 * kWarps)
    fwd_kernel(const bf16_t* __restrict__ qkv, bf16_t* __restrict__ out, float* __restrict__ lse,
               int T, int NH, int G, float scale_log2) {
  using Cfg = Fwd<D, kWarps, kKeys>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, SD = Cfg::SD, NT = Cfg::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem);
  bf16_t* sK = sQ + BM * SD;      // [2][BN][SD]
  bf16_t* sV = sK + 2 * BN * SD;  // [2][BN][SD]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int m0 = qb * BM;
  const long C = long(NH) * D, Ckv = C / G, ld = C + 2 * Ckv;  // G query heads per kv head
  const bf16_t* Qg = qkv + (long(b) * T + m0) * ld + h * D;
  const bf16_t* Kg = qkv + long(b) * T * ld + C + (h / G) * D;  // key row 0 of the kv head
  const bf16_t* Vg = Kg + Ckv;
  const int nkb = (min(m0 + BM, T) - 1) / BN + 1;  // key tiles holding keys <= the last row

  load_tile_async<bf16_t, BM, D, SD, NT>(sQ, Qg, ld, T - m0);
  load_tile_async<bf16_t, BN, D, SD, NT>(sK, Kg, ld, T);
  load_tile_async<bf16_t, BN, D, SD, NT>(sV, Vg, ld, T);
  cp_async_commit();

  const int r0 = m0 + 16 * warp;  // this warp's first query row
  unsigned qf[D / 16][4];
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};  // rows g and g + 8

  for (int kb = 0; kb < nkb; ++kb) {
    cp_async_wait<0>();
    __syncthreads();  // tile kb landed; everyone is done with tile kb - 1's buffer
    if (kb == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], a_addr<SD>(sQ, 16 * warp, 16 * kk, lane));
    }
    if (kb + 1 < nkb) {
      const int n1 = (kb + 1) * BN, nb = (kb + 1) & 1;
      load_tile_async<bf16_t, BN, D, SD, NT>(sK + nb * BN * SD, Kg + n1 * ld, ld, T - n1);
      load_tile_async<bf16_t, BN, D, SD, NT>(sV + nb * BN * SD, Vg + n1 * ld, ld, T - n1);
      cp_async_commit();
    }
    const int n0 = kb * BN;
    if (n0 > r0 + 15) continue;  // the whole tile lies above this warp's diagonal
    const bf16_t* Ks = sK + (kb & 1) * BN * SD;
    const bf16_t* Vs = sV + (kb & 1) * BN * SD;

    float s[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        unsigned kf[4];
        ldmatrix_x4(kf, bn_addr<SD>(Ks, 16 * np, 16 * kk, lane));
        mma_bf16(s[2 * np], qf[kk], kf[0], kf[1]);
        mma_bf16(s[2 * np + 1], qf[kk], kf[2], kf[3]);
      }

    // Scale to base 2, mask (key > row: causal; key >= T: past the end), new running max.
    const bool masked = n0 + BN - 1 > r0 || n0 + BN > T;
    float mnew[2] = {mrow[0], mrow[1]};
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * scale_log2;
        if (masked) {
          const int key = n0 + 8 * nt + 2 * t + (e & 1), row = r0 + g + 8 * (e >> 1);
          if (key > row || key >= T) x = -INFINITY;
        }
        s[nt][e] = x;
        mnew[e >> 1] = fmaxf(mnew[e >> 1], x);
      }
    float msafe[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mnew[i] = quad_max(mnew[i]);
      // A row with no visible key yet keeps m = -inf; exp2(-inf - 0) = 0 then, never NaN.
      msafe[i] = mnew[i] == -INFINITY ? 0.f : mnew[i];
      const float corr = exp2f(mrow[i] - msafe[i]);
      mrow[i] = mnew[i];
      lrow[i] *= corr;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[dt][2 * i] *= corr;
        o[dt][2 * i + 1] *= corr;
      }
    }
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - msafe[e >> 1]);
        lrow[e >> 1] += s[nt][e];  // this lane's partial row sum; the quad sums at the end
      }

    // O += P V: P from registers (bf16 A fragments), V^T fragments by ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      unsigned pa[4];
      c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        unsigned vf[4];
        ldmatrix_x4_trans(vf, bk_addr<SD>(Vs, 16 * kk, 16 * dp, lane));
        mma_bf16(o[2 * dp], pa, vf[0], vf[1]);
        mma_bf16(o[2 * dp + 1], pa, vf[2], vf[3]);
      }
    }
  }

  const long obase = long(b) * T * C + h * D;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float l = quad_sum(lrow[i]);
    const int row = r0 + g + 8 * i;
    if (row >= T) continue;
    const float inv = 1.f / l;
    bf16_t* orow = out + obase + long(row) * C;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<unsigned*>(orow + 8 * dt + 2 * t) =
          pack_bf16(o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
    if (t == 0) lse[(long(b) * NH + h) * T + row] = (mrow[i] + log2f(l)) * kLn2;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, dK and dV: each warp owns 16 keys; BQ queries per tile.
template <int D, int kWarps, int BQ>
struct Dkdv {
  static constexpr int kThreads = 32 * kWarps, BN = 16 * kWarps, SD = D + 8;
  static constexpr int kSmem =
      (2 * BN + 4 * BQ) * SD * int(sizeof(bf16_t)) + 4 * BQ * int(sizeof(float));
};

template <int D, int kWarps, int BQ>
__global__ void __launch_bounds__(32 * kWarps)
    dkdv_kernel(const bf16_t* __restrict__ qkv, const bf16_t* __restrict__ dout,
                const float* __restrict__ lse, bf16_t* dqkv, int T, int NH, int G, float scale,
                float scale_log2) {
  using Cfg = Dkdv<D, kWarps, BQ>;
  constexpr int BN = Cfg::BN, SD = Cfg::SD, NT = Cfg::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* sK = reinterpret_cast<bf16_t*>(smem);
  bf16_t* sV = sK + BN * SD;
  bf16_t* sQ = sV + BN * SD;       // [2][BQ][SD]
  bf16_t* sO = sQ + 2 * BQ * SD;   // dO, [2][BQ][SD]
  float* sL = reinterpret_cast<float*>(sO + 2 * BQ * SD);  // lse * log2(e), [2][BQ]
  float* sD = sL + 2 * BQ;                                  // D, [2][BQ]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // kvh: the key/value head; key block 0 (most work) first.
  const int kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int n0 = kb * BN;
  const long C = long(NH) * D, Ckv = C / G, ld = C + 2 * Ckv;
  const bf16_t* Kg = qkv + long(b) * T * ld + C + kvh * D;
  const int qb0 = n0 / BQ, nqb = (T + BQ - 1) / BQ, per_head = nqb - qb0;
  // The tiles visited: (query head kvh*G + it / per_head, query tile qb0 + it % per_head) for
  // it = 0 .. G*per_head - 1, so dK and dV sum over the group's heads in head order.
  const int ntiles = G * per_head;

  // Tile `it` into buffer buf: rows past T are zero, with lse = +inf so that P = 0.
  auto load_q = [&](int it, int buf) {
    const int h = kvh * G + it / per_head, q0 = (qb0 + it % per_head) * BQ;
    const bf16_t* Qg = qkv + long(b) * T * ld + h * D;
    const bf16_t* Og = dout + long(b) * T * C + h * D;
    const float* Lg = lse + (long(b) * NH + h) * T;
    const float* Dg = d_slot(dqkv, b, h, T, ld, D);
    load_tile_async<bf16_t, BQ, D, SD, NT>(sQ + buf * BQ * SD, Qg + q0 * ld, ld, T - q0);
    load_tile_async<bf16_t, BQ, D, SD, NT>(sO + buf * BQ * SD, Og + q0 * C, C, T - q0);
    for (int i = threadIdx.x; i < BQ; i += NT) {
      const bool ok = q0 + i < T;
      sL[buf * BQ + i] = ok ? Lg[q0 + i] * kLog2e : INFINITY;
      sD[buf * BQ + i] = ok ? Dg[(q0 + i) * (ld / 2)] : 0.f;
    }
  };
  load_tile_async<bf16_t, BN, D, SD, NT>(sK, Kg + n0 * ld, ld, T - n0);
  load_tile_async<bf16_t, BN, D, SD, NT>(sV, Kg + Ckv + n0 * ld, ld, T - n0);
  load_q(0, 0);
  cp_async_commit();

  const int j0 = n0 + 16 * warp;  // this warp's first key
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;

  for (int it = 0; it < ntiles; ++it) {
    const int buf = it & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < ntiles) {
      load_q(it + 1, buf ^ 1);
      cp_async_commit();
    }
    const int q0 = (qb0 + it % per_head) * BQ;
    if (q0 + BQ - 1 < j0) continue;  // every query of the tile precedes this warp's keys
    const bf16_t* Qs = sQ + buf * BQ * SD;
    const bf16_t* Os = sO + buf * BQ * SD;
    const float* Ls = sL + buf * BQ;
    const float* Ds = sD + buf * BQ;

    // S^T = K Q^T and dP^T = V dO^T, 16 keys x BQ queries.
    float s[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
    for (int i = 0; i < BQ / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      unsigned ka[4], va[4];
      ldmatrix_x4(ka, a_addr<SD>(sK, 16 * warp, 16 * kk, lane));
      ldmatrix_x4(va, a_addr<SD>(sV, 16 * warp, 16 * kk, lane));
#pragma unroll
      for (int np = 0; np < BQ / 16; ++np) {
        unsigned qf[4], of[4];
        ldmatrix_x4(qf, bn_addr<SD>(Qs, 16 * np, 16 * kk, lane));
        mma_bf16(s[2 * np], ka, qf[0], qf[1]);
        mma_bf16(s[2 * np + 1], ka, qf[2], qf[3]);
        ldmatrix_x4(of, bn_addr<SD>(Os, 16 * np, 16 * kk, lane));
        mma_bf16(dp[2 * np], va, of[0], of[1]);
        mma_bf16(dp[2 * np + 1], va, of[2], of[3]);
      }
    }
    // P^T = exp2(S^T scale log2e - lse log2e), zero where query < key; dS^T = P^T (dP^T - D).
    const bool masked = q0 < j0 + 15;
#pragma unroll
    for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = 8 * nt + 2 * t + (e & 1);
        float p = exp2f(s[nt][e] * scale_log2 - Ls[qi]);
        if (masked && q0 + qi < j0 + g + 8 * (e >> 1)) p = 0.f;
        s[nt][e] = p;
        dp[nt][e] = p * (dp[nt][e] - Ds[qi]);
      }
    // dV += P^T dO, dK += dS^T Q: the k dimension is the query; B fragments by .trans.
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) {
      unsigned pa[4], sa[4];
      c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
      c_to_a(sa, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        unsigned of[4], qf[4];
        ldmatrix_x4_trans(of, bk_addr<SD>(Os, 16 * kk, 16 * dn, lane));
        mma_bf16(dv[2 * dn], pa, of[0], of[1]);
        mma_bf16(dv[2 * dn + 1], pa, of[2], of[3]);
        ldmatrix_x4_trans(qf, bk_addr<SD>(Qs, 16 * kk, 16 * dn, lane));
        mma_bf16(dk[2 * dn], sa, qf[0], qf[1]);
        mma_bf16(dk[2 * dn + 1], sa, qf[2], qf[3]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int j = j0 + g + 8 * i;
    if (j >= T) continue;
    bf16_t* krow = dqkv + (long(b) * T + j) * ld + C + kvh * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<unsigned*>(krow + 8 * dt + 2 * t) =
          pack_bf16(dk[dt][2 * i] * scale, dk[dt][2 * i + 1] * scale);
      *reinterpret_cast<unsigned*>(krow + Ckv + 8 * dt + 2 * t) =
          pack_bf16(dv[dt][2 * i], dv[dt][2 * i + 1]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, dQ: the forward's structure with BN keys per tile.
template <int D, int kWarps, int BN>
struct Dq {
  static constexpr int kThreads = 32 * kWarps, BM = 16 * kWarps, SD = D + 8;
  static constexpr int kSmem = (2 * BM + 4 * BN) * SD * int(sizeof(bf16_t));
};

template <int D, int kWarps, int BN>
__global__ void __launch_bounds__(32 * kWarps)
    dq_kernel(const bf16_t* __restrict__ qkv, const bf16_t* __restrict__ dout,
              const float* __restrict__ lse, bf16_t* dqkv, int T, int NH, int G, float scale,
              float scale_log2) {
  using Cfg = Dq<D, kWarps, BN>;
  constexpr int BM = Cfg::BM, SD = Cfg::SD, NT = Cfg::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem);
  bf16_t* sO = sQ + BM * SD;      // dO
  bf16_t* sK = sO + BM * SD;      // [2][BN][SD]
  bf16_t* sV = sK + 2 * BN * SD;  // [2][BN][SD]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int m0 = qb * BM;
  const long C = long(NH) * D, Ckv = C / G, ld = C + 2 * Ckv;
  const bf16_t* Qg = qkv + (long(b) * T + m0) * ld + h * D;
  const bf16_t* Kg = qkv + long(b) * T * ld + C + (h / G) * D;
  const bf16_t* Vg = Kg + Ckv;
  const int nkb = (min(m0 + BM, T) - 1) / BN + 1;

  load_tile_async<bf16_t, BM, D, SD, NT>(sQ, Qg, ld, T - m0);
  load_tile_async<bf16_t, BM, D, SD, NT>(sO, dout + (long(b) * T + m0) * C + h * D, C, T - m0);
  load_tile_async<bf16_t, BN, D, SD, NT>(sK, Kg, ld, T);
  load_tile_async<bf16_t, BN, D, SD, NT>(sV, Vg, ld, T);
  cp_async_commit();

  const int r0 = m0 + 16 * warp;
  // lse * log2(e) (+inf past the end: P = 0) and D of rows g, g + 8. D is read here, before
  // this block overwrites its slot with dq (no other block reads it: see d_slot).
  float lrow[2], drow[2];
  const float* Dg = d_slot(dqkv, b, h, T, ld, D);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = r0 + g + 8 * i;
    lrow[i] = row < T ? lse[(long(b) * NH + h) * T + row] * kLog2e : INFINITY;
    drow[i] = row < T ? Dg[row * (ld / 2)] : 0.f;
  }
  unsigned qf[D / 16][4], of[D / 16][4];
  float dq[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;

  for (int kb = 0; kb < nkb; ++kb) {
    cp_async_wait<0>();
    __syncthreads();
    if (kb == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        ldmatrix_x4(qf[kk], a_addr<SD>(sQ, 16 * warp, 16 * kk, lane));
        ldmatrix_x4(of[kk], a_addr<SD>(sO, 16 * warp, 16 * kk, lane));
      }
    }
    if (kb + 1 < nkb) {
      const int n1 = (kb + 1) * BN, nb = (kb + 1) & 1;
      load_tile_async<bf16_t, BN, D, SD, NT>(sK + nb * BN * SD, Kg + n1 * ld, ld, T - n1);
      load_tile_async<bf16_t, BN, D, SD, NT>(sV + nb * BN * SD, Vg + n1 * ld, ld, T - n1);
      cp_async_commit();
    }
    const int n0 = kb * BN;
    if (n0 > r0 + 15) continue;
    const bf16_t* Ks = sK + (kb & 1) * BN * SD;
    const bf16_t* Vs = sV + (kb & 1) * BN * SD;

    float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        unsigned kf[4], vf[4];
        ldmatrix_x4(kf, bn_addr<SD>(Ks, 16 * np, 16 * kk, lane));
        mma_bf16(s[2 * np], qf[kk], kf[0], kf[1]);
        mma_bf16(s[2 * np + 1], qf[kk], kf[2], kf[3]);
        ldmatrix_x4(vf, bn_addr<SD>(Vs, 16 * np, 16 * kk, lane));
        mma_bf16(dp[2 * np], of[kk], vf[0], vf[1]);
        mma_bf16(dp[2 * np + 1], of[kk], vf[2], vf[3]);
      }
    const bool masked = n0 + BN - 1 > r0 || n0 + BN > T;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1, key = n0 + 8 * nt + 2 * t + (e & 1);
        float p = exp2f(s[nt][e] * scale_log2 - lrow[i]);
        if (masked && (key > r0 + g + 8 * i || key >= T)) p = 0.f;
        s[nt][e] = p * (dp[nt][e] - drow[i]);  // dS
      }
    // dQ += dS K: k dimension = key, K fragments by .trans.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      unsigned sa[4];
      c_to_a(sa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        unsigned kf[4];
        ldmatrix_x4_trans(kf, bk_addr<SD>(Ks, 16 * kk, 16 * dn, lane));
        mma_bf16(dq[2 * dn], sa, kf[0], kf[1]);
        mma_bf16(dq[2 * dn + 1], sa, kf[2], kf[3]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = r0 + g + 8 * i;
    if (row >= T) continue;
    bf16_t* qrow = dqkv + (long(b) * T + row) * ld + h * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<unsigned*>(qrow + 8 * dt + 2 * t) =
          pack_bf16(dq[dt][2 * i] * scale, dq[dt][2 * i + 1] * scale);
  }
}

// ---------------------------------------------------------------------------------------------
// Launchers. Tile shapes per head size: 8 warps (128 query rows) in the forward amortise each
// K/V tile over more rows where registers allow (D <= 64); D = 128 halves the tiles that hold
// an accumulator per key or query (dkdv query tile, dq key tile) to stay clear of spills.
Bf16Tiles g_tiles;  // bench_attention's variants; zeros: the defaults below

template <int D, int kWarps, int kKeys = kBN>
void forward_tiles(cudaStream_t st, const bf16_t* qkv, bf16_t* out, float* lse, int B, int T,
                   int NH, int G) {
  using Cfg = Fwd<D, kWarps, kKeys>;
  auto kernel = fwd_kernel<D, kWarps, kKeys>;
  set_smem(kernel, Cfg::kSmem);
  const float scale = 1.f / std::sqrt(float(D));
  const dim3 grid((T + Cfg::BM - 1) / Cfg::BM, NH, B);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmem, st>>>(qkv, out, lse, T, NH, G, scale * kLog2e);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
}

// HS = 64 (GPT-2) runs 4-warp forward CTAs and 32-key dQ tiles: `bench_attention --variants 1`
// on an H200 (B = 16 and 32, T = 1024, 12 heads) measured the forward 2 % and the backward 10 %
// faster than 8 warps / 64 keys, with the same bits (perf/archive/journal.md).
template <int D>
void forward(cudaStream_t st, const bf16_t* qkv, bf16_t* out, float* lse, int B, int T, int NH,
             int G) {
  if constexpr (D == 64) {
    const int w = g_tiles.fwd_warps, bn = g_tiles.fwd_bn;
    if (w == 8 && bn == 128) return forward_tiles<D, 8, 128>(st, qkv, out, lse, B, T, NH, G);
    if (w == 8) return forward_tiles<D, 8>(st, qkv, out, lse, B, T, NH, G);
    if (bn == 128) return forward_tiles<D, 4, 128>(st, qkv, out, lse, B, T, NH, G);
    if (bn == 32) return forward_tiles<D, 4, 32>(st, qkv, out, lse, B, T, NH, G);
    return forward_tiles<D, 4>(st, qkv, out, lse, B, T, NH, G);
  }
  forward_tiles<D, D <= 64 ? 8 : 4>(st, qkv, out, lse, B, T, NH, G);
}

template <int D, int kWarps, int BQ>
void dkdv_tiles(cudaStream_t st, const bf16_t* qkv, const bf16_t* dout, const float* lse,
                bf16_t* dqkv, int B, int T, int NH, int G, float scale) {
  using Cfg = Dkdv<D, kWarps, BQ>;
  auto kernel = dkdv_kernel<D, kWarps, BQ>;
  set_smem(kernel, Cfg::kSmem);
  const dim3 grid((T + Cfg::BN - 1) / Cfg::BN, NH / G, B);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmem, st>>>(qkv, dout, lse, dqkv, T, NH, G, scale,
                                                  scale * kLog2e);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
}

template <int D, int kWarps, int BN>
void dq_tiles(cudaStream_t st, const bf16_t* qkv, const bf16_t* dout, const float* lse,
              bf16_t* dqkv, int B, int T, int NH, int G, float scale) {
  using Cfg = Dq<D, kWarps, BN>;
  auto kernel = dq_kernel<D, kWarps, BN>;
  set_smem(kernel, Cfg::kSmem);
  const dim3 grid((T + Cfg::BM - 1) / Cfg::BM, NH, B);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmem, st>>>(qkv, dout, lse, dqkv, T, NH, G, scale,
                                                  scale * kLog2e);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void backward(cudaStream_t st, const bf16_t* qkv, const bf16_t* dout, const float* lse,
              bf16_t* dqkv, int B, int T, int NH, int G) {
  const float scale = 1.f / std::sqrt(float(D));
  const auto* q = qkv;
  bool done = false;
  if constexpr (D == 64) {
    const int w = g_tiles.dkdv_warps, bq = g_tiles.dkdv_bq;
    if (w == 8 && bq == 64) dkdv_tiles<D, 8, 64>(st, q, dout, lse, dqkv, B, T, NH, G, scale);
    else if (w == 8 && bq == 32) dkdv_tiles<D, 8, 32>(st, q, dout, lse, dqkv, B, T, NH, G, scale);
    else if (w == 4 && bq == 32) dkdv_tiles<D, 4, 32>(st, q, dout, lse, dqkv, B, T, NH, G, scale);
    done = (w == 8 && (bq == 64 || bq == 32)) || (w == 4 && bq == 32);
  }
  if (!done) dkdv_tiles<D, 4, D <= 64 ? 64 : 32>(st, q, dout, lse, dqkv, B, T, NH, G, scale);
  done = false;
  if constexpr (D == 64) {
    const int w = g_tiles.dq_warps, bn = g_tiles.dq_bn;
    if (w == 8 && bn == 64) dq_tiles<D, 8, 64>(st, q, dout, lse, dqkv, B, T, NH, G, scale);
    else if (w == 8 && bn == 32) dq_tiles<D, 8, 32>(st, q, dout, lse, dqkv, B, T, NH, G, scale);
    else if (w == 4 && bn == 64) dq_tiles<D, 4, 64>(st, q, dout, lse, dqkv, B, T, NH, G, scale);
    else if (w == 4 && bn == 16) dq_tiles<D, 4, 16>(st, q, dout, lse, dqkv, B, T, NH, G, scale);
    else dq_tiles<D, 4, 32>(st, q, dout, lse, dqkv, B, T, NH, G, scale);  // the default
    done = true;
  }
  if (!done) dq_tiles<D, 4, D <= 64 ? 64 : 32>(st, q, dout, lse, dqkv, B, T, NH, G, scale);
}

}  // namespace

void set_bf16_tiles(const Bf16Tiles& tiles) { g_tiles = tiles; }

void forward_bf16(cudaStream_t st, const void* qkv, void* out, float* lse, int B, int T, int NH,
                  int HS, int NKV) {
  const int G = NH / NKV;
  const auto* q = static_cast<const bf16_t*>(qkv);
  auto* o = static_cast<bf16_t*>(out);
  switch (HS) {
    case 32: return forward<32>(st, q, o, lse, B, T, NH, G);
    case 64: return forward<64>(st, q, o, lse, B, T, NH, G);
    case 128: return forward<128>(st, q, o, lse, B, T, NH, G);
  }
  MESHTRAIN_CHECK(false, "attention forward_bf16: unsupported HS=", HS);
}

void backward_bf16(cudaStream_t st, const void* qkv, const void* dout, const float* lse,
                   void* dqkv, int B, int T, int NH, int HS, int NKV) {
  const int G = NH / NKV;
  const auto* q = static_cast<const bf16_t*>(qkv);
  const auto* o = static_cast<const bf16_t*>(dout);
  auto* dq = static_cast<bf16_t*>(dqkv);
  switch (HS) {
    case 32: return backward<32>(st, q, o, lse, dq, B, T, NH, G);
    case 64: return backward<64>(st, q, o, lse, dq, B, T, NH, G);
    case 128: return backward<128>(st, q, o, lse, dq, B, T, NH, G);
  }
  MESHTRAIN_CHECK(false, "attention backward_bf16: unsupported HS=", HS);
}

}  // namespace meshtrain::kernels::detail::cuda

#endif  // KOKKOS_ENABLE_CUDA
