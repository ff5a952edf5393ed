// llm.c token shards, memory-mapped: the page cache holds each shard once however many ranks on a
// node read it, and opening a 100M-token shard costs nothing until its pages are touched.
#include "meshtrain/io/token_shard.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "meshtrain/core/error.hpp"

namespace meshtrain::io {

// The format is little-endian on disk and read in place, so a big-endian host would need byte
// swaps; no machine we target is one.
static_assert(std::endian::native == std::endian::little, "token shards are read in place");

namespace {

constexpr std::size_t kHeaderBytes = kShardHeaderInts * sizeof(std::int32_t);

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

TokenShard::TokenShard(const std::string& path) : path_(path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0)
    throw ConfigError(cat("token shard '", path, "' cannot be opened: ", std::strerror(errno),
                          " (run `meshtrain prep` to make shards)"));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0)
    throw ConfigError(cat("token shard '", path, "': stat failed: ", std::strerror(errno)));
  const auto bytes = static_cast<std::size_t>(st.st_size);
  if (bytes < kHeaderBytes)
    throw ConfigError(cat("token shard '", path, "' is ", bytes, " bytes, shorter than the ",
                          kHeaderBytes, "-byte header: not a shard, or truncated"));
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, f.fd, 0);
  if (m == MAP_FAILED)
    throw ConfigError(cat("token shard '", path, "': mmap of ", bytes,
                          " bytes failed: ", std::strerror(errno)));
  map_ = m;
  map_bytes_ = bytes;
  // From here on the destructor would not run if we threw, so unmap on failure by hand.
  auto fail = [&](const std::string& msg) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw ConfigError(msg);
  };
  std::int32_t header[3];
  std::memcpy(header, m, sizeof header);
  if (header[0] != kShardMagic)
    fail(cat("token shard '", path, "': magic number at byte 0 is ", header[0], ", expected ",
             kShardMagic, " (not an llm.c token shard)"));
  if (header[1] != kShardVersion)
    fail(cat("token shard '", path, "': version at byte 4 is ", header[1], ", expected ",
             kShardVersion, " (uint16 tokens)"));
  if (header[2] < 0)
    fail(cat("token shard '", path, "': token count at byte 8 is negative (", header[2], ")"));
  count_ = static_cast<std::size_t>(header[2]);
  const std::size_t expected = kHeaderBytes + count_ * sizeof(std::uint16_t);
  if (bytes != expected)
    fail(cat("token shard '", path, "' is ", bytes, " bytes but its header promises ", count_,
             " tokens = ", expected, " bytes: ",
             bytes < expected ? "the file is truncated" : "the file has trailing data",
             "; remake it with `meshtrain prep`"));
  tokens_ = reinterpret_cast<const std::uint16_t*>(static_cast<const char*>(m) + kHeaderBytes);
  // Training reads windows in a shuffled order; tell the kernel not to read ahead.
  ::madvise(map_, map_bytes_, MADV_RANDOM);
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(map_, map_bytes_);
}

TokenShard::TokenShard(TokenShard&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)),
      tokens_(std::exchange(o.tokens_, nullptr)),
      count_(std::exchange(o.count_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    tokens_ = std::exchange(o.tokens_, nullptr);
    count_ = std::exchange(o.count_, 0);
  }
  return *this;
}

void TokenShard::check_vocab(int vocab_size) const {
  for (std::size_t i = 0; i < count_; ++i) {
    if (tokens_[i] >= vocab_size)
      throw ConfigError(cat("token shard '", path_, "': token ", tokens_[i], " at byte offset ",
                            kHeaderBytes + i * sizeof(std::uint16_t), " (token index ", i,
                            ") is >= the model's vocab size ", vocab_size,
                            "; the shard was made with a different tokenizer"));
  }
}

void write_shard(const std::string& path, const std::vector<std::uint16_t>& tokens) {
  if (tokens.size() > static_cast<std::size_t>(INT32_MAX))
    throw ConfigError(cat("token shard '", path, "': ", tokens.size(),
                          " tokens do not fit the int32 count of the header; use smaller shards"));
  std::int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<std::int32_t>(tokens.size());
  // Written beside the target and renamed, so a reader never maps a half-written shard.
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f)
    throw ConfigError(cat("token shard '", tmp, "' cannot be created: ", std::strerror(errno)));
  bool ok = std::fwrite(header, sizeof header, 1, f) == 1;
  if (ok && !tokens.empty())
    ok = std::fwrite(tokens.data(), sizeof(std::uint16_t), tokens.size(), f) == tokens.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw ConfigError(cat("token shard '", tmp, "': write failed: ", std::strerror(err)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw ConfigError(cat("token shard '", path, "': rename from ", tmp, " failed: ",
                          std::strerror(err)));
  }
}

