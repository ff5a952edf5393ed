// llm.c token shards: round trip, and every malformed file names itself and the offending value.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "io_test_util.hpp"
#include "meshtrain/io/token_shard.hpp"

using namespace meshtrain::io;
using io_test::config_error;
using io_test::has;

namespace {

// A shard written byte by byte, so the tests can break it in chosen ways.
std::string raw_shard(std::int32_t magic, std::int32_t version, std::int32_t count,
                      const std::vector<std::uint16_t>& tokens) {
  std::vector<std::int32_t> header(kShardHeaderInts, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string b(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  b.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return b;
}

std::vector<std::uint16_t> ramp(std::size_t n) {
  std::vector<std::uint16_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint16_t>((i * 7919u) % 65536u);
  return t;
}

}  // namespace

TEST_CASE("token shard round trip", "[io][shard]") {
  const std::string path = io_test::temp_name("shard_rt", ".bin");
  auto tokens = ramp(5000);
  tokens[0] = 0;
  tokens[1] = 65535;
  write_shard(path, tokens);
  REQUIRE(std::filesystem::file_size(path) == 1024 + 2 * tokens.size());
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
  TokenShard s(path);
  REQUIRE(s.path() == path);
  REQUIRE(s.size() == tokens.size());
  REQUIRE(std::vector<std::uint16_t>(s.data(), s.data() + s.size()) == tokens);
  REQUIRE(s[1] == 65535);
  s.check_vocab(65536);

  // Moves keep the mapping alive exactly once (shards live in a std::vector in the dataset).
  std::vector<TokenShard> v;
  v.push_back(std::move(s));
  v.emplace_back(path);
  REQUIRE(v[0].size() == tokens.size());
  REQUIRE(v[1][4999] == tokens[4999]);
  v[0] = std::move(v[1]);
  REQUIRE(v[0][4999] == tokens[4999]);

  write_shard(path, {});  // an empty shard is valid
  REQUIRE(TokenShard(path).size() == 0);
  std::remove(path.c_str());
}

TEST_CASE("malformed shards are rejected with the file and the value", "[io][shard]") {
  const std::string path = io_test::temp_name("shard_bad", ".bin");
  const auto tokens = ramp(100);

  std::string w = config_error([&] { TokenShard s("no/such/shard.bin"); });
  INFO(w);
  REQUIRE(has(w, "'no/such/shard.bin' cannot be opened"));

  io_test::write_file(path, std::string(100, '\0'));
  w = config_error([&] { TokenShard s(path); });
  INFO(w);
  REQUIRE(has(w, path));
  REQUIRE(has(w, "is 100 bytes, shorter than the 1024-byte header"));

  const std::string good = raw_shard(kShardMagic, kShardVersion, 100, tokens);
  io_test::write_file(path, good.substr(0, 1024 + 150));  // truncated mid-way
  w = config_error([&] { TokenShard s(path); });
  INFO(w);
  REQUIRE(has(w, path));
  REQUIRE(has(w, "is 1174 bytes but its header promises 100 tokens = 1224 bytes"));
  REQUIRE(has(w, "truncated"));

  io_test::write_file(path, good + "xx");
  w = config_error([&] { TokenShard s(path); });
  INFO(w);
  REQUIRE(has(w, "1226 bytes"));
  REQUIRE(has(w, "trailing data"));

  io_test::write_file(path, raw_shard(12345, kShardVersion, 100, tokens));
  w = config_error([&] { TokenShard s(path); });
  INFO(w);
  REQUIRE(has(w, path));
  REQUIRE(has(w, "magic number at byte 0 is 12345, expected 20240520"));

  io_test::write_file(path, raw_shard(kShardMagic, 2, 100, tokens));
  w = config_error([&] { TokenShard s(path); });
  INFO(w);
  REQUIRE(has(w, path));
  REQUIRE(has(w, "version at byte 4 is 2, expected 1"));

  io_test::write_file(path, raw_shard(kShardMagic, kShardVersion, -5, {}));
  REQUIRE(has(config_error([&] { TokenShard s(path); }), "negative"));
  std::remove(path.c_str());
}

TEST_CASE("tokens outside the vocabulary are reported with their byte offset", "[io][shard]") {
  const std::string path = io_test::temp_name("shard_vocab", ".bin");
  write_shard(path, {1, 2, 300, 4, 255});
  TokenShard s(path);
  s.check_vocab(301);
  const std::string w = config_error([&] { s.check_vocab(256); });
  INFO(w);
  REQUIRE(has(w, path));
  REQUIRE(has(w, "token 300 at byte offset 1028 (token index 2)"));
  REQUIRE(has(w, ">= the model's vocab size 256"));
  std::remove(path.c_str());
}
