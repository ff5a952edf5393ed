// Which global elements a rank holds: pieces of the flat buffer, their rectangles in the global
// tensors and the layout-free checksum. Pure functions; no MPI, no HDF5.
#include <algorithm>
#include <cstring>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/splitmix64.hpp"
#include "meshtrain/io/checkpoint.hpp"

namespace meshtrain::io {

using model::Split;

std::vector<TensorPiece> pieces_for_range(const model::ParameterRegistry& reg,
                                          std::size_t flat_lo, std::size_t flat_hi, bool dedup) {
  MESHTRAIN_CHECK(flat_lo <= flat_hi && flat_hi <= reg.size(), "pieces_for_range: range [",
                  flat_lo, ", ", flat_hi, ") is not inside the flat buffer of ", reg.size(),
                  " elements");
  std::vector<TensorPiece> out;
  for (const auto& p : reg.params()) {
    const std::size_t lo = std::max(flat_lo, p.offset), hi = std::min(flat_hi, p.offset + p.numel);
    if (lo >= hi) continue;
    const bool primary = reg.counts_in_norm(p);
    if (dedup && !primary) continue;
    out.push_back(TensorPiece{&p, reg.tp_rank(), reg.tp_size(), lo - p.offset, hi - lo, primary});
  }
  return out;
}

namespace {

// A run of consecutive local columns [lcol, lcol + len) of the slice that are consecutive global
// columns starting at gcol.
struct Segment {
  std::int64_t lcol, gcol, len;
};

struct Geometry {
  bool matrix;
  std::int64_t lrows, lcols, gcols;
};

Geometry geometry(const TensorPiece& pc) {
  const auto& p = *pc.param;
  const bool matrix = p.local_shape.size() == 2;
  MESHTRAIN_CHECK(p.local_shape.size() == 1 || matrix, "checkpoint: ", p.name, " has ",
                  p.local_shape.size(), " dimensions; only 1-D and 2-D tensors are supported");
  return {matrix, matrix ? p.local_shape[0] : 1, matrix ? p.local_shape[1] : p.local_shape[0],
          matrix ? p.global_shape[1] : p.global_shape[0]};
}

// Local columns [c0, c1) of a row of the slice as global column runs. A 1-D tensor is one row,
// so its split (whatever the Split says about rows) is a column split.
void segments(const TensorPiece& pc, const Geometry& g, std::int64_t c0, std::int64_t c1,
              std::vector<Segment>& out) {
  out.clear();
  const Split s = pc.param->split;
  if (s == Split::replicated || (s == Split::rows && g.matrix)) {
    out.push_back({c0, c0, c1 - c0});
  } else if (s == Split::cols || s == Split::rows) {
    out.push_back({c0, pc.tp_rank * g.lcols + c0, c1 - c0});
  } else {  // qkv_cols: each third of the columns (q, k, v) is split by heads
    const std::int64_t part = g.lcols / 3, gpart = g.gcols / 3;
    for (std::int64_t c = c0; c < c1;) {
      const std::int64_t which = c / part, end = std::min(c1, (which + 1) * part);
      out.push_back({c, which * gpart + pc.tp_rank * part + c % part, end - c});
      c = end;
    }
  }
}

// Local rectangles of the piece: a partial first row, whole rows, a partial last row.
std::vector<Block> local_rects(const TensorPiece& pc, const Geometry& g) {
  std::vector<Block> r;
  std::int64_t b = static_cast<std::int64_t>(pc.local_begin);
  const std::int64_t e = b + static_cast<std::int64_t>(pc.count);
  if (b >= e) return r;
  if (b % g.lcols != 0 || e - b < g.lcols) {
    const std::int64_t c0 = b % g.lcols, c1 = std::min(g.lcols, c0 + (e - b));
    r.push_back({b / g.lcols, c0, 1, c1 - c0});
    b += c1 - c0;
  }
  if (e - b >= g.lcols) {
    const std::int64_t n = (e - b) / g.lcols;
    r.push_back({b / g.lcols, 0, n, g.lcols});
    b += n * g.lcols;
  }
  if (b < e) r.push_back({b / g.lcols, 0, 1, e - b});
  return r;
}

std::int64_t global_row0(const TensorPiece& pc, const Geometry& g, std::int64_t lrow) {
  return pc.param->split == Split::rows && g.matrix ? pc.tp_rank * g.lrows + lrow : lrow;
}

void check_piece(const TensorPiece& pc) {
  MESHTRAIN_CHECK(pc.param != nullptr, "checkpoint: a TensorPiece without a parameter");
  MESHTRAIN_CHECK(pc.local_begin + pc.count <= pc.param->numel, "checkpoint: piece [",
                  pc.local_begin, ", ", pc.local_begin + pc.count, ") of ", pc.param->name,
                  " exceeds its ", pc.param->numel, " local elements");
}

// f(global_start, local_offset_in_piece, len) for each run of consecutive global indices, in
// local order.
template <class F>
void for_each_run(const TensorPiece& pc, F&& f) {
  check_piece(pc);
  const Geometry g = geometry(pc);
  std::vector<Segment> segs;
  const std::int64_t base = static_cast<std::int64_t>(pc.local_begin);
  for (const Block& r : local_rects(pc, g)) {
    segments(pc, g, r.col0, r.col0 + r.cols, segs);
    for (std::int64_t row = r.row0; row < r.row0 + r.rows; ++row) {
      const std::int64_t grow = global_row0(pc, g, row);
      for (const Segment& s : segs)
        f(grow * g.gcols + s.gcol, row * g.lcols + s.lcol - base, s.len);
    }
  }
}

// The checksum term of an element: splitmix64's mixer (a bijection of 64-bit words) of its
// global index's Weyl key (index * gamma) xor its bits.
constexpr std::uint64_t kIndexMul = kSplitmix64Gamma;

// The checksum runs over every byte a checkpoint saves or loads, so it must keep up with the disk:
// with AVX2, GCC vectorises the 64-bit multiplies 4 wide (5.6 GB/s per core instead of 2.5 on
// the CI machine's EPYC). target_clones picks the variant at load time; CUDA builds (nvcc parses
// host code too) and other architectures take the portable loop.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__) && !defined(__INTEL_COMPILER)
#define MESHTRAIN_CHECKSUM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MESHTRAIN_CHECKSUM_CLONES
#endif

MESHTRAIN_CHECKSUM_CLONES
std::uint64_t run_checksum(const float* d, std::int64_t len, std::uint64_t gstart) {
  std::uint64_t key = gstart * kIndexMul, s = 0;
  for (std::int64_t k = 0; k < len; ++k, key += kIndexMul) {
    std::uint32_t bits;
    std::memcpy(&bits, d + k, 4);
    s += splitmix64_mix(key ^ bits);
  }
  return s;
}

}  // namespace

std::vector<Block> global_blocks(const TensorPiece& pc) {
  check_piece(pc);
  const Geometry g = geometry(pc);
  std::vector<Block> out;
  std::vector<Segment> segs;
  for (const Block& r : local_rects(pc, g)) {
    segments(pc, g, r.col0, r.col0 + r.cols, segs);
    for (const Segment& s : segs) out.push_back({global_row0(pc, g, r.row0), s.gcol, r.rows, s.len});
  }
  return out;
}

std::uint64_t checksum_term(std::uint64_t global_index, std::uint32_t bits) {
  return splitmix64_mix((global_index * kIndexMul) ^ bits);
}

std::uint64_t piece_checksum(const TensorPiece& pc, const float* data) {
  std::uint64_t sum = 0;
  for_each_run(pc, [&](std::int64_t gstart, std::int64_t loff, std::int64_t len) {
    sum += run_checksum(data + loff, len, static_cast<std::uint64_t>(gstart));
  });
  return sum;
}

}  // namespace meshtrain::io
