// Checkpoint pieces without files: ranges of the flat buffer as pieces, their global rectangles
// in HDF5's transfer order, coverage of every global element once, and the layout-free checksum.
#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "checkpoint_fixture.hpp"
#include "harness.hpp"

using namespace meshtrain;
using namespace ckpt_test;
using io::Block;
using io::TensorPiece;

namespace {

// The global row-major indices of a piece's blocks, sorted: the order in which HDF5 transfers a
// union of hyperslabs.
std::vector<std::int64_t> block_elements(const TensorPiece& pc) {
  const auto& p = *pc.param;
  const std::int64_t gcols = p.global_shape.size() == 2 ? p.global_shape[1] : p.global_shape[0];
  std::vector<std::int64_t> out;
  for (const Block& b : io::global_blocks(pc)) {
    REQUIRE(b.rows >= 1);
    REQUIRE(b.cols >= 1);
    for (std::int64_t r = b.row0; r < b.row0 + b.rows; ++r)
      for (std::int64_t c = b.col0; c < b.col0 + b.cols; ++c) out.push_back(r * gcols + c);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Cut points of [0, n): k even parts, shifted so that they fall inside tensors and rows.
std::vector<std::size_t> cuts(std::size_t n, int k, std::size_t shift) {
  std::vector<std::size_t> c;
  for (int i = 0; i <= k; ++i) c.push_back(i == 0 ? 0 : i == k ? n : std::min(n, n * i / k + shift));
  return c;
}

}  // namespace

TEST_CASE("pieces_for_range cuts the flat buffer at parameter boundaries", "[io][checkpoint]") {
  const GptConfig cfg = tiny_config();
  const ParameterRegistry reg(cfg, 1, 2, 0, 0, cfg.n_layer, true, true);
  const auto all = io::pieces_for_range(reg, 0, reg.size(), false);
  REQUIRE(all.size() == reg.params().size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    REQUIRE(all[i].param == &reg.params()[i]);
    REQUIRE(all[i].local_begin == 0);
    REQUIRE(all[i].count == reg.params()[i].numel);
    REQUIRE(all[i].primary == reg.counts_in_norm(reg.params()[i]));  // tp rank 1: replicas not
  }
  const auto dedup = io::pieces_for_range(reg, 0, reg.size(), true);
  for (const auto& pc : dedup) REQUIRE(pc.param->split != model::Split::replicated);

  // A range starting inside wte's alignment gap and ending inside the first block.
  const auto& wpe = reg.get("transformer.wpe.weight");
  const auto& attn = reg.get("transformer.h.0.attn.c_attn.weight");
  const auto some = io::pieces_for_range(reg, wpe.offset + 5, attn.offset + 7, false);
  REQUIRE(some.size() == 2);
  REQUIRE(some[0].param == &wpe);
  REQUIRE(some[0].local_begin == 5);
  REQUIRE(some[0].count == wpe.numel - 5);
  REQUIRE(some[1].param == &attn);
  REQUIRE(some[1].count == 7);
  REQUIRE(io::pieces_for_range(reg, wpe.offset + wpe.numel, wpe.offset + wpe.numel, false).empty());

  // The tied copy of wte on a last stage without the embedding is not primary.
  const ParameterRegistry last(cfg, 0, 1, 1, 2, 4, false, true);
  const auto lp = io::pieces_for_range(last, 0, last.size(), false);
  REQUIRE(lp[0].param->name == "transformer.wte.weight");
  REQUIRE_FALSE(lp[0].primary);
  REQUIRE(io::pieces_for_range(last, 0, last.size(), true)[0].param->name != "transformer.wte.weight");
}

TEST_CASE("global blocks of a piece are its elements in local order", "[io][checkpoint]") {
  const GptConfig cfg = tiny_config();
  for (int tp : {1, 2, 4})
    for (int r = 0; r < tp; ++r) {
      const ParameterRegistry reg(cfg, r, tp, 0, 0, cfg.n_layer, true, true);
      for (int k : {1, 3, 7, 16})
        for (std::size_t shift : {std::size_t{0}, std::size_t{13}}) {
          const auto c = cuts(reg.size(), k, shift);
          for (int part = 0; part < k; ++part)
            for (const auto& pc : io::pieces_for_range(reg, c[part], c[part + 1], false)) {
              std::vector<std::int64_t> local;
              for (std::size_t j = 0; j < pc.count; ++j)
                local.push_back(pc.param->global_index(
                    static_cast<std::int64_t>(pc.local_begin + j), r, tp));
              INFO(pc.param->name << " tp " << r << "/" << tp << " [" << pc.local_begin << ", +"
                                  << pc.count << ")");
              // Row-major order of the selected global elements == local order.
              REQUIRE(block_elements(pc) == local);
              REQUIRE(io::global_blocks(pc).size() <= 9);  // 3 row ranges x (q, k, v)
            }
        }
    }
}

TEST_CASE("dedup pieces of data-parallel partitions cover every element once",
          "[io][checkpoint]") {
  const GptConfig cfg = tiny_config();
  const ParameterRegistry full(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  for (const Layout L : {Layout{1, 1, 1}, Layout{2, 1, 2}, Layout{1, 2, 2}, Layout{3, 2, 1},
                         Layout{2, 2, 4}, Layout{1, 4, 4}}) {
    std::map<std::string, std::vector<int>> seen;
    for (const auto& p : full.params())
      seen[p.name].assign(static_cast<std::size_t>(p.global_numel()), 0);
    for (int rank = 0; rank < L.dp * L.pp * L.tp; ++rank) {
      const RankView v = rank_view(cfg, L, rank);
      for (const auto& pc : io::pieces_for_range(*v.reg, v.part_lo(), v.part_hi(), true))
        for (const Block& b : io::global_blocks(pc)) {
          const auto& p = *pc.param;
          const std::int64_t gcols = p.global_shape.size() == 2 ? p.global_shape[1] : p.global_shape[0];
          for (std::int64_t r = b.row0; r < b.row0 + b.rows; ++r)
            for (std::int64_t c = b.col0; c < b.col0 + b.cols; ++c)
              ++seen[p.name][static_cast<std::size_t>(r * gcols + c)];
        }
    }
    for (const auto& [name, counts] : seen) {
      INFO("layout dp " << L.dp << " pp " << L.pp << " tp " << L.tp << ": " << name);
      REQUIRE(std::all_of(counts.begin(), counts.end(), [](int x) { return x == 1; }));
    }
  }
}

TEST_CASE("the checksum does not depend on the layout and sees every flipped byte",
          "[io][checkpoint]") {
  const GptConfig cfg = tiny_config();
  const ParameterRegistry full(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  const RankView whole = rank_view(cfg, Layout{1, 1, 1}, 0);
  std::vector<float> buf = filled_buffer(whole, "model");
  std::map<std::string, std::uint64_t> reference;
  for (const auto& pc : io::pieces_for_range(full, 0, full.size(), true)) {
    std::uint64_t naive = 0;
    for (std::size_t j = 0; j < pc.count; ++j) {
      std::uint32_t bits;
      std::memcpy(&bits, &buf[pc.flat_offset() + j], 4);
      naive += io::checksum_term(static_cast<std::uint64_t>(pc.local_begin + j), bits);
    }
    reference[pc.param->name] = io::piece_checksum(pc, buf.data() + pc.flat_offset());
    REQUIRE(reference[pc.param->name] == naive);
  }
  // Sums over the pieces of a (dp 3, pp 2, tp 2) layout give the same per-tensor checksums.
  const Layout L{3, 2, 2};
  std::map<std::string, std::uint64_t> sums;
  for (int rank = 0; rank < 12; ++rank) {
    const RankView v = rank_view(cfg, L, rank);
    const std::vector<float> b = filled_buffer(v, "model");
    for (const auto& pc : io::pieces_for_range(*v.reg, v.part_lo(), v.part_hi(), true))
      sums[pc.param->name] += io::piece_checksum(pc, b.data() + pc.flat_offset());
  }
  REQUIRE(sums == reference);

  // Any change of any single byte changes the tensor's checksum (the term is a bijection of the
  // bits); here: each byte of a few elements, and swapping two values.
  const auto pcs = io::pieces_for_range(full, 0, full.size(), true);
  const TensorPiece& fc = pcs[4];
  const std::uint64_t before = io::piece_checksum(fc, buf.data() + fc.flat_offset());
  for (std::size_t j : {std::size_t{0}, std::size_t{17}, fc.count - 1})
    for (int byte = 0; byte < 4; ++byte) {
      float& x = buf[fc.flat_offset() + j];
      const float saved = x;
      reinterpret_cast<unsigned char*>(&x)[byte] ^= 0x10;
      REQUIRE(io::piece_checksum(fc, buf.data() + fc.flat_offset()) != before);
      x = saved;
    }
  std::swap(buf[fc.flat_offset() + 1], buf[fc.flat_offset() + 2]);
  REQUIRE(io::piece_checksum(fc, buf.data() + fc.flat_offset()) != before);
}
