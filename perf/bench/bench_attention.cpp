// Causal attention on one GPU: the CUDA flash kernels (what attention_forward/backward run on a
// CUDA build, src/kernels/attention/attention_cuda*.cpp) against the portable Kokkos flash kernels
// (attention_*_flash) measured in the same run, fp32 and bf16, at GPT-2 124M shapes; then, bf16,
// ours (--attn.impl meshtrain) against cuDNN's fused flash attention (--attn.impl cudnn, and its
// deterministic backward) when libcudnn.so.9 loads.
//
//   bench_attention [--batch 16] [--seq-len 1024] [--heads 12] [--kv-heads 0] [--head-size 64]
//                   [--iters 20] [--warmup 3] [--flash-iters 3] [--variants 1] [--table 1]
//
// --table 1 instead times ours against cuDNN over a fixed list of shapes (GPT-2 124M at
// micro-batch 16 and 32, long sequences, head size 128, grouped-query attention).
//
// --variants 1 (HS = 64) instead times the bf16 kernels' tile shapes (kernels/attention/attention_cuda.hpp,
// Bf16Tiles) against the default and checks that each gives the default's results (max |diff| /
// max |default| of out and dqkv; bf16 rounding differs with the summation order).
//
// Each figure is the median of --iters calls (--flash-iters for the slow portable kernels) after
// --warmup, timed with CUDA events on the execution space's stream. FLOPs are those of the
// causal products: forward 4 B NH T^2 HS / 2 (QK^T and PV over the lower triangle), backward
// 2.5x that (FlashAttention's convention; the deterministic dq pass recomputes QK^T and dO V^T,
// which this count does not credit).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_bench_util.hpp"
#include "meshtrain/core/cuda_check.hpp"
#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/view.hpp"
#include "meshtrain/kernels/attention/attention.hpp"
#include "../../src/kernels/attention/attention_cuda.hpp"  // private: the tile variants (Bf16Tiles)

using namespace meshtrain;
using namespace meshtrain::kernels;
using meshtrain::perf_util::median_ms;
using meshtrain::perf_util::random_view;

