// fp32 causal flash attention with CUDA-core FMAs: the FlashAttention-2 blocking of the bf16
// kernels (attention_cuda_bf16.cpp) without tensor cores, so that fp32 training keeps fp32
// products (TF32 would cost ~1e-3 relative) and agrees with the portable kernels to ~1e-6.
//
// Tiles are 64 x 64 in shared memory. A CTA has 8 x (64 / R) threads; thread (ty, tx) owns rows
// ty*R .. ty*R+R-1 of every 64-row tile, score columns tx + 8c (c < 8: the 8 lanes of a row
// group are one aligned lane octet, so a row's max and sum are three shuffles) and output
// columns 4tx + 32c as float4s. Dot products run over d in order, float4 at a time, from
// shared memory padded by 4 floats per row (conflict-free: 8 rows are 8 distinct 16-byte bank
// groups). Scores pass to the second product through shared memory (P, dS).
//
// Forward: a CTA per (64-query block, head, batch), online softmax over 64-key tiles; the next
//   K tile loads (cp.async) while P.V runs, the next V tile while the scores of the next tile
//   are formed. Backward: dkdv per 64-key block over the query tiles at or below the diagonal,
//   then dq per 64-query block over the key tiles, as in the bf16 kernels: deterministic.
#include "attention_cuda.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cmath>

#include "attention_cuda_device.hpp"

namespace meshtrain::kernels::detail::cuda {

namespace {

template <int D>
struct Tile {
  static constexpr int R = D <= 64 ? 4 : 2;  // rows per thread (accumulators: R x D/8 each)
  static constexpr int B = 64, TX = 8, TY = B / R, NT = TX * TY;
  static constexpr int SD = D + 4, SP = B + 4;  // padded row strides (floats)
  static constexpr int DV = D / 32;             // output float4s per thread and row
  static constexpr int kTile = B * SD, kPTile = B * SP;
};

// acc[r][c] += A[ty*R + r] . Bm[tx + 8c] over D (both [64][SD] in shared memory).
template <int D>
__device__ __forceinline__ void dot_rows(float (&acc)[Tile<D>::R][8], const float* A,
                                         const float* Bm, int ty, int tx) {
  using Tl = Tile<D>;
#pragma unroll 4
  for (int d = 0; d < D; d += 4) {
    float4 a[Tl::R], b[8];
#pragma unroll
    for (int r = 0; r < Tl::R; ++r)
      a[r] = *reinterpret_cast<const float4*>(A + (ty * Tl::R + r) * Tl::SD + d);
#pragma unroll
    for (int c = 0; c < 8; ++c)
      b[c] = *reinterpret_cast<const float4*>(Bm + (tx + 8 * c) * Tl::SD + d);
#pragma unroll
    for (int r = 0; r < Tl::R; ++r)
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        float x = acc[r][c];
        x = fmaf(a[r].x, b[c].x, x);
        x = fmaf(a[r].y, b[c].y, x);
        x = fmaf(a[r].z, b[c].z, x);
        acc[r][c] = fmaf(a[r].w, b[c].w, x);
      }
  }
}

// o[r][j] += sum_k P[ty*R + r][k] M[k][4tx + 32j .. +3] over the 64 rows k of M ([64][SD]);
// P is [64][SP].
template <int D>
__device__ __forceinline__ void prod_rows(float4 (&o)[Tile<D>::R][Tile<D>::DV], const float* P,
                                          const float* M, int ty, int tx) {
  using Tl = Tile<D>;
#pragma unroll 2
  for (int k = 0; k < Tl::B; k += 4) {
    float4 p[Tl::R];
#pragma unroll
    for (int r = 0; r < Tl::R; ++r)
      p[r] = *reinterpret_cast<const float4*>(P + (ty * Tl::R + r) * Tl::SP + k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int j = 0; j < Tl::DV; ++j) {
        const float4 m = *reinterpret_cast<const float4*>(M + (k + kk) * Tl::SD + 4 * tx + 32 * j);
#pragma unroll
        for (int r = 0; r < Tl::R; ++r) {
          const float pk = kk == 0 ? p[r].x : kk == 1 ? p[r].y : kk == 2 ? p[r].z : p[r].w;
          o[r][j].x = fmaf(pk, m.x, o[r][j].x);
          o[r][j].y = fmaf(pk, m.y, o[r][j].y);
          o[r][j].z = fmaf(pk, m.z, o[r][j].z);
          o[r][j].w = fmaf(pk, m.w, o[r][j].w);
        }
      }
    }
  }
}

