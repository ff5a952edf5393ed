// Corpus input for `meshtrain prep`: mmap for plain files, zlib and libzstd streams for
// compressed ones (both from Debian: zlib1g-dev, libzstd-dev).
#include "meshtrain/io/text_input.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "meshtrain/core/error.hpp"

namespace meshtrain::io {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

constexpr std::size_t kInBytes = 1 << 18, kOutBytes = 1 << 20;

}  // namespace

Compression compression_of(std::string_view path) {
  if (ends_with(path, ".gz")) return Compression::gzip;
  if (ends_with(path, ".zst")) return Compression::zstd;
  return Compression::none;
}

bool is_json_lines_name(std::string_view path) {
  if (compression_of(path) == Compression::gzip) path.remove_suffix(3);
  else if (compression_of(path) == Compression::zstd) path.remove_suffix(4);
  return ends_with(path, ".jsonl") || ends_with(path, ".ndjson") || ends_with(path, ".json");
}

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::none: return "none";
    case Compression::gzip: return "gzip";
    case Compression::zstd: return "zstd";
  }
  return "?";
}

// ---- MappedFile ----

MappedFile::MappedFile(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw ConfigError(cat(what, ": cannot open '", path, "': ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw ConfigError(cat(what, ": cannot stat '", path, "': ", std::strerror(err)));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (m == MAP_FAILED)
      throw ConfigError(cat(what, ": cannot map '", path, "' (", size_, " bytes): ",
                            std::strerror(err)));
    ::madvise(m, size_, MADV_SEQUENTIAL);  // each rank reads its range front to back
    data_ = static_cast<const char*>(m);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<char*>(data_), size_);
}

// ---- DecompressingReader ----

struct DecompressingReader::Codec {
  z_stream z{};
  bool z_init = false, in_member = false;
  std::uint64_t members = 0;
  ZSTD_DStream* zs = nullptr;
  std::size_t zstd_last = 0;  // ZSTD_decompressStream's last hint: 0 = at a frame boundary
  std::uint64_t frames = 0;
  ~Codec() {
    if (z_init) inflateEnd(&z);
    if (zs) ZSTD_freeDStream(zs);
  }
};

DecompressingReader::DecompressingReader(const std::string& path, Compression c,
                                         const std::string& what)
    : path_(path), what_(what), kind_(c), codec_(std::make_unique<Codec>()) {
  file_ = std::fopen(path.c_str(), "rb");
  if (!file_)
    throw ConfigError(cat(what, ": cannot open '", path, "': ", std::strerror(errno)));
  in_.resize(kInBytes);
  if (c == Compression::gzip) {
    // 15 + 32: a window of 2^15 and automatic gzip / zlib header detection.
    if (inflateInit2(&codec_->z, 15 + 32) != Z_OK) {
      std::fclose(file_);
      throw Error(cat("zlib: inflateInit2 failed for '", path, "'"));
    }
    codec_->z_init = true;
  } else if (c == Compression::zstd) {
    codec_->zs = ZSTD_createDStream();
    if (!codec_->zs || ZSTD_isError(ZSTD_initDStream(codec_->zs))) {
      std::fclose(file_);
      throw Error(cat("zstd: cannot create a decompression stream for '", path, "'"));
    }
  }
  if (c != Compression::none) out_.resize(kOutBytes);
}

DecompressingReader::~DecompressingReader() {
  if (file_) std::fclose(file_);
}

void DecompressingReader::corrupt(const std::string& why) const {
  throw ConfigError(cat(what_, ": '", path_, "' is not valid ", compression_name(kind_),
                        " data: ", why, " (at byte ", consumed_ - (in_len_ - in_pos_),
                        " of the file, after ", produced_ + (out_len_ - out_pos_),
                        " bytes of text); re-download or recompress it, or leave it out"));
}

bool DecompressingReader::fill() {
  Codec& k = *codec_;
  out_pos_ = out_len_ = 0;
  while (out_len_ == 0) {
    if (in_pos_ == in_len_ && !pending_) {
      if (eof_) break;
      in_len_ = std::fread(in_.data(), 1, in_.size(), file_);
      in_pos_ = 0;
      consumed_ += in_len_;
      if (in_len_ == 0) {
        if (std::ferror(file_))
          throw ConfigError(cat(what_, ": read error in '", path_, "': ", std::strerror(errno)));
        eof_ = true;
        break;
      }
    }
    if (kind_ == Compression::gzip) {
      if (!k.in_member) {  // a new gzip member (files may concatenate several)
        if (in_pos_ == in_len_) continue;
        if (k.members > 0) inflateReset(&k.z);
        k.in_member = true;
      }
      k.z.next_in = reinterpret_cast<Bytef*>(in_.data() + in_pos_);
      k.z.avail_in = static_cast<uInt>(in_len_ - in_pos_);
      k.z.next_out = reinterpret_cast<Bytef*>(out_.data());
      k.z.avail_out = static_cast<uInt>(out_.size());
      const int rc = inflate(&k.z, Z_NO_FLUSH);
      in_pos_ = in_len_ - k.z.avail_in;
      out_len_ = out_.size() - k.z.avail_out;
      pending_ = k.z.avail_out == 0;  // more output may wait without new input
      if (rc == Z_STREAM_END) {
        k.in_member = false;
        ++k.members;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        corrupt(k.z.msg ? k.z.msg : cat("zlib error ", rc));
      }
    } else {
      ZSTD_inBuffer in{in_.data(), in_len_, in_pos_};
      ZSTD_outBuffer out{out_.data(), out_.size(), 0};
      const std::size_t rc = ZSTD_decompressStream(k.zs, &out, &in);
      if (ZSTD_isError(rc)) corrupt(ZSTD_getErrorName(rc));
      in_pos_ = in.pos;
      out_len_ = out.pos;
      pending_ = out.pos == out.size;
      k.zstd_last = rc;
      if (rc == 0) ++k.frames;
    }
  }
  if (out_len_ > 0) return true;
  // The end of the file: the stream must have ended at a member / frame boundary.
  if (kind_ == Compression::gzip && (k.in_member || k.members == 0))
    corrupt(k.members == 0 && consumed_ == 0 ? "the file is empty"
                                             : "the stream ends inside a gzip member "
                                               "(the file is truncated)");
  if (kind_ == Compression::zstd && (k.zstd_last != 0 || k.frames == 0))
    corrupt(k.frames == 0 && consumed_ == 0 ? "the file is empty"
                                            : "the stream ends inside a zstd frame "
                                              "(the file is truncated)");
  return false;
}

std::size_t DecompressingReader::read(char* buf, std::size_t n) {
  if (kind_ == Compression::none) {
    const std::size_t got = std::fread(buf, 1, n, file_);
    if (got < n && std::ferror(file_))
      throw ConfigError(cat(what_, ": read error in '", path_, "': ", std::strerror(errno)));
    consumed_ += got;
    produced_ += got;
    return got;
  }
  std::size_t done = 0;
  while (done < n) {
    if (out_pos_ == out_len_ && !fill()) break;
    const std::size_t m = std::min(n - done, out_len_ - out_pos_);
    std::memcpy(buf + done, out_.data() + out_pos_, m);
    out_pos_ += m;
    done += m;
    produced_ += m;
  }
  return done;
}

// ---- lines ----

bool LineReader::next(std::string_view& line) {
  for (;;) {
    const std::size_t nl = buf_.find('\n', std::max(pos_, scan_));
    if (nl != std::string::npos) {
      line = std::string_view(buf_).substr(pos_, nl - pos_);
      pos_ = scan_ = nl + 1;
      return true;
    }
    if (end_) {
      if (pos_ >= buf_.size()) return false;
      line = std::string_view(buf_).substr(pos_);
      pos_ = buf_.size();
      return true;
    }
    // Keep the partial line, read more behind it (a long line grows the buffer).
    buf_.erase(0, pos_);
    pos_ = 0;
    const std::size_t have = buf_.size();
    scan_ = have;
    buf_.resize(have + kOutBytes);
    const std::size_t got = r_.read(buf_.data() + have, kOutBytes);
    buf_.resize(have + got);
    if (got == 0) end_ = true;
  }
}

std::string read_all(DecompressingReader& r) {
  std::string s;
  for (;;) {
    const std::size_t have = s.size();
    s.resize(have + kOutBytes);
    const std::size_t got = r.read(s.data() + have, kOutBytes);
    s.resize(have + got);
    if (got == 0) return s;
  }
}

}  // namespace meshtrain::io
