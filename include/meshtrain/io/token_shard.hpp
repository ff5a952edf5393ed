#pragma once
// Token shards in llm.c's format: a header of 256 int32 (magic 20240520, version 1, token count,
// rest zero), then `count` uint16 tokens. Memory-mapped read-only.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::io {

inline constexpr std::int32_t kShardMagic = 20240520;
inline constexpr std::int32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderInts = 256;

class TokenShard {
 public:
  // Throws ConfigError naming the file (and the byte offset where relevant) for: missing file,
  // short header, wrong magic or version, a size that does not match the token count.
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(TokenShard&&) noexcept;
  TokenShard& operator=(TokenShard&&) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  std::size_t size() const { return count_; }
  const std::uint16_t* data() const { return tokens_; }
  std::uint16_t operator[](std::size_t i) const { return tokens_[i]; }

  // Throws ConfigError naming the file and the token's byte offset if any token >= vocab_size.
  void check_vocab(int vocab_size) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const std::uint16_t* tokens_ = nullptr;
  std::size_t count_ = 0;
};

// Writes a shard (used by `meshtrain prep` and tests).
void write_shard(const std::string& path, const std::vector<std::uint16_t>& tokens);

}  // namespace meshtrain::io