template <int D>
__device__ __forceinline__ void zero(float4 (&o)[Tile<D>::R][Tile<D>::DV]) {
#pragma unroll
  for (int r = 0; r < Tile<D>::R; ++r)
#pragma unroll
    for (int j = 0; j < Tile<D>::DV; ++j) o[r][j] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// Row max / sum over the 8 lanes tx = 0..7 of a row group.
__device__ __forceinline__ float octet_max(float x) {
#pragma unroll
  for (int m = 1; m < 8; m <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
  return x;
}
__device__ __forceinline__ float octet_sum(float x) {
#pragma unroll
  for (int m = 1; m < 8; m <<= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// Store o[r][j] * f into row `row` (stride-1 columns 4tx + 32j) of a global matrix.
template <int D>
__device__ __forceinline__ void store_row(float* dst, const float4 (&o)[Tile<D>::DV], float f,
                                          int tx) {
#pragma unroll
  for (int j = 0; j < Tile<D>::DV; ++j)
    *reinterpret_cast<float4*>(dst + 4 * tx + 32 * j) =
        make_float4(o[j].x * f, o[j].y * f, o[j].z * f, o[j].w * f);
}

// ---------------------------------------------------------------------------------------------
template <int D>
__global__ void __launch_bounds__(Tile<D>::NT)
    fwd_kernel(const float* __restrict__ qkv, float* __restrict__ out, float* __restrict__ lse,
               int T, int NH, int G, float scale) {
  using Tl = Tile<D>;
  constexpr int R = Tl::R, BN = Tl::B, SD = Tl::SD, NT = Tl::NT;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sQ = reinterpret_cast<float*>(smem);
  float* sK = sQ + Tl::kTile;
  float* sV = sK + Tl::kTile;
  float* sP = sV + Tl::kTile;

  const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int m0 = qb * Tl::B;
  const long C = long(NH) * D, Ckv = C / G, ld = C + 2 * Ckv;  // G query heads per kv head
  const float* Qg = qkv + long(b) * T * ld + h * D;
  const float* Kg = qkv + long(b) * T * ld + C + (h / G) * D;
  const float* Vg = Kg + Ckv;
  const int nkb = (min(m0 + Tl::B, T) - 1) / BN + 1;

  // Groups in flight: {Q, K0}, {V0}; then each iteration commits K(kb+1), V(kb+1) (possibly
  // empty), so wait_group<1> always means "everything but the newest group has landed".
  load_tile_async<float, Tl::B, D, SD, NT>(sQ, Qg + long(m0) * ld, ld, T - m0);
  load_tile_async<float, BN, D, SD, NT>(sK, Kg, ld, T);
  cp_async_commit();
  load_tile_async<float, BN, D, SD, NT>(sV, Vg, ld, T);
  cp_async_commit();

  float4 o[R][Tl::DV];
  zero<D>(o);
  float mrow[R], lrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) mrow[r] = -INFINITY, lrow[r] = 0.f;

  for (int kb = 0; kb < nkb; ++kb) {
    const int n0 = kb * BN;
    cp_async_wait<1>();
    __syncthreads();  // K(kb) (and Q) landed
    float s[R][8] = {};
    dot_rows<D>(s, sQ, sK, ty, tx);
    const bool masked = n0 + BN - 1 > m0 || n0 + BN > T;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = m0 + ty * R + r;
      float mx = mrow[r];
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        float x = s[r][c] * scale;
        const int key = n0 + tx + 8 * c;
        if (masked && (key > row || key >= T)) x = -INFINITY;
        s[r][c] = x;
        mx = fmaxf(mx, x);
      }
      mx = octet_max(mx);
      const float ms = mx == -INFINITY ? 0.f : mx;  // no visible key yet: keep 0, not NaN
      const float corr = expf(mrow[r] - ms);
      mrow[r] = mx;
      lrow[r] *= corr;
#pragma unroll
      for (int j = 0; j < Tl::DV; ++j)
        o[r][j] = make_float4(o[r][j].x * corr, o[r][j].y * corr, o[r][j].z * corr,
                              o[r][j].w * corr);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const float p = expf(s[r][c] - ms);
        lrow[r] += p;
        sP[(ty * R + r) * Tl::SP + tx + 8 * c] = p;
      }
    }
    __syncthreads();  // P complete; K(kb) no longer read
    if (kb + 1 < nkb)
      load_tile_async<float, BN, D, SD, NT>(sK, Kg + (n0 + BN) * ld, ld, T - n0 - BN);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // V(kb) landed
    prod_rows<D>(o, sP, sV, ty, tx);
    __syncthreads();  // V(kb) and P no longer read
    if (kb + 1 < nkb)
      load_tile_async<float, BN, D, SD, NT>(sV, Vg + (n0 + BN) * ld, ld, T - n0 - BN);
    cp_async_commit();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float l = octet_sum(lrow[r]);
    const int row = m0 + ty * R + r;
    if (row >= T) continue;
    store_row<D>(out + (long(b) * T + row) * C + h * D, o[r], 1.f / l, tx);
    if (tx == 0) lse[(long(b) * NH + h) * T + row] = mrow[r] + logf(l);
  }
}

