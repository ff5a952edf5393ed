// LayerNorm and the fused cross-entropy on one GPU: the CUDA kernels (what layernorm_* and
// cross_entropy_* run on a CUDA build, src/kernels/{layernorm,cross_entropy}_cuda.cpp) against
// the portable Kokkos kernels (*_portable) measured in the same run, bf16 and fp32, at GPT-2
// 124M shapes (B = 16, T = 1024 rows).
// --gemm 1 adds (bf16) every GEMM of a GPT-2 block and the head at the same shapes, each as
// the model calls it (linear_* with the fused epilogue) next to the plain GEMM of the same
// shape (its ceiling) and, for the GELU layers, the unfused form (bias-epilogue GEMM, then the
// GELU kernel; GEMM, then the GELU-gradient kernel): per-shape data for the GEMM gap.
//
// --shapes LIST times only plain bf16 GEMMs (kernels::gemm, as the model's unfused layers call
// it), unfenced, one row each: LIST is comma-separated OP:MxNxK[:BETA], OP two letters (op(A)
// and op(B), N or T, row-major as the profile labels them), BETA 0 (default) or 1 (accumulate,
// as the weight gradients do). perf/reference/torch_gemm_shapes.py times the same list through
// torch.matmul: the library-level comparison behind the Llama profile.
//
//   bench_kernels_cuda [--rows 16384] [--channels 768] [--vocab 50257] [--padded-vocab 50304]
//                      [--iters 20] [--warmup 3] [--gemm 0|1] [--only-gemm 0|1]
//   bench_kernels_cuda --shapes NT:8192x16384x2048,TN:16384x2048x8192:1 [--iters 20]
//   bench_kernels_cuda --shapes NT:8192x28672x4096,NT:4096x28672x8192:1 --fp8 1
//   (FP8=1 perf/gpu/gemm_shapes.sh BUNDLE OUT llama8b-fp8: every Llama-3.1-8B GEMM that way)
//   bench_kernels_cuda --casts 4096x4096,4096x14336,4096x4096:6144 [--iters 20]
//
// --casts LIST times the FP8 current-scaling passes on bf16 blocks (kernels/fp8_cast.hpp), each
// item ROWSxCOLS[:LD] (LD > COLS: a column block of a wider tensor, as the gate / up and q / k / v
// pieces of a gradient): fp8_amax_block, fp8_cast_block to q, to its transpose qt, and to both,
// each as GB/s of the bytes it must move and as a share of the card's peak memory bandwidth
// (memory clock x bus width from the device's attributes: a bound no kernel reaches), beside a
// plain Kokkos copy kernel of the same bytes (one bf16 in, one byte per output, no encoding)
// measured in the same run: "x copy" = copy ms / kernel ms. That copy is a reference, not a
// bound: one element a thread with 1-byte stores, it ran at ~600 GB/s on the H100.
// --fp8 1 adds, for each NT item (row-major op(A) = A [M, K], op(B) = B^T with B [N, K]: both
// K-contiguous, the only form Hopper's FP8 tensor cores take), the same product through
// kernels::gemm_fp8 with E4M3 x E4M3 operands, tensorwise and rowwise, bf16 output, in the same
// run as the bf16 row: TF/s side by side, the ratio to bf16, and whether cuBLASLt served it (a
// "no" is the emulation: decode + fp32 GEMM, not an FP8 figure). The operands are quantized once,
// outside the timing: the GEMM alone, as the bf16 row.
//
// Each figure is the median of --iters calls after --warmup, timed with CUDA events on the
// execution space's stream. GB/s counts the bytes that must move: every input read once, every
// output written once; dinp, dweight and dbias, which accumulate, are read and written; the
// logits' padding columns are written but never read. The fused cross-entropy overwrites its
// logits with the gradient, so after the first call it runs on gradients: the same work.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_bench_util.hpp"
#include "meshtrain/core/cuda_check.hpp"
#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/view.hpp"
#include "meshtrain/kernels/cross_entropy.hpp"
#include "meshtrain/kernels/gelu.hpp"
#include "meshtrain/kernels/fp8_cast.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/kernels/gemm/gemm_fp8.hpp"
#include "meshtrain/kernels/layernorm.hpp"
#include "meshtrain/kernels/linear.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;
using meshtrain::perf_util::median_ms;
using meshtrain::perf_util::random_view;

