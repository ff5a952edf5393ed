// safetensors: writer/reader round trip, dtype conversion from hand-written files, and the
// errors for truncated files and inconsistent headers.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "io_test_util.hpp"
#include "meshtrain/io/safetensors.hpp"

using namespace meshtrain::io;
using io_test::config_error;
using io_test::has;

namespace {

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A safetensors file from a header and a data section, exactly as given.
std::string file_of(const std::string& header, const std::string& data) {
  const std::uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("safetensors write/read round trip", "[io][safetensors]") {
  const std::string path = io_test::temp_name("st_rt", ".safetensors");
  SafetensorsWriter w;
  const std::vector<float> b = {1.5f, -2.25f, 3e-8f, 1e30f, 0.0f, -0.0f};
  w.add_f32("b.weight", {2, 3}, b);
  w.add_i32("a.idx", {4}, {7, -1, 0, 2147483647});
  w.add_f32("scalar", {}, {3.5f});
  w.add_f32("empty", {0, 5}, {});
  w.set_metadata("format", "pt");
  w.set_metadata("note", "quote \" backslash \\ caf\xC3\xA9");
  w.write(path);
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));

  const std::string raw = read_all(path);
  std::uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  REQUIRE(n % 8 == 0);  // the data section starts 8-byte aligned
  REQUIRE(raw.substr(8, 15) == "{\"__metadata__\"");

  SafetensorsReader r(path);
  REQUIRE(r.tensors().size() == 4);
  REQUIRE(r.metadata().at("format") == "pt");
  REQUIRE(r.metadata().at("note") == "quote \" backslash \\ caf\xC3\xA9");
  REQUIRE(r.info("b.weight").dtype == "F32");
  REQUIRE(r.info("b.weight").shape == std::vector<std::int64_t>{2, 3});
  REQUIRE(r.info("a.idx").begin == 0);  // data in name order
  REQUIRE(r.info("b.weight").begin == 16);
  REQUIRE(r.read_f32("b.weight") == b);
  REQUIRE(std::signbit(r.read_f32("b.weight")[5]));
  REQUIRE(r.read_i32("a.idx") == std::vector<std::int32_t>{7, -1, 0, 2147483647});
  REQUIRE(r.info("scalar").shape.empty());
  REQUIRE(r.info("scalar").numel() == 1);
  REQUIRE(r.read_f32("scalar") == std::vector<float>{3.5f});
  REQUIRE(r.read_f32("empty").empty());
  REQUIRE(r.has("empty"));
  REQUIRE_FALSE(r.has("nope"));
  REQUIRE(has(config_error([&] { r.info("nope"); }), "has no tensor 'nope'"));
  REQUIRE(has(config_error([&] { r.read_i32("b.weight"); }), "has dtype F32; expected I32 or I64"));
  REQUIRE(has(config_error([&] { r.read_f32("a.idx"); }), "has dtype I32"));
  std::remove(path.c_str());
}

TEST_CASE("F16, BF16, F64 and I64 tensors convert", "[io][safetensors]") {
  const std::string path = io_test::temp_name("st_dtypes", ".safetensors");
  const std::vector<std::uint16_t> f16 = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400, 0x7C00, 0x8000, 0x3555};
  const std::vector<std::uint16_t> bf16 = {0x3F80, 0xC040, 0x4049, 0xFF80};
  const std::vector<double> f64 = {0.1, -1e10};
  const std::vector<std::int64_t> i64 = {5, -7, 2147483647};
  const std::vector<std::int64_t> i64big = {std::int64_t{1} << 40};
  // Offsets in file order: f16 [0,16), bf16 [16,24), f64 [24,40), i64 [40,64), big [64,72).
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[2,4],"data_offsets":[0,16]},)"
      R"("bf":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]},)"
      R"("d":{"dtype":"F64","shape":[2],"data_offsets":[24,40]},)"
      R"("l":{"dtype":"I64","shape":[3],"data_offsets":[40,64]},)"
      R"("big":{"dtype":"I64","shape":[1],"data_offsets":[64,72]}})";
  io_test::write_file(path, file_of(header, bytes_of(f16) + bytes_of(bf16) + bytes_of(f64) +
                                                bytes_of(i64) + bytes_of(i64big)));
  SafetensorsReader r(path);
  REQUIRE(r.metadata().empty());
  const auto h = r.read_f32("h");
  CHECK(h[0] == 1.0f);
  CHECK(h[1] == -2.0f);
  CHECK(h[2] == 65504.0f);
  CHECK(h[3] == std::ldexp(1.0f, -24));  // smallest subnormal half
  CHECK(h[4] == std::ldexp(1.0f, -14));  // smallest normal half
  CHECK(h[5] == std::numeric_limits<float>::infinity());
  CHECK(h[6] == 0.0f);
  CHECK(std::signbit(h[6]));
  CHECK(h[7] == 0.333251953125f);  // 0x3555, the half nearest 1/3
  const auto b = r.read_f32("bf");
  CHECK(b[0] == 1.0f);
  CHECK(b[1] == -3.0f);
  CHECK(b[2] == 3.140625f);
  CHECK(b[3] == -std::numeric_limits<float>::infinity());
  CHECK(r.read_f32("d") == std::vector<float>{0.1f, -1e10f});
  CHECK(r.read_i32("l") == std::vector<std::int32_t>{5, -7, 2147483647});
  CHECK(has(config_error([&] { r.read_i32("big"); }), "element 0 = 1099511627776 does not fit int32"));
  std::remove(path.c_str());
}

