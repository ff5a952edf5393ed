// Rotary position embedding, HF's rotate_half convention (rotary.hpp).
//
// The frequencies follow HF's transformers/modeling_rope_utils.py operation by operation in
// fp32, because HF's model computes them, and the angles, in fp32 whatever its dtype (its
// float64 model too): a reference that computed them in double would disagree with it by the
// fp32 rounding of the angle, ~1e-7 * pos. Python-scalar-with-tensor operations in torch round
// the scalar to the tensor's dtype, and `scalar / tensor` is `reciprocal(tensor) * scalar`
// (torch/_tensor.py __rtruediv__); the code below does exactly those fp32 operations.
//
// The rotation is memory-bound: a flat Kokkos range over (row, head, pair) on GPUs, so that
// consecutive threads touch consecutive elements, and a loop over the pairs of a head on
// hosts. The backward is the same kernel with sin negated (a rotation's inverse is its
// transpose).
#include "meshtrain/kernels/rotary.hpp"

#include <cmath>

#include "common.hpp"
#include "pack8.hpp"

namespace meshtrain::kernels {

std::vector<float> rope_inv_freq(int head_size, const RopeConfig& c) {
  MESHTRAIN_CONFIG_CHECK(head_size > 0 && head_size % 2 == 0, "rotary embedding: head size ",
                         head_size, " must be positive and even (pairs (i, i + HS/2))");
  MESHTRAIN_CONFIG_CHECK(c.theta > 0, "rotary embedding: rope_theta = ", c.theta,
                         " must be positive");
  const int half = head_size / 2;
  std::vector<float> inv(half);
  // inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
  const float base = static_cast<float>(c.theta);
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_size);
    inv[i] = 1.0f / std::pow(base, e);
  }
  if (!c.llama3_scaling) return inv;

  MESHTRAIN_CONFIG_CHECK(c.factor >= 1.0, "rope_scaling.factor = ", c.factor,
                         " must be >= 1 (Llama 3 scaling)");
  MESHTRAIN_CONFIG_CHECK(c.high_freq_factor > c.low_freq_factor && c.low_freq_factor > 0,
                         "rope_scaling: high_freq_factor = ", c.high_freq_factor,
                         " must exceed low_freq_factor = ", c.low_freq_factor, " > 0");
  MESHTRAIN_CONFIG_CHECK(c.original_max_position_embeddings > 0,
                         "rope_scaling.original_max_position_embeddings = ",
                         c.original_max_position_embeddings, " must be positive");
  // _compute_llama3_parameters: wavelengths above original/low are divided by factor, below
  // original/high kept, and in between interpolated with smooth = (original / wavelen - low) /
  // (high - low).
  const double old_len = c.original_max_position_embeddings;
  const float factor = static_cast<float>(c.factor);
  const float low = static_cast<float>(c.low_freq_factor);
  const float low_wavelen = static_cast<float>(old_len / c.low_freq_factor);
  const float high_wavelen = static_cast<float>(old_len / c.high_freq_factor);
  const float band = static_cast<float>(c.high_freq_factor - c.low_freq_factor);
  const float two_pi = static_cast<float>(2.0 * M_PI);
  for (int i = 0; i < half; ++i) {
    const float wavelen = (1.0f / inv[i]) * two_pi;
    const float scaled = wavelen > low_wavelen ? inv[i] / factor : inv[i];
    const float smooth = ((1.0f / wavelen) * static_cast<float>(old_len) - low) / band;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    inv[i] = medium ? smoothed : scaled;
  }
  return inv;
}

RopeTable rope_table(const ExecSpace& exec, int T, int head_size, const RopeConfig& c) {
  MESHTRAIN_CONFIG_CHECK(T > 0, "rotary embedding: sequence length ", T, " must be positive");
  std::vector<int> positions(static_cast<std::size_t>(T));
  for (int t = 0; t < T; ++t) positions[static_cast<std::size_t>(t)] = t;
  return rope_table(exec, positions, head_size, c);
}

RopeTable rope_table(const ExecSpace& exec, const std::vector<int>& positions, int head_size,
                     const RopeConfig& c) {
  const int T = static_cast<int>(positions.size());
  MESHTRAIN_CONFIG_CHECK(T > 0, "rotary embedding: sequence length ", T, " must be positive");
  const std::vector<float> inv = rope_inv_freq(head_size, c);
  const int half = head_size / 2;
  View1<float> inv_d = alloc<float>("rope_inv_freq", half);
  View1<int> pos_d = alloc<int>("rope_positions", positions.size());
  {
    auto h = Kokkos::create_mirror_view(inv_d);
    for (int i = 0; i < half; ++i) h(i) = inv[i];
    Kokkos::deep_copy(inv_d, h);
    auto p = Kokkos::create_mirror_view(pos_d);
    for (std::size_t t = 0; t < positions.size(); ++t) p(t) = positions[t];
    Kokkos::deep_copy(pos_d, p);
  }
  RopeTable t{T, head_size, c, alloc<float>("rope_cos", std::size_t(T) * half),
              alloc<float>("rope_sin", std::size_t(T) * half)};
  View1<float> cs = t.cos, sn = t.sin;
  Kokkos::parallel_for(
      "meshtrain::rotary_table", detail::Range(exec, 0, detail::Index(T) * half),
      KOKKOS_LAMBDA(detail::Index k) {
        const int pos = pos_d(int(k / half)), i = int(k % half);
        const float angle = static_cast<float>(pos) * inv_d(i);  // fp32, as HF's matmul
        // Evaluated in double and rounded once: the correctly rounded fp32 cos/sin.
        cs(k) = static_cast<float>(kc::cos(static_cast<double>(angle)));
        sn(k) = static_cast<float>(kc::sin(static_cast<double>(angle)));
      });
  kc::fence(exec, "meshtrain::rotary_table: inverse frequencies and positions released");
  return t;
}

