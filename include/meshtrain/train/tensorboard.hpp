#pragma once
// TensorBoard event files (train.tensorboard): world rank 0 writes
// <dir>/events.out.tfevents.<seconds>.<host>, a TFRecord file of Event protocol buffers
// (tensorboard_event.proto, TensorFlow's field numbers, encoded by Debian's libprotobuf): a
// file_version record first, then one Event per logged step whose Summary holds the step's
// scalars as simple_value. TFRecord framing: the length as 8 little-endian bytes, the masked
// CRC32C of those bytes, the record, the masked CRC32C of the record (what TensorFlow's
// record_writer does). A failed write warns once and training goes on, as metrics do.
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::train {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) and TFRecord's mask of it.
std::uint32_t crc32c(const void* data, std::size_t n);
std::uint32_t masked_crc32c(const void* data, std::size_t n);

class EventFileWriter {
 public:
  EventFileWriter() = default;  // writes nothing
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // On the writer rank: creates `dir` where missing and a new event file in it with its
  // file_version record. ConfigError naming train.tensorboard when it cannot.
  void open(const std::string& dir, bool writer);
  bool active() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }

  // One Event at `step` holding every (tag, value); non-finite values are written as they are
  // (TensorBoard plots NaN as a gap).
  void scalars(std::int64_t step, const std::vector<std::pair<std::string, double>>& values);

 private:
  void record(const std::string& bytes);
  std::string path_;
  std::FILE* file_ = nullptr;
  bool failing_ = false;
};

}  // namespace meshtrain::train