TEST_CASE("bad safetensors files name the file and the problem", "[io][safetensors]") {
  const std::string path = io_test::temp_name("st_bad", ".safetensors");
  auto error_for = [&](const std::string& bytes) {
    io_test::write_file(path, bytes);
    return config_error([&] { SafetensorsReader r(path); });
  };
  const std::string data = bytes_of(std::vector<float>{1, 2, 3, 4});
  const std::string ok = R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  {
    io_test::write_file(path, file_of(ok, data));
    SafetensorsReader r(path);  // the baseline is valid
  }
  REQUIRE(has(config_error([&] { SafetensorsReader r("no/such.safetensors"); }),
              "'no/such.safetensors' cannot be opened"));
  std::string w = error_for("abc");
  INFO(w);
  CHECK(has(w, path));
  CHECK(has(w, "shorter than the 8-byte header length"));
  w = error_for(file_of(ok, data).substr(0, 40));  // cut inside the header
  CHECK(has(w, "exceeds the file size 40"));
  w = error_for(file_of(ok, data).substr(0, 8 + ok.size() + 12));  // cut inside the data
  CHECK(has(w, path));
  CHECK(has(w, "tensor 't'"));
  CHECK(has(w, "run past the end of the 12-byte data section"));
  w = error_for(file_of(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})", data));
  CHECK(has(w, "JSON error at byte"));
  CHECK(has(w, path));
  w = error_for(file_of(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data));
  CHECK(has(w, "span 16 bytes but F32 of shape with 3 elements needs 12"));
  w = error_for(file_of(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})", data));
  CHECK(has(w, "starts at data byte 4, expected 0"));
  w = error_for(file_of(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", data));
  CHECK(has(w, "cover 12 bytes of the 16-byte data section"));
  w = error_for(file_of(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", data));
  CHECK(has(w, "not an interval"));
  w = error_for(file_of(R"({"t":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}})", data));
  CHECK(has(w, "unknown dtype 'Q4'"));
  w = error_for(file_of(R"({"t":{"dtype":"F32","shape":[4]}})", data));
  CHECK(has(w, "key 'data_offsets' is missing"));
  w = error_for(file_of(R"({"__metadata__":{"a":1},"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data));
  CHECK(has(w, "__metadata__ 'a': expected a string"));
  std::uint64_t huge = 1ull << 40;
  w = error_for(std::string(reinterpret_cast<const char*>(&huge), 8) + "{}");
  CHECK(has(w, "header length 1099511627776"));

  SafetensorsWriter wr;  // a directory that does not exist: the error names the path
  wr.add_f32("x", {1}, {1.0f});
  CHECK(has(config_error([&] { wr.write("no/such/dir/x.safetensors"); }), "no/such/dir/x.safetensors"));
  std::remove(path.c_str());
}

TEST_CASE("the header is the reference's compact JSON, keys in name order", "[io][safetensors]") {
  // The bytes the hand-built writer produced before the header went through nlohmann-json:
  // __metadata__ first, names in byte order, escapes as JSON requires, spaces to 8 bytes.
  const std::string path = io_test::temp_name("st_header", ".safetensors");
  SafetensorsWriter w;
  w.add_f32("b.weight", {2, 3}, {1, 2, 3, 4, 5, 6});
  w.add_i32("a.idx", {2}, {7, -1});
  w.add_f32("scalar", {}, {3.5f});
  w.add_f32("Z upper", {0, 5}, {});
  w.set_metadata("format", "pt");
  w.set_metadata("note", "q\"b\\c/\n\t\x01 caf\xC3\xA9");
  w.write(path);
  const std::string raw = read_all(path);
  std::uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  const std::string want =
      R"({"__metadata__":{"format":"pt","note":"q\"b\\c/\n\t\u0001 caf)" "\xC3\xA9" R"("},)"
      R"("Z upper":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]},)"
      R"("a.idx":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
      R"("b.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},)"
      R"("scalar":{"dtype":"F32","shape":[],"data_offsets":[32,36]}})";
  REQUIRE(n == 312);
  REQUIRE(raw.substr(8, n) == want + std::string(312 - want.size(), ' '));
  SafetensorsReader r(path);
  REQUIRE(r.metadata().at("note") == "q\"b\\c/\n\t\x01 caf\xC3\xA9");
  REQUIRE(r.read_f32("b.weight") == std::vector<float>{1, 2, 3, 4, 5, 6});
  // A duplicated tensor name would let the second entry silently win: the reader refuses it.
  const std::string dup = R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  io_test::write_file(path, file_of(dup, bytes_of(std::vector<float>{1})));
  const std::string e = config_error([&] { SafetensorsReader bad(path); });
  CHECK(has(e, path));
  CHECK(has(e, "key 't' appears twice"));
  std::remove(path.c_str());
}
