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

// A shard written in pieces, by several processes (`meshtrain prep` over MPI ranks):
// create_shard_file writes the header and sizes the file for `count` tokens (zeros); then
// write_shard_tokens puts tokens [offset, offset + n) of it in place (pwrite, any process, any
// order). ConfigError naming the file for anything that fails.
void create_shard_file(const std::string& path, std::size_t count);
void write_shard_tokens(const std::string& path, std::size_t offset, const std::uint16_t* tokens,
                        std::size_t n);

// Document index of a shard (`meshtrain prep --prep.doc_index`): `<shard without .bin>.docs`,
// a header of 256 int32 (magic 20260601, version 1, document count D, the shard's token count,
// rest zero), then D uint32 token offsets into the shard, strictly increasing: where each
// document that starts in this shard starts (at its BOS / separator token where the document
// has one). A shard whose offset 0 is not listed begins inside a document of the shard before
// it. Documents that produced no tokens are not listed.
inline constexpr std::int32_t kDocIndexMagic = 20260601;
inline constexpr std::int32_t kDocIndexVersion = 1;
struct DocIndex {
  std::size_t shard_tokens = 0;
  std::vector<std::uint32_t> starts;
};
std::string doc_index_path(const std::string& shard_path);
void write_doc_index(const std::string& path, const DocIndex& index);
// ConfigError naming the file for a bad header, size or order.
DocIndex read_doc_index(const std::string& path);

}  // namespace meshtrain::io