namespace {

struct Args {
  int N = 16 * 1024, C = 768, V = 50257, Vp = 50304;
  int iters = 20, warmup = 3;
  int gemm = 0, only_gemm = 0, fp8 = 0;
  std::string shapes;  // --shapes: only these plain GEMMs
  std::string casts;   // --casts: only these FP8 cast blocks
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--shapes" || k == "--casts") {
      (k == "--shapes" ? a.shapes : a.casts) = argv[i + 1];
      continue;
    }
    const int v = std::stoi(argv[i + 1]);
    if (k == "--rows") a.N = v;
    else if (k == "--channels") a.C = v;
    else if (k == "--vocab") a.V = v;
    else if (k == "--padded-vocab") a.Vp = v;
    else if (k == "--iters") a.iters = v;
    else if (k == "--warmup") a.warmup = v;
    else if (k == "--gemm") a.gemm = v;
    else if (k == "--only-gemm") a.only_gemm = v;
    else if (k == "--fp8") a.fp8 = v;
    else {
      std::fprintf(stderr, "bench_kernels_cuda: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "bench_kernels_cuda: option %s has no value\n", argv[argc - 1]);
    std::exit(2);
  }
  return a;
}


void row(const char* dtype, const char* op, double bytes, double ms, double ref_ms) {
  std::printf("%-5s %-22s %9.4f ms %8.1f GB/s | portable %9.4f ms %8.1f GB/s | x%.2f\n", dtype,
              op, ms, bytes / (ms * 1e6), ref_ms, bytes / (ref_ms * 1e6), ref_ms / ms);
}

template <class T>
void bench(const char* dtype, const Args& a) {
  const int N = a.N, C = a.C, V = a.V, Vp = a.Vp;
  const double s = sizeof(T), NC = double(N) * C;
  ExecSpace exec;

  // LayerNorm at [N, C].
  const auto x = random_view<T>("bench_ln_x", std::size_t(NC), 1, -1.5f, 2.5f);
  const auto w = random_view<T>("bench_ln_w", C, 2, 0.5f, 1.5f);
  const auto b = random_view<T>("bench_ln_b", C, 3, -0.5f, 0.5f);
  const auto dout = random_view<T>("bench_ln_dout", std::size_t(NC), 4, -1.f, 1.f);
  View1<T> out("bench_ln_out", std::size_t(NC)), dinp("bench_ln_dinp", std::size_t(NC));
  View1<T> dw("bench_ln_dw", C), db("bench_ln_db", C);
  View1<float> mean("bench_ln_mean", N), rstd("bench_ln_rstd", N);
  const double ln_fwd_bytes = s * (2 * NC + 2.0 * C) + 8.0 * N;
  const double ln_bwd_bytes = s * (4 * NC + 5.0 * C) + 8.0 * N;
  const double f = median_ms(exec, a.warmup, a.iters, [&] {
    layernorm_forward<T>(exec, out, mean, rstd, x, w, b, N, C);
  });
  const double fp = median_ms(exec, a.warmup, a.iters, [&] {
    layernorm_forward_portable<T>(exec, out, mean, rstd, x, w, b, N, C);
  });
  const double g = median_ms(exec, a.warmup, a.iters, [&] {
    layernorm_backward<T>(exec, dinp, dw, db, dout, x, w, mean, rstd, N, C);
  });
  const double gp = median_ms(exec, a.warmup, a.iters, [&] {
    layernorm_backward_portable<T>(exec, dinp, dw, db, dout, x, w, mean, rstd, N, C);
  });
  row(dtype, "layernorm_forward", ln_fwd_bytes, f, fp);
  row(dtype, "layernorm_backward", ln_bwd_bytes, g, gp);

  // Cross-entropy at [N, Vp], every position counted.
  std::vector<std::int32_t> th(N);
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> dist(0, V - 1);
  for (auto& t : th) t = dist(gen);
  View1<std::int32_t> targets("bench_ce_targets", N);
  auto tm = Kokkos::create_mirror_view(targets);
  for (int i = 0; i < N; ++i) tm(i) = th[i];
  Kokkos::deep_copy(targets, tm);
  auto logits = random_view<T>("bench_ce_logits", std::size_t(N) * Vp, 6, -4.f, 4.f);
  View1<float> losses("bench_ce_losses", N);
  const double ce_fwd_bytes = s * double(N) * V + 8.0 * N;
  const double ce_fb_bytes = s * double(N) * (double(V) + Vp) + 8.0 * N;
  const double e = median_ms(exec, a.warmup, a.iters, [&] {
    cross_entropy_forward<T>(exec, losses, logits, targets, N, Vp, V);
  });
  const double ep = median_ms(exec, a.warmup, a.iters, [&] {
    cross_entropy_forward_portable<T>(exec, losses, logits, targets, N, Vp, V);
  });
  const float scale = 1.0f / float(N);
  const double h = median_ms(exec, a.warmup, a.iters, [&] {
    cross_entropy_forward_backward<T>(exec, losses, logits, targets, N, Vp, V, scale);
  });
  const double hp = median_ms(exec, a.warmup, a.iters, [&] {
    cross_entropy_forward_backward_portable<T>(exec, losses, logits, targets, N, Vp, V, scale);
  });
  row(dtype, "cross_entropy_forward", ce_fwd_bytes, e, ep);
  row(dtype, "cross_entropy_fwd_bwd", ce_fb_bytes, h, hp);
}

// One GEMM row: TFLOP/s of the call as the model makes it, of the plain GEMM of that shape, and
// of the unfused alternative where there is one (split_ms < 0: none).
void gemm_row(const char* op, int M, int N, int K, double ms, double plain_ms, double split_ms) {
  const double tf = 2.0 * M * N * K / 1e9;
  std::printf("bf16  gemm %-26s M=%6d N=%6d K=%6d %8.4f ms %6.1f TF/s | plain %8.4f ms %6.1f TF/s",
              op, M, N, K, ms, tf / ms, plain_ms, tf / plain_ms);
  if (split_ms > 0) std::printf(" | unfused %8.4f ms (fused/unfused x%.2f)", split_ms, split_ms / ms);
  std::printf("\n");
}

// The GEMMs of one GPT-2 block and the tied head at N rows, width C, as model/ calls them.
void bench_gemms(const Args& a) {
  using T = Kokkos::Experimental::bhalf_t;
  const int N = a.N, C = a.C, Vp = a.Vp, F = 4 * C;
  ExecSpace exec;
  const auto x = random_view<T>("bench_g_x", std::size_t(N) * F, 11, -1.f, 1.f);
  const auto y = random_view<T>("bench_g_y", std::size_t(N) * F, 12, -1.f, 1.f);
  // w also stands in for dout [N, OC] as the B of the plain weight-gradient GEMMs.
  const auto w = random_view<T>("bench_g_w", std::max(std::size_t(Vp) * C, std::size_t(N) * F),
                                13, -0.05f, 0.05f);
  const auto bias = random_view<T>("bench_g_b", F, 14, -0.1f, 0.1f);
  View1<T> out("bench_g_out", std::size_t(N) * Vp), pre("bench_g_pre", std::size_t(N) * F);
  View1<T> dw("bench_g_dw", std::size_t(Vp) * C), db("bench_g_db", F);
  const View1<const T> xc = x, yc = y, wc = w, bc = bias;
  const auto t = [&](auto&& fn) { return median_ms(exec, a.warmup, a.iters, fn); };
  const auto plain = [&](Trans ta, Trans tb, int M, int Nn, int K, int lda, int ldb) {
    return t([&] {
      gemm<T>(exec, ta, tb, M, Nn, K, 1.0f, x.data(), lda, w.data(), ldb, 0.0f, out.data(), Nn);
    });
  };
  // Forward: qkv (bias), attention projection and MLP projection (bias + residual), c_fc (GELU).
  for (const auto& [name, IC, OC, res] :
       {std::tuple{"fwd qkv (bias)", C, 3 * C, false}, std::tuple{"fwd attn proj (bias+res)", C, C, true},
        std::tuple{"fwd mlp proj (bias+res)", F, C, true}}) {
    const double ms = t([&] {
      if (res) linear_forward<T>(exec, out, xc, wc, bc, View1<const T>(out), N, IC, OC);
      else linear_forward<T>(exec, out, xc, wc, bc, N, IC, OC);
    });
    gemm_row(name, N, OC, IC, ms, plain(Trans::N, Trans::N, N, OC, IC, IC, OC), -1);
  }
  {
    const double ms = t([&] { linear_gelu_forward<T>(exec, out, pre, xc, wc, bc, N, C, F); });
    const double split = t([&] {
      linear_forward<T>(exec, pre, xc, wc, bc, N, C, F);
      gelu_forward<T>(exec, out, View1<const T>(pre), std::size_t(N) * F);
    });
    gemm_row("fwd c_fc (gelu+bias)", N, F, C, ms, plain(Trans::N, Trans::N, N, F, C, C, F), split);
  }
  // Head: logits[N, Vp] = x[N, C] wte[Vp, C]^T.
  gemm_row("fwd head", N, Vp, C, plain(Trans::N, Trans::T, N, Vp, C, C, C),
           plain(Trans::N, Trans::T, N, Vp, C, C, C), -1);
  // Backward: input and weight (+ bias) gradients.
  for (const auto& [name, IC, OC] :
       {std::tuple{"bwd qkv (dX,dW,db)", C, 3 * C}, std::tuple{"bwd attn proj (dX,dW,db)", C, C},
        std::tuple{"bwd c_fc (dX,dW,db)", C, F}}) {
    const double ms = t([&] {
      linear_backward<T>(exec, pre, dw, db, yc, xc, wc, N, IC, OC, false);
    });
    // Ceiling: the same two GEMMs without bias gradient.
    const double pl = plain(Trans::N, Trans::T, N, IC, OC, OC, OC) +
                      plain(Trans::T, Trans::N, IC, OC, N, IC, OC);
    gemm_row(name, N, OC, 2 * IC, ms, pl, -1);
  }
  {
    const double ms = t([&] {
      linear_backward_dgelu<T>(exec, pre, dw, db, yc, xc, wc, View1<const T>(out), N, F, C);
    });
    const double split = t([&] {
      linear_backward<T>(exec, pre, dw, db, yc, xc, wc, N, F, C, false);
      gelu_backward<T>(exec, pre, View1<const T>(out), View1<const T>(pre), std::size_t(N) * F);
    });
    const double pl = plain(Trans::N, Trans::T, N, F, C, C, C) +
                      plain(Trans::T, Trans::N, F, C, N, F, C);
    gemm_row("bwd mlp proj (dgelu,dW,db)", N, C, 2 * F, ms, pl, split);
  }
  {
    // Head backward: dx[N, C] = dlogits[N, Vp] wte[Vp, C]; dwte[Vp, C] = dlogits^T x.
    const double dx = t([&] {
      gemm<T>(exec, Trans::N, Trans::N, N, C, Vp, 1.0f, out.data(), Vp, w.data(), C, 0.0f,
              pre.data(), C);
    });
    const double dwt = t([&] {
      gemm<T>(exec, Trans::T, Trans::N, Vp, C, N, 1.0f, out.data(), Vp, x.data(), C, 1.0f,
              dw.data(), C);
    });
    gemm_row("bwd head dX", N, C, Vp, dx, dx, -1);
    gemm_row("bwd head dW (accumulate)", Vp, C, N, dwt, dwt, -1);
  }
}

// --shapes: each OP:MxNxK[:BETA] of the list as one plain GEMM, A [M, K] (or [K, M] for T),
// B [K, N] (or [N, K]), C [M, N], all contiguous row-major.
void bench_shapes(const Args& a) {
  using T = Kokkos::Experimental::bhalf_t;
  ExecSpace exec;
  std::stringstream list(a.shapes);
  std::string item;
  std::printf("plain bf16 GEMMs (kernels::gemm, cuBLASLt), median of %d after %d\n", a.iters,
              a.warmup);
  while (std::getline(list, item, ',')) {
    char ta = 0, tb = 0;
    int M = 0, N = 0, K = 0, beta = 0;
    const int got = std::sscanf(item.c_str(), "%c%c:%dx%dx%d:%d", &ta, &tb, &M, &N, &K, &beta);
    if (got < 5 || (ta != 'N' && ta != 'T') || (tb != 'N' && tb != 'T') || M <= 0 || N <= 0 ||
        K <= 0 || (beta != 0 && beta != 1)) {
      std::fprintf(stderr, "bench_kernels_cuda: --shapes item '%s' is not OP:MxNxK[:BETA]\n",
                   item.c_str());
      std::exit(2);
    }
    const Trans opa = ta == 'N' ? Trans::N : Trans::T, opb = tb == 'N' ? Trans::N : Trans::T;
    const auto A = random_view<T>("bench_s_a", std::size_t(M) * K, 21, -1.f, 1.f);
    const auto B = random_view<T>("bench_s_b", std::size_t(K) * N, 22, -1.f, 1.f);
    const auto C = random_view<T>("bench_s_c", std::size_t(M) * N, 23, -1.f, 1.f);
    const int lda = opa == Trans::N ? K : M, ldb = opb == Trans::N ? N : K;
    const double ms = median_ms(exec, a.warmup, a.iters, [&] {
      gemm<T>(exec, opa, opb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, float(beta),
              C.data(), N);
    });
    const double tf = 2.0 * M * N * K / 1e9;
    std::printf("meshtrain gemm %c%c %6dx%6dx%6d beta %d %9.4f ms %6.1f TF/s\n", ta, tb, M, N, K,
                beta, ms, tf / ms);
    if (a.fp8 && opa == Trans::N && opb == Trans::T) {
      // B as stored is [N, K] (ldb = K): the FP8 operand is its cast, as linear_fp8 casts x and W.
      for (const Fp8Scaling sc : {Fp8Scaling::tensorwise, Fp8Scaling::rowwise}) {
        Fp8Tensor qa = make_fp8_tensor("bench_s_qa", M, K, Fp8Format::e4m3, sc);
        Fp8Tensor qb = make_fp8_tensor("bench_s_qb", N, K, Fp8Format::e4m3, sc);
        fp8_quantize<T>(exec, qa, A);
        fp8_quantize<T>(exec, qb, B);
        const int before = gemm_fp8_cublaslt_calls();
        const double ms8 = median_ms(exec, a.warmup, a.iters, [&] {
          gemm_fp8<T>(exec, opa, opb, M, N, K, 1.0f, qa, qb, float(beta), C.data(), N);
        });
        const bool lt = gemm_fp8_cublaslt_calls() - before == a.warmup + a.iters;
        std::printf("meshtrain gemm_fp8 %c%c %6dx%6dx%6d beta %d e4m3 %-10s %9.4f ms %6.1f TF/s"
                    " %5.2fx bf16 cublaslt %s\n",
                    ta, tb, M, N, K, beta, fp8_scaling_name(sc), ms8, tf / ms8, ms / ms8,
                    lt ? "yes" : "no");
      }
    }
  }
}

// --casts: each ROWSxCOLS[:LD] item's amax and casts against a same-traffic copy.
void bench_casts(const Args& a) {
  using T = Kokkos::Experimental::bhalf_t;
  ExecSpace exec;
  int dev = 0, clock_khz = 0, bus_bits = 0;
  MESHTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
  MESHTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev));
  MESHTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
  const double peak_gbs = 2.0 * clock_khz * 1e3 * bus_bits / 8 / 1e9;  // double data rate
  std::printf("FP8 casts of bf16 blocks, median of %d after %d warm-up; peak memory bandwidth "
              "%.0f GB/s; \"x copy\" = a plain Kokkos copy of the same bytes / the kernel\n",
              a.iters, a.warmup, peak_gbs);
  std::stringstream list(a.casts);
  std::string item;
  while (std::getline(list, item, ',')) {
    int rows = 0, cols = 0, ld = 0;
    const int got = std::sscanf(item.c_str(), "%dx%d:%d", &rows, &cols, &ld);
    if (got < 2 || rows <= 0 || cols <= 0 || (got == 3 && ld < cols)) {
      std::fprintf(stderr, "bench_kernels_cuda: --casts item '%s' is not ROWSxCOLS[:LD]\n",
                   item.c_str());
      std::exit(2);
    }
    if (got < 3) ld = cols;
    const std::size_t n = std::size_t(rows) * cols;
    const auto x = random_view<T>("bench_cast_x", std::size_t(rows) * ld, 11, -3.f, 3.f);
    View1<std::uint8_t> q("bench_cast_q", n), qt("bench_cast_qt", n);
    View1<float> amax("bench_cast_amax", 1), scale("bench_cast_scale", 1);
    Kokkos::deep_copy(scale, 100.0f);
    const T* xp = x.data();
    const auto t = [&](const auto& fn) { return median_ms(exec, a.warmup, a.iters, fn); };
    // The bound: as many bf16 read once, contiguous, one byte written per element and output,
    // no encoding (a column block's rows are strided: its kernels may fall a little short).
    const auto copy = [&](int outputs) {
      return t([&] {
        Kokkos::parallel_for(
            "bench_cast_copy", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(n)),
            KOKKOS_LAMBDA(std::int64_t i) {
              const std::uint32_t b = fp8_detail::float_bits(static_cast<float>(xp[i]));
              q(i) = std::uint8_t(b >> 24);
              if (outputs == 2) qt(i) = std::uint8_t(b >> 16);
            });
      });
    };
    const double c1 = copy(1), c2 = copy(2);
    const double bytes1 = 3.0 * n, bytes2 = 4.0 * n, read = 2.0 * n;
    const double am = t([&] { fp8_amax_block<T>(exec, amax, xp, rows, cols, ld); });
    const double cq = t([&] {
      fp8_cast_block<T>(exec, q, View1<std::uint8_t>(), xp, rows, cols, ld, scale,
                        Fp8Format::e4m3);
    });
    const double ct = t([&] {
      fp8_cast_block<T>(exec, View1<std::uint8_t>(), qt, xp, rows, cols, ld, scale,
                        Fp8Format::e4m3);
    });
    const double cb = t([&] {
      fp8_cast_block<T>(exec, q, qt, xp, rows, cols, ld, scale, Fp8Format::e4m3);
    });
    const auto line = [&](const char* what, double ms, double bytes, double ref) {
      std::printf("cast %6dx%-6d ld %6d %-14s %8.4f ms %7.1f GB/s %5.1f%% of peak  x copy %.2f\n",
                  rows, cols, ld, what, ms, bytes / (ms * 1e6),
                  100.0 * bytes / (ms * 1e6) / peak_gbs, ref / ms);
    };
    line("copy 1 out", c1, bytes1, c1);
    line("copy 2 out", c2, bytes2, c2);
    line("amax", am, read, c1 * read / bytes1);  // the copy's rate at the amax's bytes
    line("cast q", cq, bytes1, c1);
    line("cast qt", ct, bytes1, c1);
    line("cast q+qt", cb, bytes2, c2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  Kokkos::ScopeGuard kokkos(argc, argv);
  if (!a.shapes.empty()) {
    bench_shapes(a);
    return 0;
  }
  if (!a.casts.empty()) {
    bench_casts(a);
    return 0;
  }
  std::printf("layernorm N=%d C=%d, cross-entropy N=%d V=%d Vp=%d: CUDA kernels vs the portable "
              "Kokkos kernels; median of %d after %d warm-up\n",
              a.N, a.C, a.N, a.V, a.Vp, a.iters, a.warmup);
  if (!a.only_gemm) {
    bench<Kokkos::Experimental::bhalf_t>("bf16", a);
    bench<float>("fp32", a);
  }
  if (a.gemm || a.only_gemm) bench_gemms(a);
  return 0;
}
