// The one splitmix64 (core/splitmix64.hpp) against the reference generator's output, and the
// values that depend on it pinned as the code produced them before its copies were merged:
// parameter-init bits, the data order's permutation and windows, checkpoint checksum terms.
// A change to any of these changes training runs and invalidates saved checkpoints.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "harness.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/core/splitmix64.hpp"
#include "meshtrain/io/checkpoint.hpp"
#include "meshtrain/io/dataset.hpp"
#include "meshtrain/io/token_shard.hpp"

using namespace meshtrain;

// Vigna's splitmix64.c seeded with 1234567 (the sequence its test prints).
static_assert(splitmix64(1234567) == 6457827717110365317ULL);

TEST_CASE("splitmix64 reproduces the reference generator", "[rng][splitmix64]") {
  const std::uint64_t want[] = {6457827717110365317ULL, 3203168211198807973ULL,
                                9817491932198370423ULL, 4593380528125082431ULL,
                                16408922859458223821ULL};
  std::uint64_t state = 1234567;
  for (std::uint64_t w : want) {
    REQUIRE(splitmix64(state) == w);
    state += kSplitmix64Gamma;
  }
  REQUIRE(splitmix64_mix(0) == 0);  // the mixer alone: a bijection fixing 0
  REQUIRE(splitmix64(0) == splitmix64_mix(kSplitmix64Gamma));
}

TEST_CASE("values derived from splitmix64 are the ones saved runs and checkpoints hold",
          "[rng][splitmix64]") {
  // Counter-based parameter-init bits, uniforms and normals (DESIGN invariant 2).
  REQUIRE(rng::bits(0, 0, 0) == 0x238275bc38fcbe91ULL);
  REQUIRE(rng::bits(11, rng::name_stream("transformer.h.0.attn.c_attn.weight"), 12345) ==
          0x18bb6b1da1e7510dULL);
  REQUIRE(rng::bits(~0ULL, 7, 1ULL << 40) == 0x76d7c9de1a37a1d9ULL);
  REQUIRE(rng::uniform(1, 2, 3) == 0x1.cde3394af17a5p-1);
  REQUIRE(rng::uniform(42, rng::name_stream("generate"), 17) == 0x1.542c5a8e596f9p-1);
  REQUIRE(rng::normal(11, rng::name_stream("transformer.wte.weight"), 0) ==
          mt_test::Approx(0x1.883aa90cbeeaep-1).epsilon(1e-15));
  REQUIRE(rng::normal(11, rng::name_stream("transformer.wte.weight"), 999) ==
          mt_test::Approx(0x1.0aa5416d16bbep+0).epsilon(1e-15));
  // The data order (DESIGN invariant 3): the epoch permutation and the windows of a dataset.
  const std::uint64_t perm[] = {533, 496, 800, 323, 629};
  const std::uint64_t at[] = {0, 1, 2, 500, 999};
  for (int i = 0; i < 5; ++i) REQUIRE(io::keyed_permutation(at[i], 1000, 7) == perm[i]);
  const std::uint64_t big = (1ULL << 40) + 3;
  REQUIRE(io::keyed_permutation(0, big, 11) == 618412010494ULL);
  REQUIRE(io::keyed_permutation(1, big, 11) == 710621371479ULL);
  REQUIRE(io::keyed_permutation(big - 1, big, 11) == 323523546625ULL);
  const std::string shard = "test_splitmix64_" + std::to_string(mt_test::world_rank()) + ".bin";
  std::vector<std::uint16_t> tokens(500);
  for (int i = 0; i < 500; ++i) tokens[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(i);
  io::write_shard(shard, tokens);
  {
    io::TokenDataset ds(shard, 4);  // 100 windows of 5 tokens
    REQUIRE(ds.num_windows() == 100);
    const std::uint64_t g[] = {0, 1, 99, 100, 250}, w[] = {26, 13, 58, 99, 28};
    for (int i = 0; i < 5; ++i) REQUIRE(ds.window_of(5, g[i]) == w[i]);
  }
  std::remove(shard.c_str());
  // Checkpoint checksum terms (the `checksum` attribute of every saved tensor).
  REQUIRE(io::checksum_term(0, 0) == 0);
  REQUIRE(io::checksum_term(12345, 0x3f800000u) == 0x5b83a33c5bafae2ULL);
  REQUIRE(io::checksum_term(1ULL << 33, 0xdeadbeefu) == 0xa304f0a1d237b4faULL);
}
