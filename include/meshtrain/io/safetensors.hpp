#pragma once
// safetensors files (HuggingFace): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the raw little-endian data. Used for HuggingFace import/export and the test fixtures.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace meshtrain::io {

struct TensorInfo {
  std::string dtype;  // "F32", "F16", "BF16", "I32", "I64", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets in the data section
  std::int64_t numel() const;
};

class SafetensorsReader {
 public:
  // Throws ConfigError naming the file for a missing file, a bad header or offsets past the end.
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  // File offset of the data section (tensor offsets are relative to it).
  std::uint64_t data_start() const { return data_start_; }
  const TensorInfo& info(const std::string& name) const;  // ConfigError naming the tensor
  // Converted to float (F32, F16, BF16, F64 accepted) / int32 (I32, I64 accepted).
  std::vector<float> read_f32(const std::string& name) const;
  std::vector<std::int32_t> read_i32(const std::string& name) const;

 private:
  std::string path_;
  std::uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  void add_f32(const std::string& name, std::vector<std::int64_t> shape, std::vector<float> data);
  void add_i32(const std::string& name, std::vector<std::int64_t> shape,
               std::vector<std::int32_t> data);
  void set_metadata(const std::string& key, const std::string& value);
  // Writes to path + ".tmp" and renames, so a crash never leaves a half-written file.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::vector<char> bytes;
  };
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace meshtrain::io