// ---------------------------------------------------------------------------------------------
// dK, dV for the 64 keys n0.. over the query tiles that can see them.
template <int D>
__global__ void __launch_bounds__(Tile<D>::NT)
    dkdv_kernel(const float* __restrict__ qkv, const float* __restrict__ dout,
                const float* __restrict__ lse, float* dqkv, int T, int NH, int G, float scale) {
  using Tl = Tile<D>;
  constexpr int R = Tl::R, BQ = Tl::B, SD = Tl::SD, NT = Tl::NT;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sK = reinterpret_cast<float*>(smem);
  float* sV = sK + Tl::kTile;
  float* sQ = sV + Tl::kTile;
  float* sO = sQ + Tl::kTile;   // dO
  float* sP = sO + Tl::kTile;   // P^T  [key][query]
  float* sS = sP + Tl::kPTile;  // dS^T [key][query]
  float* sL = sS + Tl::kPTile;  // lse of the tile's queries (+inf past the end: P = 0)
  float* sD = sL + BQ;

  const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
  const int kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;  // kvh: the key/value head
  const int n0 = kb * Tl::B;
  const long C = long(NH) * D, Ckv = C / G, ld = C + 2 * Ckv;
  const float* Kg = qkv + long(b) * T * ld + C + kvh * D;

  load_tile_async<float, Tl::B, D, SD, NT>(sK, Kg + n0 * ld, ld, T - n0);
  load_tile_async<float, Tl::B, D, SD, NT>(sV, Kg + Ckv + n0 * ld, ld, T - n0);
  float4 dk[R][Tl::DV], dv[R][Tl::DV];
  zero<D>(dk);
  zero<D>(dv);

  // dK and dV sum over the G query heads that share this kv head, in head order.
  for (int h = kvh * G; h < (kvh + 1) * G; ++h)
  for (int q0 = n0 / BQ * BQ; q0 < T; q0 += BQ) {
    const float* Qg = qkv + long(b) * T * ld + h * D;
    const float* Og = dout + long(b) * T * C + h * D;
    const float* Lg = lse + (long(b) * NH + h) * T;
    const float* Dg = d_slot(dqkv, b, h, T, ld, D);
    __syncthreads();  // the previous tile's Q, dO, P, dS are no longer read
    load_tile_async<float, BQ, D, SD, NT>(sQ, Qg + q0 * ld, ld, T - q0);
    load_tile_async<float, BQ, D, SD, NT>(sO, Og + q0 * C, C, T - q0);
    cp_async_commit();
    for (int i = threadIdx.x; i < BQ; i += NT) {
      const bool ok = q0 + i < T;
      sL[i] = ok ? Lg[q0 + i] : INFINITY;
      sD[i] = ok ? Dg[(q0 + i) * ld] : 0.f;
    }
    cp_async_wait<0>();
    __syncthreads();
    float s[R][8] = {}, dp[R][8] = {};
    dot_rows<D>(s, sK, sQ, ty, tx);   // S^T = K Q^T
    dot_rows<D>(dp, sV, sO, ty, tx);  // dP^T = V dO^T
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int key = n0 + ty * R + r;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int qi = tx + 8 * c;
        float p = expf(s[r][c] * scale - sL[qi]);
        if (q0 + qi < key) p = 0.f;
        sP[(ty * R + r) * Tl::SP + qi] = p;
        sS[(ty * R + r) * Tl::SP + qi] = p * (dp[r][c] - sD[qi]);
      }
    }
    __syncthreads();
    prod_rows<D>(dv, sP, sO, ty, tx);  // dV += P^T dO
    prod_rows<D>(dk, sS, sQ, ty, tx);  // dK += dS^T Q
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int j = n0 + ty * R + r;
    if (j >= T) continue;
    float* krow = dqkv + (long(b) * T + j) * ld + C + kvh * D;
    store_row<D>(krow, dk[r], scale, tx);
    store_row<D>(krow + Ckv, dv[r], 1.f, tx);
  }
}

