// Token + position embedding and its backward.
//
// The wte gradient is a scatter-add (many positions share a token). Atomics would make the
// summation order, hence the bits, depend on scheduling; instead one thread owns one channel c
// and walks the tokens in order, so every dwte[v, c] is summed in token order on every run and
// every backend. Channels are contiguous in memory, so neighbouring threads stay coalesced.
#include "meshtrain/kernels/embedding.hpp"

#include <type_traits>

#include "common.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <bit>

#include "sort_keys_cuda.hpp"
#elif MESHTRAIN_KOKKOS4
#include <Kokkos_Sort.hpp>
#endif

namespace meshtrain::kernels {

namespace {
void check_embedding(const char* fn, int B, int Tlen, int C, int vocab_start, int vocab_local) {
  MESHTRAIN_CHECK(B >= 0 && Tlen >= 0 && C > 0, fn, ": bad shape B=", B, ", T=", Tlen, ", C=", C);
  MESHTRAIN_CHECK(vocab_start >= 0 && vocab_local >= 0, fn, ": bad vocab slice start=",
                  vocab_start, ", local=", vocab_local);
}
// Positions of the Tlen rows: one each. Their bounds are the caller's (the model checks them
// against the position table once; checking here would read device memory on every call).
void check_positions(const char* fn, View1<const std::int32_t> positions, int Tlen) {
  detail::check_extent(positions, std::size_t(Tlen), fn, "positions");
}

}  // namespace

template <class T>
void embedding_forward(const ExecSpace& exec, View1<T> out, View1<const std::int32_t> tokens,
                       View1<const T> wte, View1<const T> wpe, int B, int Tlen, int C,
                       int vocab_start, int vocab_local, View1<const std::int32_t> positions) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  using detail::Index;
  const char* fn = "embedding_forward";
  check_embedding(fn, B, Tlen, C, vocab_start, vocab_local);
  const std::size_t BT = std::size_t(B) * Tlen;
  detail::check_extent(out, BT * C, fn, "out");
  detail::check_extent(tokens, BT, fn, "tokens");
  detail::check_extent(wte, std::size_t(vocab_local) * C, fn, "wte");
  const bool has_wpe = detail::present(wpe);
  const bool has_pos = detail::present(positions);
  if (has_pos) check_positions(fn, positions, Tlen);
  else if (has_wpe) detail::check_extent(wpe, std::size_t(Tlen) * C, fn, "wpe");
  Kokkos::parallel_for(
      "meshtrain::embedding_forward", detail::Range(exec, 0, Index(BT) * C),
      KOKKOS_LAMBDA(Index idx) {
        const Index bt = idx / C, c = idx % C;
        const Index t = bt % Tlen;
        const Index v = Index(tokens(bt)) - vocab_start;
        Acc x = (v >= 0 && v < vocab_local) ? acc(wte(v * C + c)) : Acc(0);
        if (has_wpe) x += acc(wpe((has_pos ? Index(positions(t)) : t) * C + c));
        out(idx) = static_cast<T>(x);
      });
}

template <class T>
void embedding_backward(const ExecSpace& exec, View1<T> dwte, View1<T> dwpe, View1<const T> dout,
                        View1<const std::int32_t> tokens, int B, int Tlen, int C,
                        int vocab_start, int vocab_local, View1<const std::int32_t> positions) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  using detail::Index;
  const char* fn = "embedding_backward";
  check_embedding(fn, B, Tlen, C, vocab_start, vocab_local);
  const Index BT = Index(B) * Tlen;
  detail::check_extent(dout, std::size_t(BT) * C, fn, "dout");
  detail::check_extent(tokens, std::size_t(BT), fn, "tokens");
  detail::check_extent(dwte, std::size_t(vocab_local) * C, fn, "dwte");
