// Sharded HuggingFace safetensors folders: the streaming writer (shard sizes, names, index,
// chunked appends, bf16 rounding), the slice reader (rows, columns, dtype conversions, only the
// slice's bytes read), and one ConfigError naming the file and the tensor for bad folders.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "io_test_util.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/io/safetensors_sharded.hpp"

using namespace meshtrain::io;
using meshtrain::Json;
namespace json = meshtrain::json;
using io_test::config_error;
using io_test::has;
namespace fs = std::filesystem;

namespace {

std::vector<float> iota(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + 0.25f * float(i);
  return v;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// A folder written by the writer: a [7, 9] F32, a [5] F32, a [4, 6] BF16 and a [3, 3] F32
// tensor with 100-byte shards -> shards {w (252 B, alone)}, {b (20) + e (48)}, {last (36)}.
struct Folder {
  std::string dir = io_test::temp_name("sharded", "");
  std::vector<float> w = iota(63, -3.0f), b = iota(5, 1.0f), e = iota(24, -1.5f),
                     last = iota(9, 7.0f);
  Folder() {
    fs::remove_all(dir);
    ShardedSafetensorsWriter out(dir,
                                 {{"model.w", "F32", {7, 9}},
                                  {"model.b", "F32", {5}},
                                  {"model.e", "BF16", {4, 6}},
                                  {"lm_head.weight", "F32", {3, 3}}},
                                 100);
    REQUIRE(out.num_shards() == 3);
    out.append("model.w", w.data(), 40);  // a tensor may come in pieces
    out.append("model.w", w.data() + 40, 23);
    out.append("model.b", b.data(), b.size());
    out.append("model.e", e.data(), e.size());
    out.append("lm_head.weight", last.data(), last.size());
    out.finish();
  }
  ~Folder() { fs::remove_all(dir); }
};

}  // namespace

TEST_CASE("sharded writer: save_pretrained's shards and index", "[io][safetensors][sharded]") {
  Folder f;
  for (int k = 1; k <= 3; ++k)
    REQUIRE(fs::exists(f.dir + "/model-0000" + std::to_string(k) + "-of-00003.safetensors"));
  REQUIRE_FALSE(fs::exists(f.dir + "/model.safetensors"));
  for (const auto& p : fs::directory_iterator(f.dir)) REQUIRE(p.path().extension() != ".tmp");
  const Json index = json::parse(read_all(f.dir + "/model.safetensors.index.json"), "index");
  REQUIRE(json::as_int(json::at(json::at(index, "metadata", ""), "total_size", ""), "") ==
          252 + 20 + 48 + 36);
  const Json& map = json::at(index, "weight_map", "");
  REQUIRE(json::as_string(json::at(map, "model.w", ""), "") == "model-00001-of-00003.safetensors");
  REQUIRE(json::as_string(json::at(map, "model.b", ""), "") == "model-00002-of-00003.safetensors");
  REQUIRE(json::as_string(json::at(map, "model.e", ""), "") == "model-00002-of-00003.safetensors");
  REQUIRE(json::as_string(json::at(map, "lm_head.weight", ""), "") == "model-00003-of-00003.safetensors");
  // Each shard is a valid safetensors file on its own, with HF's "format": "pt".
  SafetensorsReader s2(f.dir + "/model-00002-of-00003.safetensors");
  REQUIRE(s2.tensors().size() == 2);
  REQUIRE(s2.metadata().at("format") == "pt");
  REQUIRE(s2.info("model.e").dtype == "BF16");

  // One shard: model.safetensors and no index, as save_pretrained.
  const std::string one = io_test::temp_name("sharded_one", "");
  {
    ShardedSafetensorsWriter out(one, {{"a", "F32", {2}}, {"z", "F32", {0, 4}}}, 1 << 20);
    const float a[] = {1.0f, 2.0f};
    out.append("a", a, 2);
    out.finish();  // the empty tensor completes without an append
  }
  REQUIRE(fs::exists(one + "/model.safetensors"));
  REQUIRE_FALSE(fs::exists(one + "/model.safetensors.index.json"));
  ShardedSafetensorsReader r(one);
  REQUIRE(r.read_rows_f32("a", 0, 2) == std::vector<float>{1.0f, 2.0f});
  REQUIRE(r.info("z").shape == std::vector<std::int64_t>{0, 4});
  fs::remove_all(one);

  // Misuse is an error, and an abandoned writer leaves no files.
  const std::string bad = io_test::temp_name("sharded_bad", "");
  {
    ShardedSafetensorsWriter out(bad, {{"a", "F32", {2}}, {"b", "F32", {2}}}, 1 << 20);
    const float v[] = {1.0f, 2.0f, 3.0f};
    REQUIRE_THROWS(out.append("b", v, 2));  // out of order
    REQUIRE_THROWS(out.append("a", v, 3));  // overrun
    out.append("a", v, 2);
    REQUIRE_THROWS(out.finish());  // b missing
  }
  REQUIRE(fs::is_empty(bad));
  fs::remove_all(bad);
}

TEST_CASE("sharded reader: row and column slices read only their bytes",
          "[io][safetensors][sharded]") {
  Folder f;
  ShardedSafetensorsReader r(f.dir);
  REQUIRE(r.names() == std::vector<std::string>{"lm_head.weight", "model.b", "model.e", "model.w"});
  REQUIRE(r.file_of("model.e") == f.dir + "/model-00002-of-00003.safetensors");
  r.expect("model.w", {7, 9});

  // Rows [2, 5) of [7, 9]: one contiguous run.
  auto before = r.bytes_read();
  auto reads = r.reads();
  const auto rows = r.read_rows_f32("model.w", 2, 5);
  REQUIRE(rows == std::vector<float>(f.w.begin() + 18, f.w.begin() + 45));
  REQUIRE(r.bytes_read() - before == 3 * 9 * 4);
  REQUIRE(r.reads() - reads == 1);

  // Columns [3, 6): one run per row, 3 values each.
  before = r.bytes_read();
  reads = r.reads();
  const auto cols = r.read_cols_f32("model.w", 3, 6);
  std::vector<float> want;
  for (int row = 0; row < 7; ++row)
    for (int c = 3; c < 6; ++c) want.push_back(f.w[row * 9 + c]);
  REQUIRE(cols == want);
  REQUIRE(r.bytes_read() - before == 7 * 3 * 4);
  REQUIRE(r.reads() - reads == 7);
  // All columns are whole rows: one run.
  reads = r.reads();
  REQUIRE(r.read_cols_f32("model.w", 0, 9) == f.w);
  REQUIRE(r.reads() - reads == 1);
  REQUIRE(r.read_rows_f32("model.b", 1, 4) == std::vector<float>{1.25f, 1.5f, 1.75f});
  REQUIRE(r.read_rows_f32("model.w", 3, 3).empty());

  // BF16 storage: the quarter steps of iota are exact in bf16, so they come back unchanged, in
  // fp32 and as bf16 bits.
  REQUIRE(r.read_cols_f32("model.e", 2, 4) ==
          std::vector<float>{-1.0f, -0.75f, 0.5f, 0.75f, 2.0f, 2.25f, 3.5f, 3.75f});
  std::vector<std::uint16_t> eb(24);
  r.read_rows("model.e", 0, 4, SliceType::bf16, eb.data());
  for (std::size_t i = 0; i < 24; ++i) REQUIRE(std::uint32_t(eb[i]) << 16 == bits(f.e[i]));

  REQUIRE(has(config_error([&] { r.read_rows_f32("model.w", 5, 8); }), "rows [5, 8)"));
  REQUIRE(has(config_error([&] { r.read_cols_f32("model.w", 8, 10); }), "columns [8, 10)"));
  REQUIRE(
      has(config_error([&] { r.read_cols_f32("model.b", 0, 1); }), "cannot be read by columns"));
  REQUIRE(has(config_error([&] { r.info("nope"); }), "has no tensor 'nope'"));
}

TEST_CASE("sharded reader: F32 to bf16 rounds to nearest even; F16 sources",
          "[io][safetensors][sharded]") {
  const std::string dir = io_test::temp_name("sharded_round", "");
  fs::remove_all(dir);
  // 1 + 2^-8 is halfway between two bf16 values and rounds to the even one (1); 1 + 3 * 2^-8
  // rounds up to 1 + 2^-6; 1 + 2^-8 + 2^-20 is above halfway and rounds up to 1 + 2^-7.
  const std::vector<float> v = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256,
                                1.0f + 1.0f / 256 + 1.0f / (1 << 20), -2.0f};
  {
    ShardedSafetensorsWriter out(dir, {{"v", "F32", {4}}}, 1 << 20);
    out.append("v", v.data(), v.size());
    out.finish();
  }
  ShardedSafetensorsReader r(dir);
  std::vector<std::uint16_t> b(4);
  r.read_rows("v", 0, 4, SliceType::bf16, b.data());
  REQUIRE(b == std::vector<std::uint16_t>{0x3F80, 0x3F82, 0x3F81, 0xC000});
  fs::remove_all(dir);