// dQ for the 64 queries m0.. over the key tiles they see.
template <int D>
__global__ void __launch_bounds__(Tile<D>::NT)
    dq_kernel(const float* __restrict__ qkv, const float* __restrict__ dout,
              const float* __restrict__ lse, float* dqkv, int T, int NH, int G, float scale) {
  using Tl = Tile<D>;
  constexpr int R = Tl::R, BN = Tl::B, SD = Tl::SD, NT = Tl::NT;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sQ = reinterpret_cast<float*>(smem);
  float* sO = sQ + Tl::kTile;  // dO
  float* sK = sO + Tl::kTile;
  float* sV = sK + Tl::kTile;
  float* sS = sV + Tl::kTile;  // dS [query][key]

  const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int m0 = qb * Tl::B;
  const long C = long(NH) * D, Ckv = C / G, ld = C + 2 * Ckv;  // G query heads per kv head
  const float* Qg = qkv + long(b) * T * ld + h * D;
  const float* Kg = qkv + long(b) * T * ld + C + (h / G) * D;
  const float* Vg = Kg + Ckv;
  load_tile_async<float, Tl::B, D, SD, NT>(sQ, Qg + long(m0) * ld, ld, T - m0);
  load_tile_async<float, Tl::B, D, SD, NT>(sO, dout + (long(b) * T + m0) * C + h * D, C, T - m0);

  // D is read before this block overwrites its slot with dq (see d_slot).
  float lrow[R], drow[R];
  const float* Dg = d_slot(dqkv, b, h, T, ld, D);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = m0 + ty * R + r;
    lrow[r] = row < T ? lse[(long(b) * NH + h) * T + row] : INFINITY;
    drow[r] = row < T ? Dg[row * ld] : 0.f;
  }
  float4 dq[R][Tl::DV];
  zero<D>(dq);
  const int nkb = (min(m0 + Tl::B, T) - 1) / BN + 1;
  for (int kb = 0; kb < nkb; ++kb) {
    const int n0 = kb * BN;
    __syncthreads();  // the previous tile's K, V, dS are no longer read
    load_tile_async<float, BN, D, SD, NT>(sK, Kg + n0 * ld, ld, T - n0);
    load_tile_async<float, BN, D, SD, NT>(sV, Vg + n0 * ld, ld, T - n0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s[R][8] = {}, dp[R][8] = {};
    dot_rows<D>(s, sQ, sK, ty, tx);   // S = Q K^T
    dot_rows<D>(dp, sO, sV, ty, tx);  // dP = dO V^T
    const bool masked = n0 + BN - 1 > m0 || n0 + BN > T;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = m0 + ty * R + r;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int key = n0 + tx + 8 * c;
        float p = expf(s[r][c] * scale - lrow[r]);
        if (masked && (key > row || key >= T)) p = 0.f;
        sS[(ty * R + r) * Tl::SP + tx + 8 * c] = p * (dp[r][c] - drow[r]);
      }
    }
    __syncthreads();
    prod_rows<D>(dq, sS, sK, ty, tx);  // dQ += dS K
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = m0 + ty * R + r;
    if (row < T) store_row<D>(dqkv + (long(b) * T + row) * ld + h * D, dq[r], scale, tx);
  }
}

