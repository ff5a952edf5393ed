#pragma once
// HuggingFace checkpoint folders as save_pretrained writes them: one model.safetensors, or
// shards model-0000N-of-0000M.safetensors listed by model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {"tensor": "shard file", ...}}).
//
// The reader opens every shard's header only and then reads slices of tensors with pread, so a
// rank can import exactly its tensor-parallel slice and no rank ever holds a whole model. The
// writer streams: tensors are appended one at a time (rank 0 receives one at a time) into shards
// of at most a given size, and the index is written at the end.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/io/safetensors.hpp"

namespace meshtrain::io {

// What slices are converted to: fp32, or bf16 bits (round to nearest even from F32; F16 via
// fp32; BF16 copied).
enum class SliceType { f32, bf16 };

class ShardedSafetensorsReader {
 public:
  // `dir`: a folder with model.safetensors.index.json (sharded) or model.safetensors. Reads the
  // index and every shard's header. ConfigError naming the file and the tensor for a shard that
  // the index names but that does not exist, a tensor that the index puts in a shard that does
  // not hold it, a tensor in two shards, and every header error of SafetensorsReader.
  explicit ShardedSafetensorsReader(const std::string& dir);
  ~ShardedSafetensorsReader();
  ShardedSafetensorsReader(const ShardedSafetensorsReader&) = delete;
  ShardedSafetensorsReader& operator=(const ShardedSafetensorsReader&) = delete;

  bool has(const std::string& name) const { return where_.count(name) > 0; }
  std::vector<std::string> names() const;
  const TensorInfo& info(const std::string& name) const;  // ConfigError naming the folder
  const std::string& file_of(const std::string& name) const;
  // ConfigError naming the file and the tensor unless the tensor exists, has this shape and a
  // floating-point dtype a slice can be read from (F32, F16, BF16).
  void expect(const std::string& name, const std::vector<std::int64_t>& shape) const;

  // Rows [r0, r1) of a 2-D tensor [R, C] (elements of a 1-D one; slabs [r0, r1) along dim 0
  // of a 3-D or higher one, C the product of the other dimensions) into out (r1 - r0) * C
  // elements: one pread per 16 MiB run. Columns [c0, c1) of every row of a 2-D tensor into out
  // [R, c1 - c0] (row-major): one pread per row, or per run of rows when the columns are all of
  // them. ConfigError naming the file and tensor for ranges outside the tensor or a dtype that
  // is not F32, F16 or BF16.
  void read_rows(const std::string& name, std::int64_t r0, std::int64_t r1, SliceType as,
                 void* out) const;
  void read_cols(const std::string& name, std::int64_t c0, std::int64_t c1, SliceType as,
                 void* out) const;
  std::vector<float> read_rows_f32(const std::string& name, std::int64_t r0, std::int64_t r1) const;
  std::vector<float> read_cols_f32(const std::string& name, std::int64_t c0, std::int64_t c1) const;

  // Bytes and pread calls so far (what the tests hold the slice readers to).
  std::uint64_t bytes_read() const { return bytes_read_; }
  std::uint64_t reads() const { return reads_; }

 private:
  struct Shard;
  struct Loc {
    std::size_t shard;
    const TensorInfo* info;
  };
  const Loc& loc(const std::string& name) const;
  void pread_at(const Shard& s, std::uint64_t offset, std::size_t n, char* buf,
                const std::string& tensor) const;
  std::string dir_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::map<std::string, Loc> where_;
  mutable std::uint64_t bytes_read_ = 0, reads_ = 0;
};

// Declared first (names, dtypes "F32" / "BF16", shapes, in write order), then appended in that
// order. Shards hold at most `max_shard_bytes` of tensor data (a larger tensor gets a shard of
// its own), as save_pretrained's max_shard_size; one shard is written as model.safetensors with
// no index, several as model-0000N-of-0000M.safetensors plus model.safetensors.index.json. Each
// file is written as <name>.tmp and renamed when finish() completes it.
class ShardedSafetensorsWriter {
 public:
  struct Tensor {
    std::string name, dtype;
    std::vector<std::int64_t> shape;
  };
  ShardedSafetensorsWriter(const std::string& dir, std::vector<Tensor> tensors,
                           std::uint64_t max_shard_bytes);
  ~ShardedSafetensorsWriter();
  ShardedSafetensorsWriter(const ShardedSafetensorsWriter&) = delete;
  ShardedSafetensorsWriter& operator=(const ShardedSafetensorsWriter&) = delete;

  // The next `count` values of the current tensor (the declared order), converted to its
  // dtype; a tensor may come in several pieces. Error if the values overrun it or come for
  // another tensor than `name`.
  void append(const std::string& name, const float* values, std::size_t count);
  // Closes the last shard, writes the index, renames the files into place. Error unless every
  // declared tensor was appended completely.
  void finish();
  std::size_t num_shards() const { return shard_files_.size(); }
  const std::vector<std::string>& files() const { return shard_files_; }

 private:
  void open_shard(std::size_t s);
  std::string dir_;
  std::vector<Tensor> tensors_;
  std::vector<std::size_t> shard_of_;  // per tensor
  std::vector<std::string> shard_files_;
  std::size_t next_ = 0;               // tensor being appended
  std::uint64_t written_ = 0;          // its bytes so far
  std::size_t open_ = SIZE_MAX;        // the shard being written
  struct File;
  std::unique_ptr<File> file_;
  bool finished_ = false;
};

}  // namespace meshtrain::io