namespace {

// Writes `bytes` at `offset` of an open file, looping over short writes.
bool pwrite_all(int fd, const void* data, std::size_t bytes, std::size_t offset) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t w = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    bytes -= static_cast<std::size_t>(w);
    offset += static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace

void create_shard_file(const std::string& path, std::size_t count) {
  if (count > static_cast<std::size_t>(INT32_MAX))
    throw ConfigError(cat("token shard '", path, "': ", count,
                          " tokens do not fit the int32 count of the header; use smaller shards"));
  std::int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<std::int32_t>(count);
  Fd f;
  f.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0)
    throw ConfigError(cat("token shard '", path, "' cannot be created: ", std::strerror(errno)));
  if (!pwrite_all(f.fd, header, sizeof header, 0) ||
      ::ftruncate(f.fd, static_cast<off_t>(kHeaderBytes + count * sizeof(std::uint16_t))) != 0)
    throw ConfigError(cat("token shard '", path, "': write failed: ", std::strerror(errno)));
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0)
    throw ConfigError(cat("token shard '", path, "': close failed: ", std::strerror(errno)));
}

void write_shard_tokens(const std::string& path, std::size_t offset, const std::uint16_t* tokens,
                        std::size_t n) {
  Fd f;
  f.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (f.fd < 0)
    throw ConfigError(cat("token shard '", path, "' cannot be opened for writing: ",
                          std::strerror(errno)));
  if (!pwrite_all(f.fd, tokens, n * sizeof(std::uint16_t),
                  kHeaderBytes + offset * sizeof(std::uint16_t)))
    throw ConfigError(cat("token shard '", path, "': write of tokens [", offset, ", ", offset + n,
                          ") failed: ", std::strerror(errno)));
  const int fd = f.fd;
  f.fd = -1;
  // close() reports what a network file system could not write back.
  if (::close(fd) != 0)
    throw ConfigError(cat("token shard '", path, "': close failed: ", std::strerror(errno)));
}

std::string doc_index_path(const std::string& shard_path) {
  const std::string bin = ".bin";
  std::string stem = shard_path;
  if (stem.size() >= bin.size() && stem.compare(stem.size() - bin.size(), bin.size(), bin) == 0)
    stem.resize(stem.size() - bin.size());
  return stem + ".docs";
}

void write_doc_index(const std::string& path, const DocIndex& index) {
  if (index.shard_tokens > static_cast<std::size_t>(INT32_MAX) ||
      index.starts.size() > static_cast<std::size_t>(INT32_MAX))
    throw ConfigError(cat("document index '", path, "': counts do not fit the int32 header"));
  std::int32_t header[kShardHeaderInts] = {};
  header[0] = kDocIndexMagic;
  header[1] = kDocIndexVersion;
  header[2] = static_cast<std::int32_t>(index.starts.size());
  header[3] = static_cast<std::int32_t>(index.shard_tokens);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f)
    throw ConfigError(cat("document index '", path, "' cannot be created: ", std::strerror(errno)));
  bool ok = std::fwrite(header, sizeof header, 1, f) == 1;
  if (ok && !index.starts.empty())
    ok = std::fwrite(index.starts.data(), sizeof(std::uint32_t), index.starts.size(), f) ==
         index.starts.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw ConfigError(cat("document index '", path, "': write failed: ", std::strerror(errno)));
}

DocIndex read_doc_index(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f)
    throw ConfigError(cat("document index '", path, "' cannot be opened: ", std::strerror(errno)));
  std::int32_t header[kShardHeaderInts] = {};
  DocIndex d;
  const bool head = std::fread(header, sizeof header, 1, f) == 1;
  std::string bad;
  if (!head) bad = "shorter than its 1024-byte header";
  else if (header[0] != kDocIndexMagic) bad = cat("magic number ", header[0], ", expected ", kDocIndexMagic);
  else if (header[1] != kDocIndexVersion) bad = cat("version ", header[1], ", expected ", kDocIndexVersion);
  else if (header[2] < 0 || header[3] < 0) bad = "negative counts in the header";
  if (bad.empty()) {
    d.shard_tokens = static_cast<std::size_t>(header[3]);
    d.starts.resize(static_cast<std::size_t>(header[2]));
    if (!d.starts.empty() &&
        std::fread(d.starts.data(), sizeof(std::uint32_t), d.starts.size(), f) != d.starts.size())
      bad = cat("the file holds fewer than the ", d.starts.size(), " offsets its header promises");
    else if (std::fgetc(f) != EOF)
      bad = "trailing data after the offsets";
  }
  std::fclose(f);
  for (std::size_t i = 0; bad.empty() && i < d.starts.size(); ++i)
    if (d.starts[i] >= d.shard_tokens || (i > 0 && d.starts[i] <= d.starts[i - 1]))
      bad = cat("offset ", i, " (", d.starts[i], ") is not increasing within the shard's ",
                d.shard_tokens, " tokens");
  if (!bad.empty()) throw ConfigError(cat("document index '", path, "': ", bad));
  return d;
}

}  // namespace meshtrain::io
