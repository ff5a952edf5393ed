// TensorBoard's TFRecord framing (issue 37): CRC-32C and its mask as TensorFlow's record writer
// computes them, and the layout of the records the writer appends. The records' contents are
// read back by tests/reference/read_tfevents.py (cli_deepspeed_tensorboard), a reader of its own.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "harness.hpp"
#include "meshtrain/train/tensorboard.hpp"

using namespace meshtrain;

TEST_CASE("CRC-32C and TFRecord's masked CRC", "[tensorboard]") {
  const char* check = "123456789";  // the CRC-32C check value (RFC 3720, B.4)
  REQUIRE(train::crc32c(check, 9) == 0xE3069283u);
  const std::vector<unsigned char> zeros(32, 0);
  REQUIRE(train::crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);  // RFC 3720 B.4
  const std::uint32_t c = train::crc32c(check, 9);
  REQUIRE(train::masked_crc32c(check, 9) == ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST_CASE("event file: framed records, the version first", "[tensorboard]") {
  const std::string dir = "test_tensorboard_events";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    train::EventFileWriter w;
    w.open(dir, true);
    REQUIRE(w.active());
    w.scalars(1, {{"train/loss", 2.5}, {"train/lr", 1e-3}});
    w.scalars(2, {{"train/loss", 2.25}});
    path = w.path();
  }
  REQUIRE(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
  std::ifstream in(path, std::ios::binary);
  const std::vector<unsigned char> b((std::istreambuf_iterator<char>(in)), {});
  std::size_t at = 0;
  int n = 0;
  while (at < b.size()) {
    std::uint64_t len = 0;
    for (int i = 0; i < 8; ++i) len |= static_cast<std::uint64_t>(b[at + i]) << (8 * i);
    std::uint32_t hc = 0, dc = 0;
    for (int i = 0; i < 4; ++i) hc |= static_cast<std::uint32_t>(b[at + 8 + i]) << (8 * i);
    REQUIRE(hc == train::masked_crc32c(&b[at], 8));
    for (int i = 0; i < 4; ++i) dc |= static_cast<std::uint32_t>(b[at + 12 + len + i]) << (8 * i);
    REQUIRE(dc == train::masked_crc32c(&b[at + 12], len));
    if (n == 0) {  // file_version "brain.Event:2" is field 3, length-delimited
      const std::string rec(b.begin() + static_cast<long>(at + 12),
                            b.begin() + static_cast<long>(at + 12 + len));
      REQUIRE(rec.find(std::string("\x1a\x0d") + "brain.Event:2") != std::string::npos);
    }
    at += 16 + len;
    ++n;
  }
  REQUIRE(at == b.size());
  REQUIRE(n == 3);
  train::EventFileWriter none;
  none.open(dir, false);  // not the writer rank
  REQUIRE_FALSE(none.active());
  std::filesystem::remove_all(dir);
}