namespace {

struct Args {
  int B = 16, T = 1024, NH = 12, NKV = 0, HS = 64;
  int iters = 20, warmup = 3, flash_iters = 3, variants = 0, table = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::stoi(argv[i + 1]);
    if (k == "--batch") a.B = v;
    else if (k == "--seq-len") a.T = v;
    else if (k == "--heads") a.NH = v;
    else if (k == "--kv-heads") a.NKV = v;
    else if (k == "--table") a.table = v;
    else if (k == "--head-size") a.HS = v;
    else if (k == "--iters") a.iters = v;
    else if (k == "--warmup") a.warmup = v;
    else if (k == "--flash-iters") a.flash_iters = v;
    else if (k == "--variants") a.variants = v;
    else {
      std::fprintf(stderr, "bench_attention: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}


// ours vs cuDNN (bf16), forward and backward, at one shape; NKV = 0 means NH.
struct Cmp {
  double ours_f, ours_b, cudnn_f, cudnn_b, cudnn_b_det;
};

Cmp compare(int B, int Tl, int NH, int NKV, int HS, int warmup, int iters) {
  using T = Kokkos::Experimental::bhalf_t;
  const int nkv = NKV == 0 ? NH : NKV;
  const std::size_t rows = std::size_t(B) * Tl, C = std::size_t(NH) * HS;
  const std::size_t ld = C + 2 * std::size_t(nkv) * HS;
  const auto qkv = random_view<T>("bench_qkv", rows * ld, 1, -2.f, 2.f);
  const auto dout = random_view<T>("bench_dout", rows * C, 2, -1.f, 1.f);
  View1<T> out("bench_out", rows * C), dqkv("bench_dqkv", rows * ld);
  View1<float> lse("bench_lse", rows * NH);
  ExecSpace exec;
  auto time = [&](AttentionImpl impl, bool det, double& f, double& b) {
    set_attention_options({impl, det});
    f = median_ms(exec, warmup, iters,
                  [&] { attention_forward<T>(exec, out, lse, qkv, B, Tl, NH, HS, nkv); });
    b = median_ms(exec, warmup, iters, [&] {
      attention_backward<T>(exec, dqkv, dout, qkv, out, lse, B, Tl, NH, HS, nkv);
    });
  };
  Cmp c{};
  time(AttentionImpl::meshtrain, false, c.ours_f, c.ours_b);
  if (cudnn_attention_unavailable_reason().empty()) {
    time(AttentionImpl::cudnn, false, c.cudnn_f, c.cudnn_b);
    double unused = 0;
    time(AttentionImpl::cudnn, true, unused, c.cudnn_b_det);
  }
  set_attention_options({});
  return c;
}

void row(const char* dtype, const char* pass, double flops, double ms, double ref_ms) {
  std::printf("%-5s %-8s %10.3f ms %8.2f TFLOP/s | flash %10.3f ms %8.2f TFLOP/s | x%.1f\n", dtype,
              pass, ms, flops / (ms * 1e9), ref_ms, flops / (ref_ms * 1e9), ref_ms / ms);
}

template <class T>
void bench(const char* dtype, const Args& a) {
  const std::size_t rows = std::size_t(a.B) * a.T, C = std::size_t(a.NH) * a.HS;
  const auto qkv = random_view<T>("bench_qkv", rows * 3 * C, 1, -2.f, 2.f);
  const auto dout = random_view<T>("bench_dout", rows * C, 2, -1.f, 1.f);
  View1<T> out("bench_out", rows * C), dqkv("bench_dqkv", rows * 3 * C);
  View1<float> lse("bench_lse", rows * a.NH);
  ExecSpace exec;
  const int B = a.B, Tl = a.T, NH = a.NH, HS = a.HS;
  const double fwd_flops = 4.0 * B * NH * double(Tl) * Tl * HS / 2, bwd_flops = 2.5 * fwd_flops;
  set_attention_options({AttentionImpl::meshtrain, false});  // our CUDA kernels, not cuDNN

  const double f = median_ms(exec, a.warmup, a.iters, [&] {
    attention_forward<T>(exec, out, lse, qkv, B, Tl, NH, HS);
  });
  const double fr = median_ms(exec, 1, a.flash_iters, [&] {
    attention_forward_flash<T>(exec, out, lse, qkv, B, Tl, NH, HS);
  });
  const double b = median_ms(exec, a.warmup, a.iters, [&] {
    attention_backward<T>(exec, dqkv, dout, qkv, out, lse, B, Tl, NH, HS);
  });
  const double br = median_ms(exec, 1, a.flash_iters, [&] {
    attention_backward_flash<T>(exec, dqkv, dout, qkv, out, lse, B, Tl, NH, HS);
  });
  row(dtype, "forward", fwd_flops, f, fr);
  row(dtype, "backward", bwd_flops, b, br);
  set_attention_options({});
  if (std::is_same_v<T, Kokkos::Experimental::bhalf_t> && HS != 32) {
    const Cmp c = compare(B, Tl, NH, a.NKV, HS, a.warmup, a.iters);
    std::printf("bf16  cuDNN    forward %8.3f ms %8.2f TFLOP/s, backward %8.3f ms %8.2f TFLOP/s "
                "(deterministic %8.3f ms); ours %.3f / %.3f ms\n",
                c.cudnn_f, c.cudnn_f > 0 ? fwd_flops / (c.cudnn_f * 1e9) : 0.0, c.cudnn_b,
                c.cudnn_b > 0 ? bwd_flops / (c.cudnn_b * 1e9) : 0.0, c.cudnn_b_det, c.ours_f,
                c.ours_b);
  }
}

double max_rel_diff(const View1<Kokkos::Experimental::bhalf_t>& x,
                    const View1<Kokkos::Experimental::bhalf_t>& ref) {
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  auto hr = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ref);
  double d = 0, m = 0;
  for (std::size_t i = 0; i < hx.extent(0); ++i) {
    const double a = float(hx(i)), b = float(hr(i));
    d = std::max(d, std::fabs(a - b));
    m = std::max(m, std::fabs(b));
  }
  return m > 0 ? d / m : d;
}

void variants(const Args& a) {
  using T = Kokkos::Experimental::bhalf_t;
  namespace dc = detail::cuda;
  const std::size_t rows = std::size_t(a.B) * a.T, C = std::size_t(a.NH) * a.HS;
  const auto qkv = random_view<T>("bench_qkv", rows * 3 * C, 1, -2.f, 2.f);
  const auto dout = random_view<T>("bench_dout", rows * C, 2, -1.f, 1.f);
  View1<T> out("bench_out", rows * C), dqkv("bench_dqkv", rows * 3 * C);
  View1<T> out0("bench_out0", rows * C), dqkv0("bench_dqkv0", rows * 3 * C);
  View1<float> lse("bench_lse", rows * a.NH), lse0("bench_lse0", rows * a.NH);
  ExecSpace exec;
  const int B = a.B, Tl = a.T, NH = a.NH, HS = a.HS;
  const double fwd_flops = 4.0 * B * NH * double(Tl) * Tl * HS / 2, bwd_flops = 2.5 * fwd_flops;
  dc::set_bf16_tiles({});
  set_attention_options({AttentionImpl::meshtrain, false});
  attention_forward<T>(exec, out0, lse0, qkv, B, Tl, NH, HS);
  attention_backward<T>(exec, dqkv0, dout, qkv, out0, lse0, B, Tl, NH, HS);
  exec.fence();
  // The default (fwd 4; dkdv 4 x 64; dq 4 x 32) first, then one change at a time.
  const dc::Bf16Tiles cfgs[] = {{4, 4, 64, 4, 32, 64},  {8, 4, 64, 4, 32, 64},
                                {4, 4, 64, 4, 32, 128}, {4, 4, 64, 4, 32, 32},
                                {8, 4, 64, 4, 32, 128}, {4, 4, 64, 4, 16, 64},
                                {4, 4, 32, 4, 32, 64},  {4, 4, 64, 4, 64, 64}};
  std::printf("bf16 tiles (fwd warps x keys; dkdv warps x BQ; dq warps x BN): fwd ms, bwd ms, "
              "TFLOP/s, max rel diff of out / dqkv vs the default\n");
  for (const auto& c : cfgs) {
    dc::set_bf16_tiles(c);
    const double f = median_ms(exec, a.warmup, a.iters, [&] {
      attention_forward<T>(exec, out, lse, qkv, B, Tl, NH, HS);
    });
    const double b = median_ms(exec, a.warmup, a.iters, [&] {
      attention_backward<T>(exec, dqkv, dout, qkv, out0, lse0, B, Tl, NH, HS);
    });
    exec.fence();
    std::printf("fwd %d x %3d; dkdv %d x %2d; dq %d x %2d: %7.3f ms %6.1f | %7.3f ms %6.1f | %.1e / %.1e\n",
                c.fwd_warps, c.fwd_bn, c.dkdv_warps, c.dkdv_bq, c.dq_warps, c.dq_bn, f,
                fwd_flops / (f * 1e9), b, bwd_flops / (b * 1e9), max_rel_diff(out, out0),
                max_rel_diff(dqkv, dqkv0));
  }
  dc::set_bf16_tiles({});
}

void table(const Args& a) {
  struct S {
    int B, T, NH, NKV, HS;
  };
  // GPT-2 124M (mb 16, 32); long sequences; head size 128; grouped-query (Llama 3.2 1B's 32 q /
  // 8 kv heads of 64; Llama 3.1 8B's 32 q / 8 kv heads of 128).
  const S shapes[] = {{16, 1024, 12, 12, 64}, {32, 1024, 12, 12, 64}, {4, 4096, 12, 12, 64},
                      {8, 2048, 16, 16, 128}, {8, 2048, 32, 8, 64},   {4, 2048, 32, 8, 128},
                      {1, 4096, 32, 8, 128}};
  const std::string why = cudnn_attention_unavailable_reason();
  std::printf("bf16 causal attention, ours vs cuDNN%s; median of %d after %d warm-up (ms)\n",
              why.empty() ? "" : (" (cuDNN unavailable: " + why + ")").c_str(), a.iters,
              a.warmup);
  std::printf("| B | T | NH | NKV | HS | ours fwd | ours bwd | cuDNN fwd | cuDNN bwd | cuDNN bwd "
              "(det.) | ours/cuDNN fwd+bwd |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const S& s : shapes) {
    const Cmp c = compare(s.B, s.T, s.NH, s.NKV, s.HS, a.warmup, a.iters);
    std::printf("| %d | %d | %d | %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f |\n", s.B,
                s.T, s.NH, s.NKV, s.HS, c.ours_f, c.ours_b, c.cudnn_f, c.cudnn_b, c.cudnn_b_det,
                c.cudnn_f + c.cudnn_b > 0 ? (c.ours_f + c.ours_b) / (c.cudnn_f + c.cudnn_b) : 0.0);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  Kokkos::ScopeGuard kokkos(argc, argv);
  const bool cuda_path = a.HS == 32 || a.HS == 64 || a.HS == 128;
  std::printf("causal attention B=%d T=%d NH=%d HS=%d: %s vs the portable Kokkos flash kernels; "
              "median of %d (flash: %d) after %d warm-up\n",
              a.B, a.T, a.NH, a.HS,
              cuda_path ? "CUDA kernels" : "HS unsupported by the CUDA kernels (both portable)",
              a.iters, a.flash_iters, a.warmup);
  if (a.variants) {
    variants(a);
    return 0;
  }
  if (a.table) {
    table(a);
    return 0;
  }
  bench<Kokkos::Experimental::bhalf_t>("bf16", a);
  bench<float>("fp32", a);
  return 0;
}