// ---------------------------------------------------------------------------------------------
template <int D>
void forward(cudaStream_t st, const float* qkv, float* out, float* lse, int B, int T, int NH,
             int G) {
  using Tl = Tile<D>;
  constexpr int kSmem = (3 * Tl::kTile + Tl::kPTile) * int(sizeof(float));
  set_smem(fwd_kernel<D>, kSmem);
  const dim3 grid((T + Tl::B - 1) / Tl::B, NH, B);
  fwd_kernel<D><<<grid, Tl::NT, kSmem, st>>>(qkv, out, lse, T, NH, G,
                                             1.f / std::sqrt(float(D)));
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void backward(cudaStream_t st, const float* qkv, const float* dout, const float* lse,
              float* dqkv, int B, int T, int NH, int G) {
  using Tl = Tile<D>;
  const float scale = 1.f / std::sqrt(float(D));
  const dim3 grid((T + Tl::B - 1) / Tl::B, NH, B), grid_kv((T + Tl::B - 1) / Tl::B, NH / G, B);
  constexpr int kSmemKV = (4 * Tl::kTile + 2 * Tl::kPTile + 2 * Tl::B) * int(sizeof(float));
  set_smem(dkdv_kernel<D>, kSmemKV);
  dkdv_kernel<D><<<grid_kv, Tl::NT, kSmemKV, st>>>(qkv, dout, lse, dqkv, T, NH, G, scale);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
  constexpr int kSmemQ = (4 * Tl::kTile + Tl::kPTile) * int(sizeof(float));
  set_smem(dq_kernel<D>, kSmemQ);
  dq_kernel<D><<<grid, Tl::NT, kSmemQ, st>>>(qkv, dout, lse, dqkv, T, NH, G, scale);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void forward_f32(cudaStream_t st, const float* qkv, float* out, float* lse, int B, int T, int NH,
                 int HS, int NKV) {
  const int G = NH / NKV;
  switch (HS) {
    case 32: return forward<32>(st, qkv, out, lse, B, T, NH, G);
    case 64: return forward<64>(st, qkv, out, lse, B, T, NH, G);
    case 128: return forward<128>(st, qkv, out, lse, B, T, NH, G);
  }
  MESHTRAIN_CHECK(false, "attention forward_f32: unsupported HS=", HS);
}

void backward_f32(cudaStream_t st, const float* qkv, const float* dout, const float* lse,
                  float* dqkv, int B, int T, int NH, int HS, int NKV) {
  const int G = NH / NKV;
  switch (HS) {
    case 32: return backward<32>(st, qkv, dout, lse, dqkv, B, T, NH, G);
    case 64: return backward<64>(st, qkv, dout, lse, dqkv, B, T, NH, G);
    case 128: return backward<128>(st, qkv, dout, lse, dqkv, B, T, NH, G);
  }
  MESHTRAIN_CHECK(false, "attention backward_f32: unsupported HS=", HS);
}

}  // namespace meshtrain::kernels::detail::cuda

#endif  // KOKKOS_ENABLE_CUDA