  // An F16 tensor written by hand: 1.0 (0x3C00), -2.5 (0xC100), 2^-24 (0x0001, subnormal).
  fs::create_directories(dir);
  const std::string header = R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}})";
  const std::uint64_t n = header.size();
  const std::uint16_t data[] = {0x3C00, 0xC100, 0x0001};
  io_test::write_file(dir + "/model.safetensors",
                      std::string(reinterpret_cast<const char*>(&n), 8) + header +
                          std::string(reinterpret_cast<const char*>(data), 6));
  ShardedSafetensorsReader h(dir);
  REQUIRE(h.read_rows_f32("h", 0, 3) == std::vector<float>{1.0f, -2.5f, 1.0f / (1 << 24)});
  fs::remove_all(dir);
}

TEST_CASE("sharded reader: bad folders name the file and the tensor",
          "[io][safetensors][sharded]") {
  Folder f;
  const std::string index = f.dir + "/model.safetensors.index.json";
  const std::string good_index = read_all(index);
  // The weight map as given, everything else of the folder unchanged.
  auto with_index = [&](const std::string& map) {
    io_test::write_file(index, R"({"metadata": {"total_size": 356}, "weight_map": {)" + map + "}}");
    return config_error([&] { ShardedSafetensorsReader r(f.dir); });
  };
  const std::string s1 = "\"model.w\": \"model-00001-of-00003.safetensors\"",
                    s2 = "\"model.b\": \"model-00002-of-00003.safetensors\", "
                         "\"model.e\": \"model-00002-of-00003.safetensors\"",
                    s3 = "\"lm_head.weight\": \"model-00003-of-00003.safetensors\"";

  // A shard named in the index that is missing.
  std::string w =
      with_index(s1 + ", " + s2 + ", \"lm_head.weight\": \"model-00004-of-00004.safetensors\"");
  INFO(w);
  CHECK(has(w, index));
  CHECK(has(w, "'lm_head.weight'"));
  CHECK(has(w, "model-00004-of-00004.safetensors"));
  CHECK(has(w, "does not exist"));
  // The index puts a tensor in a shard that does not hold it.
  w = with_index(s1 + ", " + s2 + ", " + s3 +
                 ", \"model.extra\": \"model-00003-of-00003.safetensors\"");
  CHECK(has(w, "model-00003-of-00003.safetensors has no tensor 'model.extra'"));
  w = with_index(s1 + ", \"model.b\": \"model-00003-of-00003.safetensors\", " + s3);
  CHECK(has(w, "has no tensor 'model.b'"));
  // A shard holds a tensor the index does not name.
  w = with_index(s1 + ", \"model.b\": \"model-00002-of-00003.safetensors\", " + s3);
  CHECK(has(w, "model-00002-of-00003.safetensors: tensor 'model.e' is not in"));
  CHECK(has(with_index(s1 + ", \"model.b\": \"../x.safetensors\""), "not a file name"));
  io_test::write_file(index, good_index);

  // Shape and dtype against the model's expectation.
  ShardedSafetensorsReader r(f.dir);
  w = config_error([&] { r.expect("model.w", {9, 7}); });
  CHECK(has(w, f.dir + "/model-00001-of-00003.safetensors: tensor 'model.w' has shape [7, 9]"));
  CHECK(has(w, "needs [9, 7]"));
  CHECK(
      has(config_error([&] { r.expect("model.missing", {1}); }), "has no tensor 'model.missing'"));

  // A truncated shard is caught by its header check.
  const std::string last = f.dir + "/model-00003-of-00003.safetensors";
  const std::string bytes = read_all(last);
  io_test::write_file(last, bytes.substr(0, bytes.size() - 4));
  w = config_error([&] { ShardedSafetensorsReader t(f.dir); });
  CHECK(has(w, last));
  CHECK(has(w, "lm_head.weight"));
  CHECK(has(config_error([&] { ShardedSafetensorsReader t(f.dir + "/none"); }),
            "neither model.safetensors.index.json nor model.safetensors"));
}

TEST_CASE("sharded reader: long row ranges are read in 16 MiB runs", "[io][safetensors][sharded]") {
  const std::string dir = io_test::temp_name("sharded_big", "");
  fs::remove_all(dir);
  const std::size_t rows = 4608, cols = 1024;  // 18 MiB of F32
  {
    ShardedSafetensorsWriter out(dir, {{"big", "F32", {std::int64_t(rows), std::int64_t(cols)}}},
                                 1 << 30);
    std::vector<float> row(cols);
    for (std::size_t r = 0; r < rows; ++r) {  // streamed a row at a time
      for (std::size_t c = 0; c < cols; ++c) row[c] = float(r) + float(c) / 1024.0f;
      out.append("big", row.data(), cols);
    }
    out.finish();
  }
  ShardedSafetensorsReader r(dir);
  const auto all = r.read_rows_f32("big", 0, rows);
  REQUIRE(r.reads() == 2);
  REQUIRE(r.bytes_read() == rows * cols * 4);
  REQUIRE(all[1234 * cols + 77] == 1234.0f + 77.0f / 1024.0f);
  REQUIRE(all.back() == float(rows - 1) + float(cols - 1) / 1024.0f);
  fs::remove_all(dir);
}
