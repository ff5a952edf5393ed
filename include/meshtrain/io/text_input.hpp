#pragma once
// Reading corpus files for `meshtrain prep`: plain files are memory-mapped (a rank reads only
// the byte range it tokenises, and the page cache holds a file once per node); gzip (zlib) and
// zstd files are decompressed as a stream, front to back. Corrupt or truncated compressed data
// is a ConfigError naming the file and where in it the stream broke: a cut-off download has lost
// an unknown number of documents, so it stops the job rather than passing for a short file.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

namespace meshtrain::io {

enum class Compression { none, gzip, zstd };

// By the file name: ".gz" gzip, ".zst" zstd, anything else none.
Compression compression_of(std::string_view path);
// JSON lines by the name without its compression suffix: ".jsonl", ".ndjson" or ".json"
// (Dolma's *.json.gz hold one record per line).
bool is_json_lines_name(std::string_view path);
const char* compression_name(Compression c);

// A whole file, mapped read-only (an empty file maps to an empty view).
class MappedFile {
 public:
  // ConfigError naming `what` and the file when it cannot be opened or mapped.
  MappedFile(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view text() const { return {data_, size_}; }

 private:
  const char* data_ = nullptr;
  std::size_t size_ = 0;
};

// The bytes of a file after decompression (Compression::none: the bytes as they are).
class DecompressingReader {
 public:
  // ConfigError naming `what` and the file when it cannot be opened.
  DecompressingReader(const std::string& path, Compression c, const std::string& what);
  ~DecompressingReader();
  DecompressingReader(const DecompressingReader&) = delete;
  DecompressingReader& operator=(const DecompressingReader&) = delete;

  // Up to `n` bytes into `buf`; 0 only at the end of the data. ConfigError naming the file, the
  // compressed byte offset and the decompressor's message for corrupt data, and for a stream
  // that ends before its end marker (truncated).
  std::size_t read(char* buf, std::size_t n);
  std::uint64_t consumed() const { return consumed_; }  // bytes of the file read so far
  std::uint64_t produced() const { return produced_; }  // bytes returned so far
  const std::string& path() const { return path_; }

 private:
  bool fill();  // decodes into out_; false at the end of the data
  [[noreturn]] void corrupt(const std::string& why) const;
  std::string path_, what_;
  Compression kind_;
  std::FILE* file_ = nullptr;
  struct Codec;
  std::unique_ptr<Codec> codec_;
  std::string in_, out_;
  std::size_t in_pos_ = 0, in_len_ = 0, out_pos_ = 0, out_len_ = 0;
  std::uint64_t consumed_ = 0, produced_ = 0;
  bool eof_ = false, pending_ = false;
};

// The lines of a reader, without their '\n' (a last line without one is a line too).
class LineReader {
 public:
  explicit LineReader(DecompressingReader& r) : r_(r) {}
  // The next line, valid until the next call; false at the end.
  bool next(std::string_view& line);

 private:
  DecompressingReader& r_;
  std::string buf_;
  std::size_t pos_ = 0;   // start of the next line in buf_
  std::size_t scan_ = 0;  // buf_ before this holds no '\n' after pos_
  bool end_ = false;
};

// The whole decompressed content of a file.
std::string read_all(DecompressingReader& r);

}  // namespace meshtrain::io
