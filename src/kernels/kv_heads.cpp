// Repeat / sum of grouped key-value heads: flat Kokkos ranges, one thread per output element,
// consecutive threads on consecutive columns.
#include "meshtrain/kernels/kv_heads.hpp"

#include "common.hpp"

namespace meshtrain::kernels {

namespace {
void check_shape(const char* fn, int N, int NH, int NKV, int HS) {
  MESHTRAIN_CHECK(N >= 0 && NH > 0 && NKV > 0 && HS > 0 && NH % NKV == 0, fn, ": bad shape N=", N,
                  ", NH=", NH, ", NKV=", NKV, ", HS=", HS, " (NKV must divide NH)");
}
}  // namespace

template <class T>
void expand_kv_heads(const ExecSpace& exec, View1<T> full, View1<const T> compact, int N, int NH,
                     int NKV, int HS) {
  using detail::Index;
  check_shape("expand_kv_heads", N, NH, NKV, HS);
  const Index Q = Index(NH) * HS, KV = Index(NKV) * HS, G = NH / NKV;
  const Index wf = 3 * Q, wc = Q + 2 * KV;
  detail::check_extent(full, std::size_t(N) * wf, "expand_kv_heads", "full");
  detail::check_extent(compact, std::size_t(N) * wc, "expand_kv_heads", "compact");
  Kokkos::parallel_for(
      "meshtrain::expand_kv_heads", detail::Range(exec, 0, Index(N) * wf),
      KOKKOS_LAMBDA(Index i) {
        const Index r = i / wf, c = i % wf, part = c / Q, within = c % Q;
        // part 0: q, same column; parts 1, 2: query head h reads kv head h / G of k or v
        const Index h = within / HS, d = within % HS;
        const Index src = part == 0 ? within : Q + (part - 1) * KV + (h / G) * HS + d;
        full(i) = compact(r * wc + src);
      });
}

template <class T>
void reduce_kv_heads(const ExecSpace& exec, View1<T> dcompact, View1<const T> dfull, int N,
                     int NH, int NKV, int HS) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  using detail::Index;
  check_shape("reduce_kv_heads", N, NH, NKV, HS);
  const Index Q = Index(NH) * HS, KV = Index(NKV) * HS, G = NH / NKV;
  const Index wf = 3 * Q, wc = Q + 2 * KV;
  detail::check_extent(dfull, std::size_t(N) * wf, "reduce_kv_heads", "dfull");
  detail::check_extent(dcompact, std::size_t(N) * wc, "reduce_kv_heads", "dcompact");
  Kokkos::parallel_for(
      "meshtrain::reduce_kv_heads", detail::Range(exec, 0, Index(N) * wc),
      KOKKOS_LAMBDA(Index i) {
        const Index r = i / wc, c = i % wc;
        if (c < Q) {
          dcompact(i) = dfull(r * wf + c);
          return;
        }
        const Index part = (c - Q) / KV, within = (c - Q) % KV;  // part 0: k, 1: v
        const Index m = within / HS, d = within % HS;
        Acc s = 0;
        const Index base = r * wf + (1 + part) * Q + d;
        for (Index j = m * G; j < (m + 1) * G; ++j) s += acc(dfull(base + j * HS));
        dcompact(i) = static_cast<T>(s);
      });
}

#define MESHTRAIN_INSTANTIATE_KV_HEADS(T)                                                      \
  template void expand_kv_heads<T>(const ExecSpace&, View1<T>, View1<const T>, int, int, int,  \
                                   int);                                                       \
  template void reduce_kv_heads<T>(const ExecSpace&, View1<T>, View1<const T>, int, int, int,  \
                                   int);
MESHTRAIN_INSTANTIATE_KV_HEADS(float)
MESHTRAIN_INSTANTIATE_KV_HEADS(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_KV_HEADS(bf16)
MESHTRAIN_INSTANTIATE_KV_HEADS(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_KV_HEADS

}  // namespace meshtrain::kernels