namespace {

// sign = +1: the rotation; -1: its inverse.
template <class T>
void rotate(const char* label, const ExecSpace& exec, View1<T> x, const RopeTable& tab, int B,
            int Tseq, int NH, int NKV, float sign) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  using detail::Index;
  MESHTRAIN_CHECK(B >= 0 && Tseq >= 0 && NH > 0 && NKV > 0, label,
                  ": bad shape B=", B, ", T=", Tseq, ", NH=", NH, ", NKV=", NKV);
  MESHTRAIN_CHECK(tab.head_size > 0 && Tseq <= tab.T, label, ": the table holds ", tab.T,
                  " positions of head size ", tab.head_size, ", the batch has T=", Tseq);
  const int HS = tab.head_size, half = HS / 2, H = NH + NKV;
  const Index row_len = Index(NH + 2 * NKV) * HS;
  const Index N = Index(B) * Tseq;
  detail::check_extent(x, std::size_t(N * row_len), label, "qkv");
  const View1<const float> cs = tab.cos, sn = tab.sin;
  const Acc sg = sign;
  if constexpr (kDeviceIsHost) {
    // One (row, head) per iteration: the pairs of a head are contiguous and vectorise.
    Kokkos::parallel_for(
        label, detail::Range(exec, 0, N * H), KOKKOS_LAMBDA(Index rh) {
          const Index row = rh / H;
          const int h = int(rh % H);
          const Index base = row * row_len + Index(h) * HS;
          const Index trig = Index(row % Tseq) * half;
          for (int i = 0; i < half; ++i) {
            const Acc c = cs(trig + i), s = sg * Acc(sn(trig + i));
            const Acc x1 = acc(x(base + i)), x2 = acc(x(base + i + half));
            x(base + i) = static_cast<T>(x1 * c - x2 * s);
            x(base + i + half) = static_cast<T>(x2 * c + x1 * s);
          }
        });
  } else if (half % 8 == 0 &&
             detail::packable<T>(std::size_t(N * row_len), {x.data(), x.data() + half})) {
    // 16-bit with half a head a multiple of 8 (head sizes 16, 32, ... 128): eight pairs per
    // thread, each half-head read and written as one 16-byte pack (pack8.hpp; the scalar form
    // below moved ~1 TB/s on an H200). The table's eight cos and sin come from L2.
    const int half8 = half / 8;
    detail::Pack8<T>* xp = reinterpret_cast<detail::Pack8<T>*>(x.data());
    Kokkos::parallel_for(
        label, detail::Range(exec, 0, N * H * half8), KOKKOS_LAMBDA(Index k) {
          const int i8 = int(k % half8);
          const Index rh = k / half8;
          const Index row = rh / H;
          const int h = int(rh % H);
          const Index p1 = (row * row_len + Index(h) * HS) / 8 + i8, p2 = p1 + half8;
          const Index trig = Index(row % Tseq) * half + Index(i8) * 8;
          const detail::Pack8<T> a = xp[p1], b = xp[p2];
          detail::Pack8<T> ra, rb;
          for (int e = 0; e < 8; ++e) {
            const Acc c = cs(trig + e), s = sg * Acc(sn(trig + e));
            const Acc x1 = acc(a.v[e]), x2 = acc(b.v[e]);
            ra.v[e] = static_cast<T>(x1 * c - x2 * s);
            rb.v[e] = static_cast<T>(x2 * c + x1 * s);
          }
          xp[p1] = ra;
          xp[p2] = rb;
        });
  } else {
    Kokkos::parallel_for(
        label, detail::Range(exec, 0, N * H * half), KOKKOS_LAMBDA(Index k) {
          const int i = int(k % half);
          const Index rh = k / half;
          const Index row = rh / H;
          const int h = int(rh % H);
          const Index base = row * row_len + Index(h) * HS;
          const Index trig = Index(row % Tseq) * half + i;
          const Acc c = cs(trig), s = sg * Acc(sn(trig));
          const Acc x1 = acc(x(base + i)), x2 = acc(x(base + i + half));
          x(base + i) = static_cast<T>(x1 * c - x2 * s);
          x(base + i + half) = static_cast<T>(x2 * c + x1 * s);
        });
  }
}

}  // namespace

template <class T>
void rotary_forward(const ExecSpace& exec, View1<T> qkv, const RopeTable& table, int B, int Tseq,
                    int NH, int NKV) {
  rotate<T>("meshtrain::rotary_forward", exec, qkv, table, B, Tseq, NH, NKV, 1.0f);
}

template <class T>
void rotary_backward(const ExecSpace& exec, View1<T> dqkv, const RopeTable& table, int B,
                     int Tseq, int NH, int NKV) {
  rotate<T>("meshtrain::rotary_backward", exec, dqkv, table, B, Tseq, NH, NKV, -1.0f);
}

#define MESHTRAIN_INSTANTIATE_ROTARY(T)                                                       \
  template void rotary_forward<T>(const ExecSpace&, View1<T>, const RopeTable&, int, int, int, \
                                  int);                                                        \
  template void rotary_backward<T>(const ExecSpace&, View1<T>, const RopeTable&, int, int,     \
                                   int, int);
MESHTRAIN_INSTANTIATE_ROTARY(float)
MESHTRAIN_INSTANTIATE_ROTARY(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_ROTARY(bf16)
MESHTRAIN_INSTANTIATE_ROTARY(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_ROTARY

}  // namespace meshtrain::kernels