#if MESHTRAIN_KOKKOS4
  // (double, for the gradient-check tests, keeps the plain walk below: the partials are fp32.)
  if constexpr (!kDeviceIsHost && std::is_same_v<Acc, float>) {
    // GPU: one thread per channel walking all tokens leaves the GPU nearly idle (768 threads
    // for GPT-2). Sort (token << 32 | position) keys instead: a total order, so the result does
    // not depend on the sort algorithm; each run of equal tokens is then one segment of the
    // sorted rows. A segment can be long (a byte-level corpus puts ~20 % of all rows on the
    // space): summing it in one thread per channel was ~2 ms of a GPT-2 step, a chain of
    // dependent loads. So, deterministic and in position order, in two passes:
    //   1. one thread per (piece of kPiece sorted rows, channel) sums each run of equal tokens
    //      inside its piece and stores the sum at the run's first row (partials);
    //   2. one thread per (segment start, channel) adds the partials of its segment's pieces in
    //      order: at most len / kPiece + 1 loads instead of len.
    // Keys and partials live in persistent scratch (slots 3 and 2): no allocation per step.
    constexpr Index kPiece = 32;
    using Keys = Kokkos::View<std::uint64_t*, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
#if defined(KOKKOS_ENABLE_CUDA)
    // CUB's radix sort (sort_keys_cuda.hpp: no allocation, no wait for the device) over the
    // bits that vary: the position's 32 and the token's (at most vocab_local). Slot 3 holds the
    // unsorted keys, the sorted ones, then the sort's storage.
    const int end_bit = 32 + static_cast<int>(std::bit_width(std::uint64_t(vocab_local)));
    const std::size_t sort_bytes = detail::sort_keys_cuda_temp_bytes(int(BT), end_bit);
    const std::size_t key_floats = 2 * std::size_t(BT), temp_at = 2 * key_floats;
    const View1<float> scratch = detail::persistent_buffer(3, temp_at + (sort_bytes + 3) / 4);
    const Keys unsorted(reinterpret_cast<std::uint64_t*>(scratch.data()), std::size_t(BT));
    const Keys keys(reinterpret_cast<std::uint64_t*>(scratch.data() + key_floats),
                    std::size_t(BT));
#else
    const Keys keys(
        reinterpret_cast<std::uint64_t*>(detail::persistent_buffer(3, 2 * std::size_t(BT)).data()),
        std::size_t(BT));
    const Keys unsorted = keys;  // sorted in place
#endif
    const View1<float> part = detail::persistent_buffer(2, std::size_t(BT) * C);
    Kokkos::parallel_for(
        "meshtrain::embedding_backward_keys", detail::Range(exec, 0, BT), KOKKOS_LAMBDA(Index bt) {
          const Index v = Index(tokens(bt)) - vocab_start;
          // Out-of-slice tokens sort last (key past every real token) and are skipped.
          const std::uint64_t tok = (v >= 0 && v < vocab_local) ? std::uint64_t(v)
                                                                : std::uint64_t(vocab_local);
          unsorted(bt) = (tok << 32) | std::uint64_t(bt);
        });
#if defined(KOKKOS_ENABLE_CUDA)
    detail::sort_keys_cuda(exec, unsorted.data(), keys.data(), int(BT), end_bit,
                           scratch.data() + temp_at, sort_bytes);
#else
    Kokkos::sort(exec, keys);
#endif
    const Index pieces = (BT + kPiece - 1) / kPiece;
    Kokkos::parallel_for(
        "meshtrain::embedding_backward_pieces", detail::Range(exec, 0, pieces * C),
        KOKKOS_LAMBDA(Index idx) {
          const Index p = idx / C, c = idx % C;
          const Index i0 = p * kPiece, i1 = i0 + kPiece < BT ? i0 + kPiece : BT;
          Index run = i0;
          std::uint64_t tok = keys(i0) >> 32;
          float s = 0;
          for (Index i = i0; i < i1; ++i) {
            const std::uint64_t k = keys(i);
            if ((k >> 32) != tok) {
              part(run * C + c) = s;
              run = i;
              tok = k >> 32;
              s = 0;
            }
            s += static_cast<float>(acc(dout(Index(k & 0xffffffffu) * C + c)));
          }
          part(run * C + c) = s;
        });
    Kokkos::parallel_for(
        "meshtrain::embedding_backward_dwte", detail::Range(exec, 0, BT * C),
        KOKKOS_LAMBDA(Index idx) {
          const Index i = idx / C, c = idx % C;
          const std::uint64_t tok = keys(i) >> 32;
          if (tok >= std::uint64_t(vocab_local)) return;
          if (i > 0 && (keys(i - 1) >> 32) == tok) return;  // not the start of a segment
          Acc s = part(i * C + c);
          for (Index j = (i / kPiece + 1) * kPiece; j < BT && (keys(j) >> 32) == tok; j += kPiece)
            s += part(j * C + c);
          const Index row = Index(tok);
          dwte(row * C + c) = static_cast<T>(acc(dwte(row * C + c)) + s);
        });
  } else
#endif
  // Host: one thread per channel walks the tokens in order (contiguous rows, deterministic).
  // dwte is accumulated in its own type as it goes (a row can be hit many times).
  Kokkos::parallel_for(
      "meshtrain::embedding_backward_dwte", detail::Range(exec, 0, C), KOKKOS_LAMBDA(Index c) {
        for (Index bt = 0; bt < BT; ++bt) {
          const Index v = Index(tokens(bt)) - vocab_start;
          if (v < 0 || v >= vocab_local) continue;
          dwte(v * C + c) = static_cast<T>(acc(dwte(v * C + c)) + acc(dout(bt * C + c)));
        }
      });
  if (detail::present(dwpe)) {
    const bool has_pos = detail::present(positions);
    if (has_pos) check_positions(fn, positions, Tlen);
    else detail::check_extent(dwpe, std::size_t(Tlen) * C, fn, "dwpe");
    Kokkos::parallel_for(
        "meshtrain::embedding_backward_dwpe", detail::Range(exec, 0, Index(Tlen) * C),
        KOKKOS_LAMBDA(Index tc) {
          Acc s = 0;
          for (Index b = 0; b < B; ++b) s += acc(dout(b * Tlen * C + tc));
          // Distinct positions: every row of dwpe is written by one t at most.
          const Index row = has_pos ? Index(positions(tc / C)) * C + tc % C : tc;
          dwpe(row) = static_cast<T>(acc(dwpe(row)) + s);
        });
  }
}

#define MESHTRAIN_INSTANTIATE_EMBEDDING(T)                                                     \
  template void embedding_forward<T>(const ExecSpace&, View1<T>, View1<const std::int32_t>,    \
                                     View1<const T>, View1<const T>, int, int, int, int, int,  \
                                     View1<const std::int32_t>);                               \
  template void embedding_backward<T>(const ExecSpace&, View1<T>, View1<T>, View1<const T>,    \
                                      View1<const std::int32_t>, int, int, int, int, int,      \
                                      View1<const std::int32_t>);
MESHTRAIN_INSTANTIATE_EMBEDDING(float)
MESHTRAIN_INSTANTIATE_EMBEDDING(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_EMBEDDING(bf16)
MESHTRAIN_INSTANTIATE_EMBEDDING(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_EMBEDDING

}  // namespace meshtrain::kernels
